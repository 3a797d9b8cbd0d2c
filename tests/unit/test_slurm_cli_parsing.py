"""SlurmCLI's reading of the tools' output, as Slurm 26.05 prints it: no Slurm needed."""
from gpufleet.reconciler.adapters.slurm.cli import expand_hostlist


def test_expand_hostlist() -> None:
    assert expand_hostlist("gpu-a-[0-2,5],cpu-1") == ["gpu-a-0", "gpu-a-1", "gpu-a-2", "gpu-a-5", "cpu-1"]
    assert expand_hostlist("n[08-10]") == ["n08", "n09", "n10"]
    assert expand_hostlist("") == [] and expand_hostlist("(null)") == []
