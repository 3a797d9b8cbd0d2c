"""A real local Kubernetes control plane with fake (kwok) GPU nodes.

:class:`LocalKube` runs etcd, kube-apiserver, kube-controller-manager,
kube-scheduler and kwok as detached background processes on 127.0.0.1 through
the local environment's :class:`~localenv.supervisor.Supervisor` (pid
files in ``<workdir>/run/``, logs in ``<workdir>/logs/``), so :meth:`LocalKube.up`
returns while they run and a later :meth:`LocalKube.down` (from this or another
process) stops them.

The binaries come from ``scripts/build-kube.sh`` (linked into ``.tools/bin``).
Certificates are generated once (:mod:`localenv.certs`) and reused;
the admin kubeconfig is ``<workdir>/kubeconfig`` with context ``gpufleet-local``.

Nodes are fake: :meth:`LocalKube.create_fake_node` creates a Node annotated
``kwok.x-k8s.io/node=fake``; kwok (configured with the Stage files in
``tools/kube/kwok/stages``) makes it Ready, keeps its lease fresh, and drives
pods bound to it to Running (and deletes them when they are deleted).

The command line is `gpufleet local up | down | status` (the whole environment).
"""

from __future__ import annotations

import ipaddress
import json
import logging
import os
import ssl
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from gpufleet.waiting import wait_for
from localenv.certs import APISERVER_KUBELET_CLIENT_CN, PKI, ensure_pki
from localenv.paths import PROJECT_DIR, TOOLS_BIN
from localenv.supervisor import Proc, Supervisor, SupervisorError, tail

log = logging.getLogger(__name__)

DEFAULT_BIN_DIR = TOOLS_BIN
DEFAULT_STAGES_DIR = PROJECT_DIR / "tools" / "kube" / "kwok" / "stages"

CONTEXT_NAME = "gpufleet-local"
KWOK_ANNOTATION = "kwok.x-k8s.io/node"
KWOK_ANNOTATION_VALUE = "fake"

# Defaults chosen away from the well-known ports (2379/2380, 6443, 10257, 10259,
# 10247) so a real cluster or kind on the same host does not collide.
DEFAULT_PORTS = {
    "etcd": 23790,
    "etcd_peer": 23800,
    "apiserver": 26443,
    "controller_manager": 20257,
    "scheduler": 20259,
    "kwok": 20247,
    "dcgm_exporter": 29400,  # dcgm-exporter's own default is 9400
}

KUBELET_CLIENT_BINDING = "gpufleet-local:apiserver-kubelet-client"

COMPONENTS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok")
# kwok's nodes' GPU hardware (localenv/gpu_hardware_standin.py): a process of ours, no binary to build
GPU_HARDWARE = "gpu-hardware-standin"
# dcgm-exporter's stand-in (localenv/dcgm_exporter_standin.py): their GPUs' telemetry on one /metrics, read only by a
# reconciler whose spec sets healing.telemetry (the local spec's source stays `none`: docs/local.md)
DCGM_EXPORTER = "dcgm-exporter-standin"
PROCESSES = (*COMPONENTS, GPU_HARDWARE, DCGM_EXPORTER)


class LocalKubeError(SupervisorError):
    """A component failed to start, became unhealthy or could not be stopped."""


@dataclass
class LocalKube:
    """A local control plane rooted at ``workdir`` using the binaries in ``bin_dir``.

    All ports are bound on 127.0.0.1 only. ``progress`` receives one line per
    step (``[local] etcd ready (1.2s)``); lines also go to this module's logger.
    """

    workdir: Path
    bin_dir: Path = DEFAULT_BIN_DIR
    etcd_port: int = DEFAULT_PORTS["etcd"]
    etcd_peer_port: int = DEFAULT_PORTS["etcd_peer"]
    apiserver_port: int = DEFAULT_PORTS["apiserver"]
    controller_manager_port: int = DEFAULT_PORTS["controller_manager"]
    scheduler_port: int = DEFAULT_PORTS["scheduler"]
    kwok_port: int = DEFAULT_PORTS["kwok"]
    dcgm_exporter_port: int = DEFAULT_PORTS["dcgm_exporter"]
    service_cluster_ip_range: str = "10.96.0.0/16"
    pod_cidr: str = "10.244.0.1/16"  # kwok hands out fake pod IPs from this (no traffic goes there)
    stages_dir: Path = DEFAULT_STAGES_DIR
    start_timeout: float = 90.0
    stop_timeout: float = 15.0
    etcd_unsafe_no_fsync: bool = False
    verbosity: int = 1
    progress: Callable[[str], None] | None = None
    _api_client: Any = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        self.workdir = Path(self.workdir).resolve()
        self.bin_dir = Path(self.bin_dir)
        self.stages_dir = Path(self.stages_dir)
        net = ipaddress.ip_network(self.service_cluster_ip_range)
        self.service_ip = str(net[1])
        self.supervisor = Supervisor(self.workdir / "run", self.workdir / "logs", self.start_timeout,
                                     self.stop_timeout, progress=lambda line: self.progress and self.progress(line))

    # ------------------------------------------------------------------ paths
    @property
    def kubeconfig_path(self) -> Path:
        return self.workdir / "kubeconfig"

    @property
    def pki(self) -> PKI:
        return PKI(self.workdir / "pki")

    @property
    def server_url(self) -> str:
        return f"https://127.0.0.1:{self.apiserver_port}"

    @property
    def dcgm_exporter_url(self) -> str:
        """The dcgm-exporter stand-in's metrics, for `healing.telemetry.exporter_urls`."""
        return f"http://127.0.0.1:{self.dcgm_exporter_port}/metrics"

    @property
    def etcd_url(self) -> str:
        return f"http://127.0.0.1:{self.etcd_port}"

    def log_path(self, name: str) -> Path:
        return self.supervisor.log_path(name)

    def pid_path(self, name: str) -> Path:
        return self.supervisor.pid_path(name)

    # ---------------------------------------------------------- public API
    def up(self) -> LocalKube:
        """Start (or reuse) every component and wait until all are healthy."""
        t0 = time.monotonic()
        self._check_binaries()
        for sub in ("run", "logs"):
            (self.workdir / sub).mkdir(parents=True, exist_ok=True)
        _, created = ensure_pki(self.workdir / "pki", service_ip=self.service_ip)
        self._say(f"[local] certificates {'generated: ' + ', '.join(created) if created else 'reused'}"
                  f" ({self.workdir / 'pki'})")
        self._write_kubeconfig()
        self._write_kwok_config()

        comps = self._components()
        self._ensure([comps["etcd"]])
        self._ensure([comps["kube-apiserver"]])
        self._ensure([comps["kube-controller-manager"], comps["kube-scheduler"], comps["kwok"]])
        self._ensure([comps[GPU_HARDWARE], comps[DCGM_EXPORTER]])
        self._wait_bootstrapped()
        self._authorize_kubelet_client()
        self._say(f"[local] control plane ready in {time.monotonic() - t0:.1f}s; "
                  f"KUBECONFIG={self.kubeconfig_path} (context {CONTEXT_NAME})")
        return self

    def down(self) -> None:
        """Stop every component (SIGTERM, then SIGKILL after ``stop_timeout``). Idempotent."""
        for group in ((DCGM_EXPORTER, GPU_HARDWARE, "kwok", "kube-scheduler", "kube-controller-manager"),
                      ("kube-apiserver",),
                      ("etcd",)):
            try:
                self.supervisor.stop(group)
            except SupervisorError as e:
                raise LocalKubeError(str(e)) from e
        self._api_client = None

    def stop_component(self, name: str) -> None:
        """Stop one component ("kube-apiserver", "etcd", ...), for outage drills; `start_component` or
        `up()` starts it again."""
        try:
            self.supervisor.stop((name,))
        except SupervisorError as e:
            raise LocalKubeError(str(e)) from e

    def start_component(self, name: str) -> None:
        self._ensure([self._components()[name]])

    def status(self) -> dict[str, Any]:
        """State of each component: pid, running, healthy, port, url, log file."""
        comps = self._components()
        out: dict[str, Any] = {
            "workdir": str(self.workdir),
            "kubeconfig": str(self.kubeconfig_path),
            "context": CONTEXT_NAME,
            "server": self.server_url,
            "components": {},
        }
        for name in PROCESSES:
            out["components"][name] = self.supervisor.status(comps[name])
        out["ready"] = all(v["healthy"] for v in out["components"].values())
        return out

    # ------------------------------------------------------- kubernetes API
    def api_client(self):
        """A ``kubernetes.client.ApiClient`` for the admin kubeconfig (cached)."""
        if self._api_client is None:
            from kubernetes import config as kconfig

            self._api_client = kconfig.new_client_from_config(
                config_file=str(self.kubeconfig_path), context=CONTEXT_NAME
            )
            self._api_client.user_agent = "gpufleet-local"  # its writes are named so in managedFields
        return self._api_client

    def core_v1(self):
        from kubernetes import client as kclient

        return kclient.CoreV1Api(self.api_client())

    def create_fake_node(
        self,
        name: str,
        labels: dict[str, str] | None = None,
        taints: list[dict[str, str]] | None = None,
        capacity: dict[str, str | int] | None = None,
        *,
        allocatable: dict[str, str | int] | None = None,
        annotations: dict[str, str] | None = None,
        wait_ready: bool = True,
        timeout: float = 60.0,
    ):
        """Create a kwok-managed Node and (by default) wait until it is Ready.

        ``capacity`` is merged over ``cpu=32, memory=256Gi, pods=110``; put
        ``nvidia.com/gpu`` in it for a GPU node. ``allocatable`` defaults to the
        capacity. ``taints`` are dicts with ``key``, optional ``value``, ``effect``.
        Returns the Node (``V1Node``) as last read.
        """
        cap = {"cpu": "32", "memory": "256Gi", "pods": "110"}
        cap.update({k: str(v) for k, v in (capacity or {}).items()})
        alloc = {k: str(v) for k, v in (allocatable or cap).items()}
        body = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": name,
                "annotations": {
                    KWOK_ANNOTATION: KWOK_ANNOTATION_VALUE,
                    "node.alpha.kubernetes.io/ttl": "0",
                    **(annotations or {}),
                },
                "labels": {
                    "kubernetes.io/hostname": name,
                    "kubernetes.io/os": "linux",
                    "kubernetes.io/arch": "amd64",
                    "type": "kwok",
                    **(labels or {}),
                },
            },
            "spec": {"taints": [dict(t) for t in (taints or [])]},
            "status": {"capacity": cap, "allocatable": alloc},
        }
        core = self.core_v1()
        core.create_node(body)
        if wait_ready:
            return self.wait_node_ready(name, timeout=timeout)
        return core.read_node(name)

    def wait_node_ready(self, name: str, timeout: float = 60.0):
        core = self.core_v1()
        node = None

        def ready():
            nonlocal node
            node = core.read_node(name)
            conds = (node.status.conditions or []) if node.status else []
            return node if any(c.type == "Ready" and c.status == "True" for c in conds) else None

        try:
            return wait_for(f"node {name} Ready", ready, timeout, interval=0.25)
        except TimeoutError:
            pass
        conds = [(c.type, c.status, c.reason) for c in ((node.status.conditions or []) if node and node.status else [])]
        raise LocalKubeError(
            f"node {name} did not become Ready within {timeout:.0f}s (conditions: {conds}); "
            f"kwok log tail:\n{tail(self.log_path('kwok'))}"
        )

    # -------------------------------------------------------------- internals
    def _say(self, msg: str) -> None:
        log.info(msg)
        if self.progress is not None:
            self.progress(msg)

    def _bin(self, name: str) -> str:
        return str(self.bin_dir / name)

    def _check_binaries(self) -> None:
        missing = [n for n in COMPONENTS if not os.access(self.bin_dir / n, os.X_OK)]
        if missing:
            raise LocalKubeError(
                f"missing binaries in {self.bin_dir}: {', '.join(missing)} "
                f"(build them with scripts/build-kube.sh)"
            )
        if not self.stages_dir.is_dir() or not list(self.stages_dir.glob("*.yaml")):
            raise LocalKubeError(f"no kwok Stage files (*.yaml) in {self.stages_dir}")

    def _write_kubeconfig(self) -> None:
        import base64

        b64 = lambda p: base64.b64encode(Path(p).read_bytes()).decode()  # noqa: E731
        pki = self.pki
        cfg = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{
                "name": CONTEXT_NAME,
                "cluster": {"server": self.server_url, "certificate-authority-data": b64(pki.ca_cert)},
            }],
            "users": [{
                "name": "gpufleet-admin",
                "user": {
                    "client-certificate-data": b64(pki.admin_cert),
                    "client-key-data": b64(pki.admin_key),
                },
            }],
            "contexts": [{
                "name": CONTEXT_NAME,
                "context": {"cluster": CONTEXT_NAME, "user": "gpufleet-admin", "namespace": "default"},
            }],
            "current-context": CONTEXT_NAME,
            "preferences": {},
        }
        tmp = self.kubeconfig_path.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            yaml.safe_dump(cfg, f, sort_keys=False)
        os.replace(tmp, self.kubeconfig_path)

    def _write_kwok_config(self) -> None:
        docs = []
        for p in sorted(self.stages_dir.glob("*.yaml")):
            docs.extend(d for d in yaml.safe_load_all(p.read_text()) if d)
        path = self.workdir / "kwok.yaml"
        path.write_text(yaml.safe_dump_all(docs, sort_keys=False))

    def _components(self) -> dict[str, Proc]:
        pki = self.pki
        wd = self.workdir
        kc = str(self.kubeconfig_path)
        v = f"--v={self.verbosity}"
        peer = f"http://127.0.0.1:{self.etcd_peer_port}"

        def etcd_argv() -> list[str]:
            argv = [
                self._bin("etcd"),
                "--name=gpufleet-local",
                f"--data-dir={wd / 'etcd-data'}",
                f"--listen-client-urls={self.etcd_url}",
                f"--advertise-client-urls={self.etcd_url}",
                f"--listen-peer-urls={peer}",
                f"--initial-advertise-peer-urls={peer}",
                f"--initial-cluster=gpufleet-local={peer}",
                "--initial-cluster-state=new",
                "--auto-compaction-mode=periodic",
                "--auto-compaction-retention=1h",
                "--quota-backend-bytes=2147483648",
                "--log-level=warn",
            ]
            if self.etcd_unsafe_no_fsync:
                argv.append("--unsafe-no-fsync")
            return argv

        def apiserver_argv() -> list[str]:
            return [
                self._bin("kube-apiserver"),
                f"--etcd-servers={self.etcd_url}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                f"--secure-port={self.apiserver_port}",
                f"--cert-dir={wd / 'apiserver-certs'}",
                f"--tls-cert-file={pki.apiserver_cert}",
                f"--tls-private-key-file={pki.apiserver_key}",
                f"--client-ca-file={pki.ca_cert}",
                "--authorization-mode=Node,RBAC",
                # NodeRestriction, as kubeadm clusters run it (it is not among kube-apiserver v1.34.4's default
                # plugins: `kube-apiserver --help`): a kubelet writes only its own Node and its pods, and never a
                # `node-restriction.kubernetes.io/` label (on create or update), where trusted membership can live.
                "--enable-admission-plugins=NodeRestriction",
                # What it needs to reach the kubelets' own servers (logs, exec, port-forward): the client
                # certificate as kubeadm sets it (cmd/kubeadm/app/phases/controlplane/manifests.go,
                # v1.34.4), and, which kubeadm does not (it leaves a kubelet's serving certificate
                # self-signed), the CA that signed the local kubelets' serving certificates
                # (localenv/node.py). kubeadm tries InternalIP, ExternalIP, Hostname; a local node's
                # InternalIP is its link to the host (localenv/netns.py), its hostname resolves nowhere.
                f"--kubelet-client-certificate={pki.apiserver_kubelet_client_cert}",
                f"--kubelet-client-key={pki.apiserver_kubelet_client_key}",
                f"--kubelet-certificate-authority={pki.ca_cert}",
                "--kubelet-preferred-address-types=InternalIP",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                f"--service-account-key-file={pki.sa_pub}",
                f"--service-account-signing-key-file={pki.sa_key}",
                f"--service-cluster-ip-range={self.service_cluster_ip_range}",
                # A loopback address is not a valid Endpoints address: don't publish
                # the "kubernetes" service endpoints at all.
                "--endpoint-reconciler-type=none",
                "--allow-privileged=true",
                "--profiling=false",
                # On SIGTERM, stop serving once the in-flight requests have drained, and give the HTTP server's
                # Shutdown 2 s instead of the request timeout (60 s) it otherwise waits for the clients' open
                # watches (kwok, the controllers, the reconciler) to go: k8s.io/apiserver v0.34.4
                # pkg/server/lifecycle_signals.go and genericapiserver.go (ShutdownSendRetryAfter). The local
                # API server has no load balancer in front to wait for; a stop from elsewhere (an outage drill,
                # `local down` while clients still watch) then ends in seconds, not in a SIGKILL or a minute.
                "--shutdown-send-retry-after=true",
                v,
            ]

        def delegated(secure_port: int) -> list[str]:
            return [
                f"--kubeconfig={kc}",
                f"--authentication-kubeconfig={kc}",
                f"--authorization-kubeconfig={kc}",
                "--bind-address=127.0.0.1",
                f"--secure-port={secure_port}",
                "--leader-elect=false",
                "--profiling=false",
                v,
            ]

        def kcm_argv() -> list[str]:
            return [
                self._bin("kube-controller-manager"),
                *delegated(self.controller_manager_port),
                "--cluster-name=gpufleet-local",
                "--controllers=*",
                f"--root-ca-file={pki.ca_cert}",
                f"--service-account-private-key-file={pki.sa_key}",
                f"--cluster-signing-cert-file={pki.ca_cert}",
                f"--cluster-signing-key-file={pki.ca_key}",
                f"--service-cluster-ip-range={self.service_cluster_ip_range}",
            ]

        def scheduler_argv() -> list[str]:
            return [self._bin("kube-scheduler"), *delegated(self.scheduler_port)]

        def kwok_argv() -> list[str]:
            return [
                self._bin("kwok"),
                f"--kubeconfig={kc}",
                f"--config={wd / 'kwok.yaml'}",
                "--manage-all-nodes=false",
                f"--manage-nodes-with-annotation-selector={KWOK_ANNOTATION}={KWOK_ANNOTATION_VALUE}",
                f"--server-address=127.0.0.1:{self.kwok_port}",
                "--node-lease-duration-seconds=40",
                f"--cidr={self.pod_cidr}",
            ]

        def etcd_health() -> bool:
            body = _http_get(f"{self.etcd_url}/health")
            try:
                return body is not None and json.loads(body).get("health") == "true"
            except ValueError:
                return False

        def apiserver_health() -> bool:
            try:
                ctx = self._admin_ssl()
            except (OSError, ssl.SSLError):  # no PKI (yet)
                return False
            return _http_get(f"{self.server_url}/readyz", ctx) == "ok"

        insecure = ssl.create_default_context()
        insecure.check_hostname = False
        insecure.verify_mode = ssl.CERT_NONE  # self-signed in-memory serving certs; only /healthz is read

        kcm_url = f"https://127.0.0.1:{self.controller_manager_port}/healthz"
        sched_url = f"https://127.0.0.1:{self.scheduler_port}/healthz"
        kwok_url = f"http://127.0.0.1:{self.kwok_port}/healthz"
        hw_ready = wd / "run" / "gpu-hardware.ready"  # touched after each pass of the stand-in
        return {
            "etcd": Proc("etcd", etcd_argv, etcd_health, f"{self.etcd_url}/health",
                         ports=(self.etcd_port, self.etcd_peer_port), cwd=wd),
            "kube-apiserver": Proc("kube-apiserver", apiserver_argv, apiserver_health, f"{self.server_url}/readyz",
                                   ports=(self.apiserver_port,), cwd=wd),
            "kube-controller-manager": Proc("kube-controller-manager", kcm_argv,
                                            lambda: _http_get(kcm_url, insecure) == "ok", kcm_url,
                                            ports=(self.controller_manager_port,), cwd=wd),
            "kube-scheduler": Proc("kube-scheduler", scheduler_argv, lambda: _http_get(sched_url, insecure) == "ok",
                                   sched_url, ports=(self.scheduler_port,), cwd=wd),
            "kwok": Proc("kwok", kwok_argv, lambda: _http_get(kwok_url) == "ok", kwok_url, ports=(self.kwok_port,),
                         cwd=wd, before_start=self._release_kwok_leases),
            GPU_HARDWARE: Proc(GPU_HARDWARE, [sys.executable, "-m", "localenv.gpu_hardware_standin", f"--kubeconfig={kc}",
                                              f"--ready-file={hw_ready}"],
                               lambda: _fresh(hw_ready, 10.0), str(hw_ready), cwd=PROJECT_DIR,
                               before_start=lambda: hw_ready.unlink(missing_ok=True)),
            DCGM_EXPORTER: Proc(DCGM_EXPORTER, [sys.executable, "-m", "localenv.dcgm_exporter_standin",
                                                f"--kubeconfig={kc}", f"--port={self.dcgm_exporter_port}"],
                                lambda: _http_get(self.dcgm_exporter_url) is not None, self.dcgm_exporter_url,
                                ports=(self.dcgm_exporter_port,), cwd=PROJECT_DIR),
        }

    def _admin_ssl(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self.pki.ca_cert))
        ctx.load_cert_chain(str(self.pki.admin_cert), str(self.pki.admin_key))
        return ctx

    def _ensure(self, comps: list[Proc]) -> None:
        try:
            self.supervisor.ensure(comps)
        except SupervisorError as e:
            raise LocalKubeError(str(e)) from e

    def _release_kwok_leases(self) -> None:
        """Delete the node Leases of kwok nodes before a new kwok starts.

        kwok only drives nodes (and their pods) whose Lease it holds, and each kwok
        process has a new random identity: without this, a restarted kwok would
        wait for the previous holder's lease to expire (40s) before the existing
        fake nodes' pods move again. No kwok of ours is running at this point.
        """
        from kubernetes import client as kclient
        from kubernetes.client.rest import ApiException

        core = self.core_v1()
        leases = kclient.CoordinationV1Api(self.api_client())
        released = 0
        for node in core.list_node().items:
            if (node.metadata.annotations or {}).get(KWOK_ANNOTATION) != KWOK_ANNOTATION_VALUE:
                continue
            try:
                leases.delete_namespaced_lease(node.metadata.name, "kube-node-lease")
                released += 1
            except ApiException as e:
                if e.status != 404:
                    raise
        if released:
            self._say(f"[local] released {released} fake-node lease(s) held by a previous kwok")

    def _authorize_kubelet_client(self) -> None:
        """Let the API server's kubelet client use the kubelet API: the kubelets authorize each request by a
        SubjectAccessReview (webhook mode), and "the simplest way" the kubelet's documentation gives is to
        bind the built-in ClusterRole system:kubelet-api-admin to that user
        (https://kubernetes.io/docs/reference/access-authn-authz/kubelet-authn-authz/). Idempotent."""
        from kubernetes import client as kclient
        from kubernetes.client.rest import ApiException

        body = {
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": KUBELET_CLIENT_BINDING},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                        "name": "system:kubelet-api-admin"},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User",
                          "name": APISERVER_KUBELET_CLIENT_CN}],
        }
        try:
            kclient.RbacAuthorizationV1Api(self.api_client()).create_cluster_role_binding(body)
        except ApiException as e:
            if e.status != 409:
                raise

    def _wait_bootstrapped(self) -> None:
        """Wait for what kube-controller-manager creates that pods need (the default ServiceAccount)."""
        from kubernetes.client.rest import ApiException

        t0 = time.monotonic()
        core = self.core_v1()
        last: Exception | None = None

        def present() -> bool:
            nonlocal last
            try:
                core.read_namespaced_service_account("default", "default")
                return True
            except ApiException as e:
                last = e
                if e.status != 404:
                    raise
                return False

        try:
            wait_for("the default ServiceAccount", present, self.start_timeout, interval=0.25)
            self._say(f"[local] cluster bootstrapped: default service account present ({time.monotonic() - t0:.1f}s)")
            return
        except TimeoutError:
            pass
        raise LocalKubeError(
            f"default/default ServiceAccount not created within {self.start_timeout:.0f}s ({last}); "
            f"last lines of the kube-controller-manager log:\n"
            f"{tail(self.log_path('kube-controller-manager'))}"
        )


def _fresh(path: Path, seconds: float) -> bool:
    """`path` was touched within `seconds` (a process of ours that writes no port: its passes)."""
    try:
        return time.time() - path.stat().st_mtime < seconds
    except OSError:
        return False


def _http_get(url: str, ctx: ssl.SSLContext | None = None, timeout: float = 2.0) -> str | None:
    """Body of a 200 answer, else None (connection refused, TLS error, non-200...)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout, context=ctx) as r:  # noqa: S310 - loopback only
            return r.read().decode(errors="replace").strip() if r.status == 200 else None
    except (urllib.error.URLError, OSError, ssl.SSLError, ValueError):
        return None
