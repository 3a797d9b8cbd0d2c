"""Adapters: the reconciler's I/O (Kubernetes, Slurm, node providers, notifications, records)."""
