"""What loadgen asks the target besides the run: its kind, model, tokenizer, /metrics, an idle calibration."""
