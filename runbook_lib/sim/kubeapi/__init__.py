"""The simulated Kubernetes API server (see ``server``), its store, admission and resource table."""
