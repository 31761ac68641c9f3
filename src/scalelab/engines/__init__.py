"""Training engines: what starts a run's ranks, connects them and averages their gradients (engines.registry)."""
