"""Training: the per-worker loop, the driver-side trainer, metrics."""
