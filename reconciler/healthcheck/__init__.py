"""The node health check (issue 25): what the health-check Job runs on a node before it serves.
`nvidia_smi` (ECC and row-remap state), `dcgm` (DCGM's diagnostic, when DCGM is on the node), `nccl`
(a short all-reduce across the node's GPUs, when nccl-tests is on the node) read each tool's output;
`run` runs what the node has and writes the verdict (fleetspec/health_report.py) to the termination log.
"""
