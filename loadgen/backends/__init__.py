"""API backends: each turns a planned request into an HTTP body and interprets the stamped stream.

The runner owns the socket and stamps every read; backends never see the clock. After the stream ends,
`interpret(row, read_t_ns, reads)` fills the row's token fields from the raw reads and their stamps.
"""
