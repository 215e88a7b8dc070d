"""The built-in simulated inference server (`loadgen sim`)."""
