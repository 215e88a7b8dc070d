"""Post-processing with Polars: everything here reads a results folder and computes, never prints."""
