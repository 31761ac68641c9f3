"""Optional third-party parts scalelab builds for this machine (Horovod)."""
