"""The job owner knows why, on a real Slurm 26.05 (slurmrestd, JWT) and a real API server: a job a heal
requeued carries gpufleet's dated lines in its admin comment after the one it had, and the line of its
run on the replacement; `gpufleet why` tells its fault, remediation and resume; a job that only saw an
application XID is told it was its own error."""
from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from typer.testing import CliRunner

from gpufleet.fleetspec import parse_fleet
from gpufleet.cli import app
from gpufleet.reconciler.adapters.kube import Kube
from gpufleet.reconciler.core import job_record
from gpufleet.reconciler.core.phases import Phase
from tests.fixtures.reconciler_kube import reconciler, records_for, run_until

from .test_reconciler_slurm import POOL, SLURM_NS, fleet_with_slurm, moved_by_the_operator  # noqa: F401

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


def submit(slurm, tmp_path, *args: str) -> int:
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/bash\ntrap 'echo saved; exit 0' TERM\nwhile true; do sleep 0.2; done\n")
    script.chmod(0o755)
    return slurm.sbatch("--requeue", "-p", "gpu", "-o", str(tmp_path / "out-%j"), *args, str(script))


@pytest.fixture
def owners_webhook():
    """A webhook receiver on this machine: the JSON bodies it was sent."""
    got: list[dict] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            got.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}/hook", got
    server.shutdown()


def why(kube_cluster, slurm, job_id: int, *extra: str):
    return CliRunner().invoke(app, ["why", str(job_id), "--kubeconfig", str(kube_cluster.kubeconfig_path),
                                    "--slurm-url", slurm.rest_url, "--slurm-jwt-key-file", str(slurm.jwt_key_path),
                                    "--slurm-namespace", SLURM_NS, *extra])  # the test spec's Slinky namespace


def test_a_requeued_job_carries_the_reason_keeps_its_comment_its_owner_is_told_and_why_tells_its_story(
        fleet_with_slurm, api, kube_cluster, tmp_path, owners_webhook, monkeypatch):  # noqa: F811
    spec, _, channel, slurm, rest = fleet_with_slurm
    url, received = owners_webhook
    monkeypatch.setenv("GPUFLEET_WEBHOOK_ROOTS_JOBS", url)  # the route's URL, as the notifications Secret gives it
    doc = spec.model_dump(mode="json")
    doc["healing"]["notifications"] = [{"type": "webhook", "name": "roots-jobs", "url_secret": "roots-jobs",
                                        "job_owners": {"users": ["root"]}}]
    rec = reconciler(api, parse_fleet(doc), channel, rest)
    slurm.set_node_state("gpu-a-1", "DRAIN", "ops: reserved")  # the job lands on gpu-a-0, then on the spare
    jid = submit(slurm, tmp_path, "--comment=lr sweep 3")
    run_until(rec, lambda: (j := rest.job(jid)) and j.state == "RUNNING" and j.nodes == ("gpu-a-0",), timeout=30)
    slurm.scontrol("update", f"JobId={jid}", "AdminComment=priority raised by ops")  # an earlier admin comment
    Kube(api).set_condition(f"{POOL}-0", "GpuHealthy", "False", "Xid79", "GPU has fallen off the bus")
    moved_by_the_operator(api, rec, f"{POOL}-0", "gpu-a-0")  # the heal succeeds once its Slurm node is back

    def resumed():
        j = rest.job(jid)
        text = (j.admin_comment or "") if j else ""
        return j if j and j.state == "RUNNING" and "running again" in text and " w=replaced " in text else None

    job = run_until(rec, resumed, timeout=150)
    (r,) = records_for(rec, f"{POOL}-0")
    assert r.phase is Phase.SUCCEEDED and r.jobs == (jid,)
    # on the replacement: its own Slurm node, or the moved one (the NodeSet pod of gpu-a-0 landed there too)
    (where,) = job.nodes
    assert where in ("gpu-a-0", "gpu-a-2") and job.comment == "lr sweep 3"  # the user's comment untouched
    parts = job.admin_comment.split(" | ")
    assert parts[0] == "priority raised by ops"  # what was there survives, first
    assert [p.split(": ")[1] for p in parts[1:4]] == ["SIGTERM to checkpoint", "requeued", "running again"]
    assert all(p.startswith("gpufleet 20") and len(p) < 200 for p in parts[1:4])
    assert parts[1].endswith(": a GPU on gpu-a-0: GPU has fallen off the bus (Xid 79); 5 s grace")  # told once
    assert parts[2].endswith(": requeued: the machine behind gpu-a-0 is replaced")
    assert f": running again: on {where}; gpu-a-0 runs on a healthy machine; " in parts[3]
    (record,) = job_record.records_in(job.admin_comment, " | ")  # what `gpufleet why` reads on the login node
    assert (record.slurm_node, record.code, record.state, record.grace_s) == ("gpu-a-0", 79, job_record.DONE, 5)
    assert parts[5:] == [f"whole story: gpufleet why {jid}"]
    assert f"AdminComment={job.admin_comment}" in slurm.scontrol("show", "job", str(jid))
    run_until(rec, lambda: True)  # another pass: nothing is added twice
    assert rest.job(jid).admin_comment == job.admin_comment

    # the owner's route: exactly one message per transition, with the user and the job
    assert [(m["gpufleet"]["event"], m["gpufleet"]["job_id"], m["gpufleet"]["user"]) for m in received] == [
        ("signalled", jid, "root"), ("requeued", jid, "root"), ("running-again", jid, "root")]
    assert all(m["gpufleet"]["remediation"] == r.name for m in received)
    assert all(f"gpufleet: your job {jid}: Job {jid} (" in m["text"] for m in received)  # the engineer's paragraph
    assert not [m for m in channel.messages if m.job]  # on-call got the pages, not the owner's messages

    out = why(kube_cluster, slurm, jid)
    assert out.exit_code == 0, out.output
    for said in ("fault: XID 79 (GPU has fallen off the bus) on kgpu-0 (Slurm gpu-a-0)", f"remediation {r.name}: Requeued",
                 f"remediation {r.name}: Resuming (replacement {POOL}-spare-0)", f"running again on {where} (1 requeue(s))",
                 "verdict: hardware fault healed (XID 79 (GPU has fallen off the bus) on kgpu-0)"):
        assert said in out.output, out.output
    story = json.loads(why(kube_cluster, slurm, jid, "--json").output)
    assert story["verdict"] == "healed" and story["remediations"] == [r.name] and story["job"]["restarts"] == 1
    print(out.output)


def test_why_of_a_job_that_saw_only_an_application_xid_is_its_own_error_and_an_unknown_job_exits_1(
        fleet_with_slurm, api, kube_cluster, tmp_path):  # noqa: F811
    spec, rec, channel, slurm, rest = fleet_with_slurm
    jid = submit(slurm, tmp_path, "-w", "gpu-a-1")
    run_until(rec, lambda: (j := rest.job(jid)) and j.state == "RUNNING", timeout=30)
    # An application XID leaves the node in service: the node agent posts it as a Warning Event on the node
    # (reconciler/agent/daemon.py, through the same adapter call, with its reason and condition-format message).
    Kube(api).node_event(f"{POOL}-1", "Xid13", "[action=restart-app pci=0000:3b:00] NVRM: Xid (PCI:0000:3b:00): 13, "
                                               "Graphics Engine Exception")
    slurm.run(["scancel", str(jid)], check=True)
    run_until(rec, lambda: rest.job(jid).state == "CANCELLED", timeout=30)
    out = why(kube_cluster, slurm, jid)
    assert out.exit_code == 0, out.output
    assert (f"XID 13 (Graphics Engine Exception) on its node {POOL}-1: the application on that GPU had to restart"
            in out.output)
    assert "verdict: most likely the job's own error" in out.output and "look at the job's stderr" in out.output
    assert not records_for(rec, f"{POOL}-1")  # and gpufleet healed nothing

    unknown = why(kube_cluster, slurm, 999999)
    assert unknown.exit_code == 1 and "unknown" in unknown.output


def test_a_pod_outside_slinkys_namespace_that_claims_a_nodeset_maps_no_slurm_node(api) -> None:
    """A pod in a tenant's namespace with the pod-hostname label of a Slurm node and a controller reference to a
    NodeSet (anyone who may create pods there can write both) points the story at no machine: only the NodeSet
    pods of Slinky's namespace map Slurm nodes to machines, as the reconciler reads them (observe.pod_view)."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    from gpufleet.fleetspec import labels
    from gpufleet.why_command import slurm_hosts

    from .test_reconciler_slurm import SLURM_NS, nodeset_pod

    core = client.CoreV1Api(api)
    real, forged = nodeset_pod(api, "story-a-0", f"{POOL}-1"), nodeset_pod(api, "story-a-0", f"{POOL}-spare-0")
    forged["metadata"].update(name="claims-story-a-1", namespace="tenant-ns")
    forged["metadata"]["labels"][labels.SLINKY_POD_HOSTNAME] = "story-a-1"
    try:
        core.create_namespace({"metadata": {"name": "tenant-ns"}})
    except ApiException as e:
        assert e.status == 409
    core.create_namespaced_pod("tenant-ns", forged)
    core.create_namespaced_pod(SLURM_NS, real)
    try:
        mapped = {k: v for k, v in slurm_hosts(api, SLURM_NS).items() if k.startswith("story-")}
        assert mapped == {"story-a-0": f"{POOL}-1"}
    finally:
        for name, ns in (("claims-story-a-1", "tenant-ns"), ("story-a-0", SLURM_NS)):
            try:
                core.delete_namespaced_pod(name, ns, grace_period_seconds=0)
            except ApiException as e:  # the garbage collector may have taken the one whose owner is elsewhere
                assert e.status == 404
