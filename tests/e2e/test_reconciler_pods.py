"""The local stack's reconciler Deployment as real pods on real kubelet nodes: the image built here, by
its digest; the pods' own ServiceAccount token against RBAC the real API server enforces; the policy
ConfigMap mounted; leader election through the Lease, handed over when the leader's pod goes; and what
on-call does with a controller's pods (kubectl logs, exec, port-forward: the API server reaching each
node's kubelet), and a deleted leader's last lines kept by the log shipper's stand-in."""
from __future__ import annotations

import ipaddress
import json
import subprocess

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from gpufleet.fleetspec import labels
from gpufleet.components.reconciler import METRICS_PORT
from localenv import netns
from localenv.control_plane import KWOK_ANNOTATION, _http_get
from localenv.ports import free_port
from gpufleet.waiting import wait_for
from gpufleet.reconciler.adapters.kube import Kube

pytestmark = pytest.mark.e2e


def test_kubelet_nodes_are_the_system_pool_and_kwok_leaves_them_alone(local_pods):
    core = local_pods.env.kube.core_v1()
    coord = client.CoordinationV1Api(local_pods.env.kube.api_client())
    names = local_pods.env.nodes.names
    assert len(names) == local_pods.spec.healing.reconciler.replicas
    for name in names:
        node = core.read_node(name)
        assert node.metadata.labels[labels.ROLE] == labels.ROLE_SYSTEM
        assert node.metadata.labels[labels.SYSTEM_NODE] == "true"  # set by the environment, as a platform would
        assert KWOK_ANNOTATION not in (node.metadata.annotations or {})
        assert node.status.node_info.kubelet_version == "v1.34.4"
        assert node.status.node_info.container_runtime_version.startswith("containerd://1.6")
        assert {c.type: c.status for c in node.status.conditions}["Ready"] == "True"
        # the kubelet, not kwok, holds the node's Lease
        assert coord.read_namespaced_lease(name, "kube-node-lease").spec.holder_identity == name
    fake_system = [n.metadata.name for n in core.list_node(label_selector=f"{labels.SYSTEM_NODE}=true").items
                   if KWOK_ANNOTATION in (n.metadata.annotations or {})]
    assert fake_system == []


def test_pods_run_the_built_image_by_digest_one_per_node(local_pods, built_images):
    pods = local_pods.wait_ready()
    assert sorted(p["node"] for p in pods) == sorted(local_pods.env.nodes.names)
    assert all(p["image"].endswith(built_images.reconciler.digest) for p in pods), pods
    assert sum(p["leader"] for p in pods) == 1
    core = local_pods.env.kube.core_v1()
    pod = core.read_namespaced_pod(pods[0]["name"], local_pods.namespace)
    assert pod.spec.containers[0].image == built_images.reconciler.reference
    assert pod.spec.service_account_name == "gpufleet-reconciler"
    assert pod.spec.host_network is True
    mounts = {m.mount_path for m in pod.spec.containers[0].volume_mounts}
    assert {"/etc/gpufleet", "/var/run/secrets/kubernetes.io/serviceaccount"} <= mounts


def test_the_leader_is_a_pod_and_its_deletion_hands_the_lease_over(local_pods):
    leader = wait_for("a Lease holder", local_pods.leader, timeout=60)
    core = local_pods.env.kube.core_v1()
    core.delete_namespaced_pod(leader["name"], local_pods.namespace)
    new = wait_for("another pod to take the Lease",
                   lambda: (lp := local_pods.leader()) and lp["name"] != leader["name"] and lp, timeout=60)
    assert new["name"] in {p["name"] for p in local_pods.pods()}
    local_pods.wait_ready()  # the Deployment replaced the deleted pod, and it is Ready too


def test_local_status_shows_the_pods_and_the_lease_holder(local_pods, monkeypatch):
    import json

    from typer.testing import CliRunner

    from localenv import commands as local_commands
    from gpufleet.cli import app

    local_pods.wait_ready()
    monkeypatch.setattr(local_commands, "make_env", lambda *a, **k: local_pods.env)
    st = json.loads(CliRunner().invoke(app, ["local", "status", "--json"]).output)
    assert [p["ready"] for p in st["pods"]] == [True, True] and sum(p["leader"] for p in st["pods"]) == 1
    assert all(proc["pid"] for node in st["nodes"].values() for proc in node.values())
    r = CliRunner().invoke(app, ["local", "status"], env={"COLUMNS": "200"})
    assert "(Lease holder)" in r.output and "kubelet system-0" in r.output


def _messages(text: str) -> list[str]:
    """The messages of the reconciler's log lines (JSON, one a line)."""
    out = []
    for line in text.splitlines():
        try:
            out.append(json.loads(line)["message"])
        except (ValueError, KeyError, TypeError):
            pass
    return out


def _cri_text(path) -> str:
    """A container log file as the runtime writes it (CRI: `<time> <stream> <P|F> <text>`), as text."""
    out, partial = [], ""
    for line in path.read_text().splitlines():
        _, _, tag, text = line.split(" ", 3)
        partial += text
        if tag == "F":
            out.append(partial)
            partial = ""
    return "\n".join(out)


def test_kubectl_logs_exec_and_port_forward_reach_the_pods(local_pods, kubectl):
    """The API server dials each node's kubelet at the node's InternalIP (its own link to the host), verifies
    its serving certificate, and is authorized by the kubelet (SubjectAccessReview)."""
    pods = local_pods.wait_ready()
    core = local_pods.env.kube.core_v1()
    for node in local_pods.env.nodes.nodes():
        addresses = {a.type: a.address for a in core.read_node(node.name).status.addresses}
        assert addresses["InternalIP"] == node.address == node.link.node_address
        assert ipaddress.ip_network(node.link.block).subnet_of(netns.RANGE)
    leader = next(p for p in pods if p["leader"])
    r = local_pods.kubectl(kubectl, "logs", leader["name"])
    assert r.returncode == 0, r.stderr
    assert any(m.startswith("leading (lease") for m in _messages(r.stdout)), r.stdout[-2000:]
    policy = core.read_namespaced_config_map("gpufleet-policy", local_pods.namespace).data["fleet.json"]
    for pod in pods:  # one on each node, so each kubelet is reached
        r = local_pods.kubectl(kubectl, "exec", pod["name"], "--", "cat", "/etc/gpufleet/fleet.json")
        assert r.returncode == 0, r.stderr
        assert r.stdout == policy
    port = free_port()
    fwd = subprocess.Popen([str(kubectl), "--kubeconfig", str(local_pods.env.kube.kubeconfig_path), "-n",
                            local_pods.namespace, "port-forward", f"pod/{leader['name']}", f"{port}:{METRICS_PORT}"],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        body = wait_for("the metrics through kubectl port-forward",
                        lambda: _http_get(f"http://127.0.0.1:{port}/metrics"), timeout=30, interval=0.5)
        assert "gpufleet_remediations_in_progress" in body
    finally:
        fwd.terminate()
        fwd.wait(10)


def test_kubectl_logs_previous_has_a_restarted_containers_last_lines(local_pods, kubectl):
    """The leader's process ends (SIGTERM from inside its container) and the kubelet restarts it: its
    last lines, the Lease let go, are what `kubectl logs --previous` returns."""
    leader = wait_for("a Lease holder", local_pods.leader, timeout=60)
    exec_ = local_pods.kubectl(kubectl, "exec", leader["name"], "--", "sh", "-c", "kill -TERM 1")

    def restarted() -> bool:
        return any(p["name"] == leader["name"] and p["restarts"] > leader["restarts"] for p in local_pods.pods())

    wait_for("the container to be restarted", restarted, timeout=120,
             explain=lambda: f"kubectl exec: exit {exec_.returncode} {exec_.stderr}; pods {local_pods.pods()}")
    r = local_pods.kubectl(kubectl, "logs", "--previous", leader["name"])
    assert r.returncode == 0, r.stderr
    messages = _messages(r.stdout)
    assert any(m.startswith("leading (lease") for m in messages), messages
    assert any(m.startswith("released lease") for m in messages), messages
    local_pods.wait_ready()


def test_a_deleted_leaders_last_lines_outlive_its_pod(local_pods, kubectl):
    """`kubectl logs` has nothing once the pod is deleted and the kubelet removed its log folder; the log
    shipper's copy in the environment's logs/pods/ still has the leader's lines to its last."""
    leader = wait_for("a Lease holder", local_pods.leader, timeout=60)
    core = local_pods.env.kube.core_v1()
    pod = core.read_namespaced_pod(leader["name"], local_pods.namespace)
    folder = f"{local_pods.namespace}_{pod.metadata.name}_{pod.metadata.uid}"
    node = next(n for n in local_pods.env.nodes.nodes() if n.name == pod.spec.node_name)
    assert (node.pod_logs / folder).is_dir()
    core.delete_namespaced_pod(pod.metadata.name, local_pods.namespace)

    def gone() -> bool:
        try:
            core.read_namespaced_pod(pod.metadata.name, local_pods.namespace)
            return False
        except ApiException as e:
            if e.status != 404:
                raise
            return True

    wait_for("the pod to be gone", gone, timeout=90)
    r = local_pods.kubectl(kubectl, "logs", pod.metadata.name)
    assert r.returncode != 0 and "not found" in r.stderr, (r.returncode, r.stderr)
    wait_for("the kubelet to remove the pod's log folder", lambda: not (node.pod_logs / folder).exists(),
             timeout=180, interval=1)
    files = sorted((local_pods.env.pod_log_archive / folder / "reconciler").glob("*.log"))
    assert files, f"nothing in {local_pods.env.pod_log_archive / folder}"
    messages = _messages("\n".join(_cri_text(f) for f in files))
    assert any(m.startswith("leading (lease") for m in messages), messages
    assert any(m.startswith("released lease") for m in messages), messages  # written as it was stopped
    local_pods.wait_ready()


def test_lending_through_the_pods(local_pods):
    """The lending demo's story (demos/lending_demo.py) with the reconciler as these pods (their RBAC,
    their REST client): spares and the idle L40S node lend, inference runs on them, a training job takes
    its node back, and a fault on it takes the lent spare after its borrowers leave."""
    from gpufleet.reconciler.adapters.kube import Kube
    from gpufleet.fleetspec import ledger

    from demos.lending_demo import show_lending

    local_pods.wait_ready()  # (no wait for every Slurm node: the idle L40S one may be lent already)
    kube = Kube(local_pods.env.kube.api_client())
    alive = lambda: any(p["ready"] for p in local_pods.pods())  # noqa: E731
    lines: list[str] = []
    figures = show_lending(local_pods.spec, local_pods.env, kube, alive, "the reconciler pods", out=lines.append)
    text = "\n".join(lines)
    assert "kwok-h100-spare-1" in text and "kwok-l40s-0" in text  # what lent: the spare beyond the floor, the idle node
    assert "kwok-h100-spare-0" not in text.split("[5/7]")[0]  # the floor: never lent
    assert figures["pending_to_running_seconds"] < 120
    assert "Succeeded: kwok-l40s-spare-0 replaces kwok-l40s-0" in text and "waited" in text, text
    assert "running again on Slurm node" in text and "(Kubernetes node kwok-l40s-spare-0)" in text, text
    data = kube.core.read_namespaced_config_map("gpufleet-lending", local_pods.namespace).data
    books = ledger.parse_data(data)
    assert {x.node for x in books["l40s"].loans} >= {"kwok-l40s-0", "kwok-l40s-spare-0"}
    assert all(not x.open for x in books["l40s"].loans if x.node == "kwok-l40s-spare-0")  # promoted: loan ended


def _agent_drill(local_pods, built_images, name: str, node: str, kmsg_dir) -> None:
    """The agent's image in its namespace, with its ServiceAccount (and the token the kubelet mounts, bound to
    this pod on system-0), run as the stack's DaemonSet declares it (its arguments, the policy ConfigMap
    mounted: issue 21, the agent reads the effective catalogue from the policy), only the kernel log swapped
    for one this test writes, reporting for `node`."""
    core = local_pods.env.kube.core_v1()
    ns = local_pods.spec.healing.reconciler.agent_namespace
    ds = client.AppsV1Api(local_pods.env.kube.api_client()).read_namespaced_daemon_set("gpufleet-agent", ns)
    (declared,) = ds.spec.template.spec.containers
    args = [{"/dev/kmsg": "/drill/kmsg", "$(NODE_NAME)": node}.get(a, a) for a in declared.args]
    assert "--policy" in args and "--condition" not in args
    policy = next(v for v in ds.spec.template.spec.volumes if v.name == "policy")
    policy_mount = next(m for m in declared.volume_mounts if m.name == "policy")
    core.create_namespaced_pod(ns, {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {
            "nodeName": "system-0", "hostNetwork": True, "serviceAccountName": "gpufleet-agent",
            "restartPolicy": "Never",
            "containers": [{
                "name": "agent", "image": built_images.agent.reference,
                "args": args + ["--from-start"],
                "env": [{"name": "KUBERNETES_SERVICE_HOST", "value": "127.0.0.1"},
                        {"name": "KUBERNETES_SERVICE_PORT", "value": str(local_pods.env.kube.apiserver_port)}],
                "securityContext": {"readOnlyRootFilesystem": True, "allowPrivilegeEscalation": False},
                "volumeMounts": [{"name": "drill", "mountPath": "/drill", "readOnly": True},
                                 {"name": "policy", "mountPath": policy_mount.mount_path, "readOnly": True}],
                # the API server cannot reach this node's kubelet for logs: a failure keeps its last lines here
                "terminationMessagePolicy": "FallbackToLogsOnError",
            }],
            "volumes": [{"name": "drill", "hostPath": {"path": str(kmsg_dir), "type": "Directory"}},
                        {"name": "policy", "configMap": {"name": policy.config_map.name}}],
        }})


def test_agent_image_on_the_node_reports_an_xid_from_a_kernel_log(local_pods, built_images):
    """The agent's image on a real node writes the GPU condition of its own node (system-0: no pool's, so the
    reconciler leaves it alone), with the action the policy gives the fault in its header, and, with the same
    token, cannot write a GPU node's (the stack's admission policy keys on the node name the kubelet-mounted
    token carries)."""
    drill = local_pods.env.root / "drill"
    drill.mkdir(mode=0o755, exist_ok=True)
    kmsg = drill / "kmsg"
    # follows open-gpu-kernel-modules 595.45.04 kern_gpu_error_cont_ga100.c (example 3), as in kernel_lines.yaml
    kmsg.write_text("[ 1843.451234] NVRM: Xid (PCI:0000:3b:00): 95, pid=7062, Uncontained: LTC TAG (0x2, 0x1). "
                    "RST: Yes, D-RST: No\n")
    kmsg.chmod(0o644)
    core = local_pods.env.kube.core_v1()
    ns = local_pods.spec.healing.reconciler.agent_namespace
    cond_type = local_pods.spec.healing.condition_types[0]
    _agent_drill(local_pods, built_images, "agent-drill", "system-0", drill)

    def faulted(node):
        conds = core.read_node(node).status.conditions or []
        return next((c for c in conds if c.type == cond_type and c.status == "False" and c.reason == "Xid95"), None)

    cond = wait_for("the agent pod to set the GPU condition of system-0", lambda: faulted("system-0"), timeout=90)
    assert "LTC TAG" in cond.message and cond.message.startswith("[action=reset-gpu pci=0000:3b:00] "), cond.message
    pod = core.read_namespaced_pod("agent-drill", ns)
    assert pod.spec.containers[0].image == built_images.agent.reference
    core.delete_namespaced_pod("agent-drill", ns, grace_period_seconds=0)

    before = core.read_node("kwok-l40s-0")  # (an earlier test may have faulted it: only a change counts)
    _agent_drill(local_pods, built_images, "agent-forger", "kwok-l40s-0", drill)
    failed = wait_for("the agent refused another node to give up", lambda: core.read_namespaced_pod(
        "agent-forger", ns).status.phase == "Failed", timeout=90)
    log = _termination_message(core, "agent-forger", ns)
    assert failed and "403" in log and "only the node its token is bound to" in log, log
    # nothing of the forger's on kwok-l40s-0 (its other conditions move on their own: kwok's heartbeats, the
    # repair loop's return of the node the lending test faulted)
    forged = [c for c in core.read_node("kwok-l40s-0").status.conditions or []
              if c.type == cond_type and (c.reason == "Xid95" or "LTC TAG" in (c.message or ""))]
    assert forged == [] and not [c for c in before.status.conditions or [] if c.reason == "Xid95"]
    core.delete_namespaced_pod("agent-forger", ns, grace_period_seconds=0)
    Kube(local_pods.env.kube.api_client()).set_condition("system-0", cond_type, "True", "DrillOver", "cleared")


def _records(local_pods, node):
    from gpufleet.reconciler.adapters.records import KubeRemediationStore

    return [r for r in KubeRemediationStore(local_pods.env.kube.api_client()).list() if r.node == node]


def test_the_lease_holder_heals_a_fault_and_the_other_replica_finishes_when_it_goes(local_pods):
    """An XID 79 on a GPU node whose Slurm node is a NodeSet pod's hostname: the pod holding the Lease
    starts the remediation; deleting that pod mid-remediation hands the Lease (and the record) to the
    other replica, which finishes it without repeating a phase."""
    from gpufleet.reconciler.adapters.kube import Kube
    from gpufleet.reconciler.core.phases import Phase

    local_pods.env.wait_slurm_nodes(["h100-0", "h100-1"])  # the L40S pool lends its idle node: not waited for
    pods = local_pods.wait_ready()
    first = next(p for p in pods if p["leader"])
    core = local_pods.env.kube.core_v1()
    worker = core.list_namespaced_pod(local_pods.spec.slurm.namespace,
                                      label_selector=f"{labels.SLINKY_POD_HOSTNAME}=h100-1").items[0]
    node = worker.spec.node_name
    assert node != "h100-1" and node.startswith("kwok-")  # Slurm and Kubernetes names differ
    Kube(local_pods.env.kube.api_client()).set_condition(node, "GpuHealthy", "False", "Xid79", "off the bus")
    wait_for("the remediation to start", lambda: _records(local_pods, node), timeout=60)
    core.delete_namespaced_pod(first["name"], local_pods.namespace)  # the leader goes mid-remediation
    (done,) = wait_for("the remediation to end",
                       lambda: [r for r in _records(local_pods, node) if r.phase.terminal], timeout=240)
    assert done.phase is Phase.SUCCEEDED, done.reason
    assert done.slurm_nodes == ("h100-1",)
    phases = [p for p, _ in done.phase_times]
    assert len(phases) == len(set(phases))  # no phase done twice
    notified = [k.split(":", 1)[1] for k in done.intents if k.startswith("notify:")]
    assert notified.count("detected") == 1 and notified.count("succeeded") == 1
    leader = wait_for("a Lease holder", local_pods.leader, timeout=60)
    assert leader["name"] != first["name"]
    # a NodeSet pod (a slurmd) runs on the promoted spare: what the reconciler waited for before Succeeded
    on_spare = core.list_namespaced_pod(local_pods.spec.slurm.namespace,
                                        field_selector=f"spec.nodeName={done.replacement}").items
    assert any(labels.SLINKY_POD_HOSTNAME in (p.metadata.labels or {}) for p in on_spare)


def _termination_message(core, name: str, ns: str) -> str:
    """A finished container's exit code and message (its last log lines, on failure)."""
    t = core.read_namespaced_pod(name, ns).status.container_statuses[0].state.terminated
    return f"exit {t.exit_code}: {t.message or ''}"


READ_KMSG = "import os; fd = os.open('/dev/kmsg', os.O_RDONLY | os.O_NONBLOCK); os.read(fd, 8192); print('read')"


@pytest.mark.parametrize("privileged", [True, False], ids=["privileged", "cap-syslog-host-path"])
def test_what_the_agent_needs_to_read_dev_kmsg_on_a_real_node(local_pods, built_images, privileged):
    """The agent's security context (components/agent.py) on a kubelet node with containerd and runc, reading
    the host's real /dev/kmsg: privileged (as root) with a read-only mount reads it; unprivileged with CAP_SYSLOG
    and the same host path cannot (runc's device cgroup admits /dev/kmsg only to a privileged container, or with
    the device handed over by a device plugin, which this environment has not). (The stack's agent ran
    privileged as the image's user 65532 before, which under this kernel's dmesg_restrict=1 read nothing.)"""
    from gpufleet.components.agent import agent_pod_spec

    spec = local_pods.spec
    pod = agent_pod_spec(spec)  # without agent_kmsg_device: privileged, /dev/kmsg read-only
    (c,) = pod["containers"]
    if not privileged:  # the device plugin's context, with the host path instead of the device
        c["securityContext"] = {"privileged": False, "allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                "runAsUser": 0, "runAsNonRoot": False,
                                "capabilities": {"drop": ["ALL"], "add": ["SYSLOG"]}}
    name = f"kmsg-{'privileged' if privileged else 'syslog'}"
    c.update(image=built_images.agent.reference, command=["/opt/gpufleet/bin/python", "-c", READ_KMSG], args=[],
             terminationMessagePolicy="FallbackToLogsOnError")
    pod.update(nodeName="system-0", restartPolicy="Never", affinity=None, hostNetwork=True)  # as the drill's
    ns = spec.healing.reconciler.agent_namespace
    core = local_pods.env.kube.core_v1()
    core.create_namespaced_pod(ns, {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": pod})

    def explain() -> str:
        st = core.read_namespaced_pod(name, ns).status
        events = core.list_namespaced_event(ns, field_selector=f"involvedObject.name={name}").items
        return f"{st.phase} {st.container_statuses} {[e.message for e in events]}"

    phase = wait_for(f"{name} to finish", lambda: (p := core.read_namespaced_pod(name, ns).status.phase) in (
        "Succeeded", "Failed") and p, timeout=120, explain=explain)
    log = _termination_message(core, name, ns)
    core.delete_namespaced_pod(name, ns, grace_period_seconds=0)
    if privileged:
        assert phase == "Succeeded", log
    else:
        assert phase == "Failed" and "Operation not permitted" in log, log
