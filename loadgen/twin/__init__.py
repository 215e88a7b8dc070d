"""The fitted twin: probe a server, fit a simulator profile, predict its latency and knee."""
