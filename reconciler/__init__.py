"""gpufleet's self-healing controller. Plain Python: it never imports pulumi."""
