"""Plan time: arrivals, lengths, traces, datasets, prompts and bodies; pure functions of the config and its seed."""
