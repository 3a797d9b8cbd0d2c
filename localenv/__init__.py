"""The local development environment: a real control plane, kwok GPU nodes, kubelet system nodes, real
Slurm and a Slinky stand-in on this machine. Development only: neither the wheel nor the images ship it."""
