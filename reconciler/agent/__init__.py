"""The node agent: follow the kernel log, set the GPU condition on a critical XID."""
