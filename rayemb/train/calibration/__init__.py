"""Measuring the cluster for the planner: collectives, kernels, the dense step, plan probes, and keeping them."""
