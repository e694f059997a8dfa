"""Serving: the inference step (prefill, decode, KV cache), an engine's steady state under a
closed or open loop, the deployment search, and the measured-run predictor validate reads."""
