"""One run from start to end: the launcher (one process, worker processes or Ray), self-check, intervals, sweeps."""
