"""SlurmCLI's reading of the tools' output, as Slurm 26.05 prints it: no Slurm needed."""
from gpufleet.reconciler.adapters.slurm.cli import expand_hostlist


def test_expand_hostlist() -> None:
    assert expand_hostlist("gpu-a-[0-2,5],cpu-1") == ["gpu-a-0", "gpu-a-1", "gpu-a-2", "gpu-a-5", "cpu-1"]
    assert expand_hostlist("n[08-10]") == ["n08", "n09", "n10"]
    assert expand_hostlist("") == [] and expand_hostlist("(null)") == []


def test_the_jobs_slurm_failed_off_a_node_are_read_with_sacct_each_run_its_own_record() -> None:
    from gpufleet.reconciler.adapters.slurm.cli import SlurmCLI

    ran: list[list[str]] = []

    class Sacct(SlurmCLI):
        def _exec(self, argv):
            ran.append(argv)
            return 0, "7|train|NODE_FAIL|gpu-a-[0-1]\n7|train|PENDING|None assigned\n8|x|NODE_FAIL|gpu-b-0\n", ""

    [j] = Sacct().jobs_failed_on(["gpu-a-1"], 1796126400)
    assert (j.job_id, j.state, j.nodes) == (7, "NODE_FAIL", ("gpu-a-0", "gpu-a-1"))
    assert ran == [["sacct", "-X", "-D", "-n", "-P", "-N", "gpu-a-1", "-s", "NODE_FAIL", "-S", "2026-12-01T12:00:00",
                    "-o", "JobID,JobName,State,NodeList"]]
