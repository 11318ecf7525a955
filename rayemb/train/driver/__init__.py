"""The driver's side of a job: its stages, its plan per world, its outputs and records."""
