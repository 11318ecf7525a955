"""What runs in every Ray Train worker: the loop, the step, its data, validation, checkpoints."""
