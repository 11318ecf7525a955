"""What users deploy (launcher YAMLs, KubeRay) and what tests use (local head, emulated cluster)."""
