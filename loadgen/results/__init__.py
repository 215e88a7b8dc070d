"""The results folder contract: Parquet files, manifest, HDR interval logs, export."""
