"""The `local` environment: a control plane with the spec's fake GPU nodes, a real Slurm
whose node names match them, the checkpoint folder, and the system pool.

The system pool is either real kubelet nodes (``kubelet_nodes`` > 0, what `gpufleet local up` starts:
one per reconciler replica, :mod:`gpufleet.localenv.node`), on which `pulumi up` of the local stack
runs the reconciler's Deployment as real pods, or one kwok node (``kubelet_nodes=0``), with the
reconciler as a host process (:meth:`LocalEnv.start_reconciler`, a developer's option) using the same
code and the policy the stack rendered into its ConfigMap.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from kubernetes.client.exceptions import ApiException

from fleetspec.models import FleetSpec
from reconciler import local_nodes

from ..paths import TOOLS_BIN, local_dir
from .kube import DEFAULT_PORTS, LocalKube
from .node import SystemNodes
from .slurm import LocalSlurm, free_port_block

SLURM_PORTS = {"ctld": 26817, "slurmd": 26818}


@dataclass
class LocalEnv:
    spec: FleetSpec
    root: Path = field(default_factory=local_dir)
    bin_dir: Path = TOOLS_BIN
    ports: dict[str, int] | None = None  # None: the fixed defaults; tests pass free ones
    progress: Callable[[str], None] = print
    kubelet_nodes: int = 0  # real system nodes; `gpufleet local up` starts one per reconciler replica

    def __post_init__(self) -> None:
        self.root = Path(self.root).resolve()
        p = {**DEFAULT_PORTS, **{f"slurm_{k}": v for k, v in SLURM_PORTS.items()}, **(self.ports or {})}
        self.kube = LocalKube(
            self.root / "kube", self.bin_dir, etcd_port=p["etcd"], etcd_peer_port=p["etcd_peer"],
            apiserver_port=p["apiserver"], controller_manager_port=p["controller_manager"],
            scheduler_port=p["scheduler"], kwok_port=p["kwok"], etcd_unsafe_no_fsync=True, progress=self.progress,
        )
        partitions, spares = local_nodes.slurm_node_names(self.spec)
        nodes = list(dict.fromkeys(n for members in partitions.values() for n in members))
        self.slurm = LocalSlurm(
            self.root / "slurm", nodes, partitions, cpus_per_node=max(p.cpus_per_node for p in self.spec.pools),
            ctld_port=p["slurm_ctld"], first_slurmd_port=p["slurm_slurmd"], cluster_name=self.spec.slurm.cluster_name,
            spare_nodes=spares,
        )
        self.nodes = SystemNodes(self.root / "nodes", self.kube, self.kubelet_nodes, self.bin_dir,
                                 progress=self.progress)
        self.reconciler_pid = self.root / "reconciler.pid"
        self.reconciler_log = self.root / "reconciler.log"

    @staticmethod
    def free_ports(spec: FleetSpec) -> dict[str, int]:
        """Ports nobody listens on, for a second environment beside the default one (tests)."""
        names = ["etcd", "etcd_peer", "apiserver", "controller_manager", "scheduler", "kwok", "slurm_ctld"]
        base = free_port_block(len(names))
        out = {n: base + i for i, n in enumerate(names)}
        partitions, _ = local_nodes.slurm_node_names(spec)
        out["slurm_slurmd"] = free_port_block(len({n for m in partitions.values() for n in m}))
        return out

    # --- lifecycle ---------------------------------------------------------------------------

    def up(self) -> "LocalEnv":
        t0 = time.monotonic()
        self.root.mkdir(parents=True, exist_ok=True)
        self.kube.up()
        self.ensure_nodes()
        self.nodes.up()
        self.progress(f"[local] slurm: slurmctld + {len(self.slurm.nodes)} slurmd ...")
        self.slurm.up()
        for s in self.spec.storage:
            if s.host_path:
                Path(s.host_path).mkdir(parents=True, exist_ok=True)
        self.state_file.write_text(json.dumps({
            "kubeconfig": str(self.kube.kubeconfig_path), "slurm_conf": str(self.slurm.conf_path),
            "environment": self.spec.environment,
        }, indent=2))
        self.progress(f"[local] up in {time.monotonic() - t0:.1f}s: kubeconfig {self.kube.kubeconfig_path}, "
                      f"SLURM_CONF={self.slurm.conf_path}")
        return self

    @property
    def state_file(self) -> Path:
        return self.root / "env.json"

    def ensure_nodes(self) -> list[str]:
        """Create the spec's fake nodes that do not exist yet (never touches ones that do: the
        reconciler may have swapped roles since)."""
        core = self.kube.core_v1()
        existing = {n.metadata.name for n in core.list_node().items}
        created = []
        if self.kubelet_nodes:  # the real nodes are the system pool now: no fake one may take its pods
            for name in sorted(n for n in existing if n.startswith(local_nodes.SYSTEM_NODE[:-1])):
                core.delete_node(name)
                existing.discard(name)
        for node in self._fake_nodes():
            name = node["metadata"]["name"]
            if name in existing:
                continue
            try:
                core.create_node(node)
                created.append(name)
            except ApiException as e:
                if e.status != 409:
                    raise
        for name in created:
            self.kube.wait_node_ready(name)
        self.progress(f"[local] nodes: {len(existing) + len(created)} ({len(created)} created)")
        return created

    def _fake_nodes(self) -> list[dict]:
        """The kwok nodes: the GPU pools, and, without kubelet nodes, a fake system node per reconciler
        replica (the Deployment's pods share the host's network, so two never share a node)."""
        import copy

        nodes = local_nodes.fleet_nodes(self.spec)
        system = next(n for n in nodes if n["metadata"]["name"] == local_nodes.SYSTEM_NODE)
        nodes.remove(system)
        if self.kubelet_nodes:
            return nodes
        extra = []
        for i in range(self.spec.healing.reconciler.replicas):
            n = copy.deepcopy(system)
            name = local_nodes.SYSTEM_NODE[:-1] + str(i)
            n["metadata"]["name"] = name
            n["metadata"].setdefault("labels", {})["kubernetes.io/hostname"] = name
            extra.append(n)
        return extra + nodes

    def down(self) -> None:
        self.stop_reconciler()
        self.nodes.down()
        self.slurm.down()
        self.kube.down()
        self.state_file.unlink(missing_ok=True)
        self.progress("[local] down")

    def status(self) -> dict:
        return {"kube": self.kube.status(), "slurm": self.slurm.status(), "reconciler": self.reconciler_status(),
                "nodes": self.nodes.status(), "pods": self.reconciler_pods()}

    def reconciler_pods(self) -> list[dict]:
        """The reconciler's pods as the API server sees them (empty when it does not answer)."""
        from .pods import reconciler_pods

        try:
            return reconciler_pods(self.kube.core_v1(), self.spec.healing.reconciler.namespace)
        except Exception:  # noqa: BLE001 - status must work with the API server down
            return []

    def slurm_env(self) -> dict[str, str]:
        return self.slurm.env()

    # --- the reconciler as a host process -------------------------------------------------------

    def start_reconciler(self, policy: Path, extra_env: dict[str, str] | None = None,
                         metrics_port: int = 0) -> int:
        """Start `gpufleet reconcile` in the background (idempotent)."""
        pid = self._reconciler_running()
        if pid:
            return pid
        argv = [sys.executable, "-m", "gpufleet", "reconcile", "--policy", str(policy),
                "--kubeconfig", str(self.kube.kubeconfig_path), "--leader-elect",
                "--metrics-port", str(metrics_port)]
        env = {**self.slurm.env(), **(extra_env or {}), "GPUFLEET_LOCAL_DIR": str(self.root)}
        with open(self.reconciler_log, "ab") as log:
            proc = subprocess.Popen(argv, stdout=log, stderr=log, stdin=subprocess.DEVNULL, env=env,
                                    start_new_session=True)
        self.reconciler_pid.write_text(str(proc.pid))
        self.progress(f"[local] reconciler started (pid {proc.pid}, log {self.reconciler_log})")
        return proc.pid

    def _reconciler_running(self) -> int | None:
        try:
            pid = int(self.reconciler_pid.read_text())
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except (OSError, ValueError):
            return None
        return pid if b"reconcile" in cmdline else None

    def reconciler_running(self) -> bool:
        return self._reconciler_running() is not None

    def reconciler_log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.reconciler_log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def reconciler_status(self) -> str:
        pid = self._reconciler_running()
        return f"running (pid {pid})" if pid else "stopped"

    def stop_reconciler(self, sig: int = signal.SIGTERM, timeout: float = 10.0) -> None:
        pid = self._reconciler_running()
        if not pid:
            return
        os.kill(pid, sig)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self._reconciler_running():
            try:
                os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                pass
            time.sleep(0.1)
        if self._reconciler_running():
            os.kill(pid, signal.SIGKILL)
        self.reconciler_pid.unlink(missing_ok=True)
