"""The `local` environment: a control plane with the spec's fake GPU nodes (kwok), a real Slurm
26.05 with slurmrestd, the stand-in for Slinky's operator that puts NodeSet pods on the fake nodes
and runs a slurmd for each (`slinky_standin.py`), the checkpoint folder, and the system pool.

The system pool is real kubelet nodes (``kubelet_nodes`` > 0, what `gpufleet local up` starts: one
per reconciler replica, :mod:`localenv.node`), on which `pulumi up` of the local stack runs
the reconciler's Deployment as real pods from the project's image; or one kwok node per replica
(``kubelet_nodes=0``), with the reconciler as a host process (:meth:`LocalEnv.start_reconciler`, a
developer's option) using the same code and the policy the stack rendered.

The stand-in for a cluster autoscaler (:mod:`localenv.autoscaler_standin`) joins a pool's next kwok
node when the reconciler asks for capacity, as a cloud's node group would. What the product's commands
need to reach this environment is recorded in its state file (:class:`gpufleet.local_cluster.LocalCluster`)
and the local stack's configuration is generated beside it (:mod:`localenv.stack_config`).
"""
from __future__ import annotations

import os
import signal
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

from kubernetes.client.exceptions import ApiException

from gpufleet.fleetspec.models import FleetSpec
from gpufleet.fleetspec.placement import worker_selector, worker_tolerations
from gpufleet.local_cluster import LOCAL_PASSPHRASE, LocalCluster
from gpufleet.stack import Stack
from gpufleet.waiting import wait_for
from localenv import fake_nodes, stack_config
from localenv.autoscaler_standin import AutoscalerConfig
from localenv.control_plane import DEFAULT_PORTS, LocalKube
from localenv.host_reconciler import reconciler_proc
from localenv.node import SystemNodes
from localenv.paths import PROJECT_DIR, TOOLS_BIN, local_dir, state_file
from localenv.ports import free_ports
from localenv.slinky_standin import NodeSetDef, StandInConfig
from localenv.slurm import LocalSlurm
from localenv.supervisor import Proc, Supervisor, SupervisorError

SLURM_PORTS = {"ctld": 26817, "rest": 26820}
# Host processes: <root>/<name>.pid and .log
RECONCILER, STANDIN, AUTOSCALER = "reconciler", "slinky-standin", "autoscaler-standin"


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
            scheduler_port=p["scheduler"], kwok_port=p["kwok"], dcgm_exporter_port=p["dcgm_exporter"],
            etcd_unsafe_no_fsync=True, progress=self.progress,
        )
        # Partitions over NodeSets, one NodeSet per pool named after it (as the stack declares them).
        partitions = {part.name: list(part.pools) for part in self.spec.slurm.partitions}
        # Jobs run inside the Slurm root: they see the checkpoint storage and the project (train.py).
        binds = [PROJECT_DIR, *self.storage_paths()]
        self.slurm = LocalSlurm(
            self.root / "slurm", partitions, binds=binds, cpus_per_node=max(p.cpus_per_node for p in self.spec.pools),
            ctld_port=p["slurm_ctld"], rest_port=p["slurm_rest"], cluster_name=self.spec.slurm.cluster_name,
        )
        # The pods on the kubelet nodes reach slurmrestd and the dcgm-exporter stand-in on their node's loopback, as
        # the API server.
        self.nodes = SystemNodes(self.root / "nodes", self.kube, self.kubelet_nodes, self.bin_dir,
                                 progress=self.progress, relay_ports=(p["slurm_rest"], p["dcgm_exporter"]),
                                 log_archive=self.pod_log_archive)
        # The host processes of this module (pid files and logs in the environment's folder).
        self.host = Supervisor(self.root, self.root, start_timeout=30.0, stop_timeout=10.0, progress=self.progress)
        self.reconciler_log = self.host.log_path(RECONCILER)
        self.standin_log = self.host.log_path(STANDIN)
        self.standin_config = self.root / "slinky-standin.json"
        self.autoscaler_log = self.host.log_path(AUTOSCALER)
        self.autoscaler_config = self.root / "autoscaler-standin.json"
        self.stack_config_file = self.root / "pulumi" / "Pulumi.local.yaml"

    @property
    def pod_log_archive(self) -> Path:
        """Where the kubelet nodes' log shippers keep every container's log, a deleted pod's too
        (:mod:`localenv.log_shipper`): ``<ns>_<pod>_<uid>/<container>/<restart>.log``."""
        return self.root / "logs" / "pods"

    def storage_paths(self) -> list[Path]:
        paths = [Path(s.host_path) for s in self.spec.storage if s.host_path]
        return paths or [self.root / "checkpoints"]

    def nodesets(self) -> list[NodeSetDef]:
        """The NodeSets the stack declares (components/slinky.py: one per pool, `replicas` = the
        pool's nodes), for the Slurm names to wait for."""
        return [NodeSetDef(pool.name, pool.nodes, worker_selector(pool), worker_tolerations(pool),
                           pool.gpus_per_node) for pool in self.spec.pools]

    def slurm_node_names(self) -> list[str]:
        """The Slurm names of every NodeSet pod (pod hostnames: `<nodeset>-<i>`)."""
        return [ns.hostname(i) for ns in self.nodesets() for i in range(ns.replicas)]

    @staticmethod
    def free_ports(spec: FleetSpec) -> dict[str, int]:
        """Ports nobody listens on, for a second environment beside the default one (tests)."""
        names = ["etcd", "etcd_peer", "apiserver", "controller_manager", "scheduler", "kwok", "slurm_ctld",
                 "slurm_rest"]
        return dict(zip(names, free_ports(len(names))))

    # --- lifecycle ---------------------------------------------------------------------------

    def up(self) -> "LocalEnv":
        t0 = time.monotonic()
        self.root.mkdir(parents=True, exist_ok=True)
        self.kube.up()
        self.ensure_nodes()
        self.nodes.up()
        for path in self.storage_paths():
            path.mkdir(parents=True, exist_ok=True)
        self.progress("[local] slurm 26.05: munged, slurmctld, slurmrestd (JWT) ...")
        self.slurm.up()
        # The stand-in acts on the NodeSets the stack declares: Slurm nodes appear after `pulumi up`
        # (wait_slurm_nodes), as with the operator in a real cluster.
        self.start_standin()
        self.start_autoscaler()
        self.write_stack_config()
        self.cluster().write(self.state_file)
        self.progress(f"[local] up in {time.monotonic() - t0:.1f}s: kubeconfig {self.kube.kubeconfig_path}, "
                      f"slurmrestd {self.slurm.rest_url}")
        return self

    def wait_slurm_nodes(self, names: list[str] | None = None, timeout: float = 120.0) -> None:
        """Until every NodeSet pod's slurmd has registered (after `pulumi up` declared the NodeSets,
        the stand-in places the pods and starts their slurmd)."""
        names = self.slurm_node_names() if names is None else names

        def ready() -> bool:  # registered, and the stand-in wrote the operator's comment
            if not self.standin_running():
                raise RuntimeError(f"the Slinky stand-in exited; log tail:\n{self.standin_log_tail()}")
            if not self.slurm.nodes_up(names):
                return False
            info = self.slurm.node_info()
            return all(info.get(n, {}).get("comment") for n in names)

        wait_for(f"Slurm nodes {names} up", ready, timeout, interval=0.5,
                 explain=lambda: f"sinfo: {self.slurm.node_states()}; stand-in log tail:\n{self.standin_log_tail()}")
        self.wait_reconciler_slurm_user(timeout)

    def wait_reconciler_slurm_user(self, timeout: float = 120.0) -> None:
        """Until the stack's SlurmUsers Job (its stand-in: localenv/slurm_users_job.py) has given the reconciler's
        Slurm user its AdminLevel, so the reconciler's first node update is not refused. Nothing to wait for
        when the reconciler acts as root or the SlurmUser (no accounting entry), or when no Accounting was applied
        (NodeSets without a stack: the stand-in renders the Accounting before it places any pod)."""
        from gpufleet.fleetspec.models import RECONCILER_ADMIN_LEVEL, SLURM_USER

        user = self.spec.slurm.reconciler_user
        if user in ("root", SLURM_USER) or not self.spec.slurm.accounting.enabled or not self.slurm.accounting:
            return

        def level() -> str:
            if not self.slurm.accounting:
                return ""
            r = self.slurm.run(["sacctmgr", "-n", "-P", "show", "user", f"name={user}", "format=adminlevel"],
                               timeout=15)
            return r.stdout.strip() if r.returncode == 0 else ""

        wait_for(f"the reconciler's Slurm user {user} with AdminLevel {RECONCILER_ADMIN_LEVEL}",
                 lambda: level() == RECONCILER_ADMIN_LEVEL, timeout, interval=0.5,
                 explain=lambda: f"stand-in log tail:\n{self.standin_log_tail()}")

    # --- what the product and the stack are told --------------------------------------------------

    @property
    def state_file(self) -> Path:
        return state_file(self.root)

    def cluster(self) -> LocalCluster:
        """This environment as the product's commands read it (the state file's content)."""
        return LocalCluster(
            environment=self.spec.environment, kubeconfig=self.kube.kubeconfig_path,
            slurm_conf=self.slurm.conf_path, slurm_bin_dir=self.slurm.bin_dir, slurm_rest_url=self.slurm.rest_url,
            slurm_jwt_key=self.slurm.jwt_key_path, pulumi_backend_url=f"file://{self.root / 'state'}",
            pulumi_config_file=self.stack_config_file)

    def write_stack_config(self, require_images: bool = False) -> Path:
        """The local stack's configuration with this environment's part (images, API address, slurmrestd)."""
        (self.root / "state").mkdir(parents=True, exist_ok=True)
        local = stack_config.local_environment(self.kube.kubeconfig_path, self.kube.apiserver_port,
                                               self.slurm.rest_url, require_images=require_images)
        return stack_config.write(self.stack_config_file, PROJECT_DIR / "Pulumi.local.yaml", local)

    def stack(self) -> Stack:
        """The local stack, run against this environment: its backend, passphrase and configuration (written
        again, so images built since `up` are the ones deployed; ImagesError when none are built)."""
        self.write_stack_config(require_images=True)
        return self._stack()

    def prepare_stack(self) -> None:
        """The local stack ready for `gpufleet pulumi -s local ...` (idempotent): created in this environment's
        backend with the passphrase secrets provider, and its secrets set. Images are not needed for that
        (`pulumi up` says when they are missing)."""
        t0 = time.monotonic()
        stack = self._stack()
        created = stack.ensure()
        secrets = stack.ensure_secrets(self.spec.secret_keys())
        if created or secrets:
            self.progress(f"[local] stack local: {'created' if created else 'present'} in {self.root / 'state'}"
                          f"{', secrets set: ' + ', '.join(secrets) if secrets else ''} "
                          f"({time.monotonic() - t0:.1f}s)")

    def _stack(self) -> Stack:
        return Stack("local", extra_env={"PULUMI_BACKEND_URL": self.cluster().pulumi_backend_url,
                                         "PULUMI_CONFIG_PASSPHRASE": os.environ.get("PULUMI_CONFIG_PASSPHRASE",
                                                                                    LOCAL_PASSPHRASE)},
                     config_file=self.stack_config_file)

    def ensure_nodes(self) -> list[str]:
        """Create the spec's fake nodes that do not exist yet (never touches ones that do: the
        reconciler may have swapped roles since)."""
        core = self.kube.core_v1()
        existing = {n.metadata.name for n in core.list_node().items}
        created = []
        if self.kubelet_nodes:  # the real nodes are the system pool now: no fake one may take its pods
            for name in sorted(n for n in existing if n.startswith(fake_nodes.SYSTEM_NODE[:-1])):
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

        nodes = fake_nodes.fleet_nodes(self.spec, prefix=fake_nodes.KWOK_PREFIX)
        system = next(n for n in nodes if n["metadata"]["name"] == fake_nodes.SYSTEM_NODE)
        nodes.remove(system)
        if self.kubelet_nodes:
            return nodes
        extra = []
        for i in range(self.spec.healing.reconciler.replicas):
            n = copy.deepcopy(system)
            name = fake_nodes.SYSTEM_NODE[:-1] + str(i)
            n["metadata"]["name"] = name
            n["metadata"].setdefault("labels", {})["kubernetes.io/hostname"] = name
            extra.append(n)
        return extra + nodes

    def down(self) -> None:
        """What calls Slurm and the API server stops first (the reconciler, the stand-ins: a stand-in's pass in
        flight is abandoned at its SIGTERM), then the nodes, Slurm and the control plane."""
        self.stop_reconciler()
        self.stop_autoscaler()
        self.stop_standin()
        self.nodes.down()
        self.slurm.down()
        self.kube.down()
        self.state_file.unlink(missing_ok=True)
        self.progress("[local] down")

    def status(self) -> dict:
        return {"kube": self.kube.status(), "slurm": self.slurm.status(), "reconciler": self.reconciler_status(),
                "slinky_standin": self.standin_status(), "autoscaler_standin": _state(self.host.pid(AUTOSCALER)),
                "nodes": self.nodes.status(), "pods": self.reconciler_pods()}

    def reconciler_pods(self) -> list[dict]:
        """The reconciler's pods as the API server sees them (empty when it does not answer)."""
        from localenv.pods import reconciler_pods

        try:
            return reconciler_pods(self.kube.core_v1(), self.spec.healing.reconciler.namespace)
        except Exception:  # noqa: BLE001 - status must work with the API server down
            return []

    def slurm_env(self) -> dict[str, str]:
        return self.slurm.env()

    # --- the reconciler as a host process -------------------------------------------------------

    def start_reconciler(self, policy: Path, extra_env: dict[str, str] | None = None,
                         metrics_port: int = 0) -> int:
        """Start `gpufleet reconcile` in the background (idempotent); returns its pid. Everything it needs of
        this environment is on its command line (and SLURM_CONF for the CLI backend)."""
        return self._start_host(reconciler_proc(
            RECONCILER, self.kube.kubeconfig_path, policy, self.state_file, slurm_url=self.slurm.rest_url,
            jwt_key=self.slurm.jwt_key_path, metrics_port=metrics_port, env={**self.slurm.env(), **(extra_env or {})}))

    def reconciler_running(self) -> bool:
        return self.host.pid(RECONCILER) is not None

    def reconciler_log_tail(self, lines: int = 20) -> str:
        return self.host.tail(RECONCILER, lines)

    def reconciler_status(self) -> str:
        return _state(self.host.pid(RECONCILER))

    def stop_reconciler(self, sig: int = signal.SIGTERM, timeout: float = 10.0) -> None:
        """Stop it (SIGTERM, SIGKILL after `timeout`), or kill it at once with `sig=SIGKILL`."""
        self.host.stop([RECONCILER], timeout, sig=sig)

    # --- the stand-in for Slinky's operator, as a host process ----------------------------------

    def start_standin(self, nodesets: list[NodeSetDef] | None = None) -> int:
        """Start the Slinky stand-in in the background (idempotent); returns its pid. It acts on the
        NodeSet resources the stack applies, or on `nodesets` (benchmarks that run no stack)."""
        slurm = self.slurm
        StandInConfig(
            kubeconfig=str(self.kube.kubeconfig_path), namespace=self.spec.slurm.namespace,
            nodesets=None if nodesets is None else [asdict(ns) for ns in nodesets],
            slurm={"workdir": str(slurm.workdir), "partitions": slurm.partitions, "root": str(slurm.root),
                   "binds": [str(b) for b in slurm.binds], "ctld_port": slurm.ctld_port, "rest_port": slurm.rest_port,
                   "cpus_per_node": slurm.cpus_per_node, "real_memory_mb": slurm.real_memory_mb,
                   "cluster_name": slurm.cluster_name},
        ).write(self.standin_config)
        argv = [sys.executable, "-m", "localenv.slinky_standin", "--config", str(self.standin_config)]
        return self._start_host(Proc(STANDIN, argv, _up, cwd=PROJECT_DIR))

    def standin_running(self) -> bool:
        return self.host.pid(STANDIN) is not None

    def standin_status(self) -> str:
        return _state(self.host.pid(STANDIN))

    def standin_log_tail(self, lines: int = 20) -> str:
        return self.host.tail(STANDIN, lines)

    def stop_standin(self, timeout: float = 10.0) -> None:
        """Stop the stand-in only: the slurmds it started run on, as NodeSet pods outlive the operator."""
        self.host.stop([STANDIN], timeout, tree=False)

    # --- the stand-in for a cluster autoscaler, as a host process ----------------------------------

    def start_autoscaler(self) -> int:
        """Start the cluster autoscaler's stand-in in the background (idempotent); returns its pid."""
        AutoscalerConfig.of(self.kube.kubeconfig_path, self.spec).write(self.autoscaler_config)
        argv = [sys.executable, "-m", "localenv.autoscaler_standin", "--config", str(self.autoscaler_config)]
        return self._start_host(Proc(AUTOSCALER, argv, _up, cwd=PROJECT_DIR))

    def autoscaler_running(self) -> bool:
        return self.host.pid(AUTOSCALER) is not None

    def stop_autoscaler(self, timeout: float = 10.0) -> None:
        self.host.stop([AUTOSCALER], timeout)

    def _start_host(self, proc: Proc) -> int:
        self.host.ensure([proc])
        pid = self.host.pid(proc.name)
        if pid is None:
            raise SupervisorError(f"{proc.name} exited at once; last lines of {self.host.log_path(proc.name)}:\n"
                                  f"{self.host.tail(proc.name)}")
        return pid


def _up() -> bool:
    """Health of a host process with no endpoint of its own: it runs (the supervisor checks that);
    its work is checked by what waits for it (wait_slurm_nodes, the reconciler's Lease)."""
    return True


def _state(pid: int | None) -> str:
    return f"running (pid {pid})" if pid else "stopped"
