"""Real kubelet nodes of the local environment: the system pool, where the stack's reconciler runs as pods.

Each node is a kubelet (built from the same k8s.io/kubernetes module as the control plane) with a
containerd of its own (Debian's): root, state, socket, runc state, CNI configuration and cgroup root
all in ``<root>/nodes/<name>/`` and ``/sys/fs/cgroup/*/gf-<env hash>-<name>``, so two nodes and the host
never see each other's containers. gpufleet's images (scripts/build-images.sh) are imported into it,
the pause image included: nothing is pulled. The nodes register with ``gpufleet.io/role=system`` and no kwok
annotation, so kwok (which manages only annotated nodes) leaves them alone; once Ready, the environment
gives them the system mark (``node-restriction.kubernetes.io/gpufleet-system``) as a platform would: no
kubelet may set it on itself.

Measured on this machine kind (Debian 12, root without CAP_SYS_RESOURCE, cgroup v1 hybrid):
* containerd must not lower a pod's oom_score_adj (``restrict_oom_score_adj = true``);
* the kubelet needs ``oomScoreAdj: 0`` and ``failCgroupV1: false``; it runs with the
  ``KubeletInUserNamespace`` feature gate, which turns failing oom_score_adj / rlimit / sysctl writes
  into warnings (a node became Ready without the gate too: a safety margin, not a necessity);
* pods use their node's network (hostNetwork): no pod network is set up; the CNI configuration is a
  loopback-only network so that the runtime reports its network ready. Probes name ``host: 127.0.0.1``.

Each node has a network namespace of its own (:mod:`localenv.netns`: its own loopback, so the
two reconciler replicas can both bind the metrics port, as on two machines), where the API server
answers on 127.0.0.1 through :mod:`localenv.loopback_bridge`. The local environment runs one
node per reconciler replica.

The node serves the API server what a real node does (``kubectl logs``, ``exec``, ``port-forward`` go
API server -> kubelet): its kubelet listens on the node's address, the one end of the node's link to the
host (a veth pair, :class:`localenv.netns.Link`), with a serving certificate from the cluster CA for that
address, which the API server verifies (``--kubelet-certificate-authority``); it takes client
certificates from the same CA, no anonymous requests, and asks the API server by SubjectAccessReview
whether each caller may (webhook authentication and authorization, as kubeadm configures a kubelet:
cmd/kubeadm/app/componentconfigs/kubelet.go, v1.34.4). A log shipper (:mod:`localenv.log_shipper`)
copies the node's container logs to the environment's ``logs/pods/``, so a deleted pod's lines remain.
"""
from __future__ import annotations


import base64
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from gpufleet.fleetspec import labels
from gpufleet.waiting import wait_for

from localenv import netns
from localenv.certs import ensure_client_cert, ensure_serving_cert
from localenv.images import BuiltImages
from localenv.control_plane import LocalKube, _http_get
from localenv.ports import port_free
from localenv.supervisor import Proc, Supervisor, SupervisorError, deaf_to_sigterm, tail

CGROUP_V1 = Path("/sys/fs/cgroup")
CNI_BIN_DIR = Path("/usr/lib/cni")  # Debian's containernetworking-plugins
NAMESPACE = "k8s.io"  # containerd's namespace for CRI


class NodeError(SupervisorError):
    """A kubelet node failed to start or to become Ready."""


@dataclass
class KubeletNode:
    """One kubelet node: containerd + kubelet, supervised, in ``workdir``."""

    name: str
    workdir: Path
    kube: LocalKube
    images: BuiltImages | None  # needed to start it, not to stop it
    supervisor: Supervisor
    link: netns.Link  # to the host: the kubelet listens on and reports its node end
    bin_dir: Path
    kubelet_port: int = 10250  # inside the node's namespace
    healthz_port: int = 10248
    node_labels: dict[str, str] = field(default_factory=lambda: {labels.ROLE: labels.ROLE_SYSTEM})
    progress: Callable[[str], None] | None = None
    relay_ports: tuple[int, ...] = ()  # more host loopback ports its pods reach (slurmrestd)
    log_archive: Path | None = None  # where its log shipper copies the container logs (None: no shipper)

    # ------------------------------------------------------------------ paths
    @property
    def address(self) -> str:
        """The node's InternalIP: what the API server dials to reach its kubelet."""
        return self.link.node_address

    @property
    def socket(self) -> Path:
        return self.workdir / "containerd" / "containerd.sock"

    @property
    def cgroup_root(self) -> str:
        """Unique per environment and node: a kubelet kills every process in a pod cgroup under its root
        that it does not know, so two environments on one host must never share one (found the hard way:
        two environments' kubelets SIGKILLed each other's containers within a second of their start)."""
        return f"/{self.netns}"

    @property
    def pod_logs(self) -> Path:
        return self.workdir / "pod-logs"

    @property
    def netns(self) -> str:
        return netns.name_for(self.workdir.parent, self.name)

    @property
    def bridge_name(self) -> str:
        return f"bridge-{self.name}"

    @property
    def containerd_name(self) -> str:
        return f"containerd-{self.name}"

    @property
    def kubelet_name(self) -> str:
        return f"kubelet-{self.name}"

    @property
    def shipper_name(self) -> str:
        return f"log-shipper-{self.name}"

    # ------------------------------------------------------------------ processes
    def procs(self) -> tuple[Proc, ...]:
        env = {**os.environ, "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
        ns = netns.prefix(self.netns)
        api_port = self.kube.apiserver_port
        bridge = Proc(self.bridge_name,
                      [sys.executable, "-m", "localenv.loopback_bridge", "--netns", self.netns,
                       "--port", str(api_port), *(a for p in self.relay_ports for a in ("--port", str(p)))],
                      lambda: netns.run_in(self.netns, lambda: not port_free(api_port)),
                      f"127.0.0.1:{api_port} in netns {self.netns}", env=env, cwd=self.workdir)
        # Not a subreaper: containerd does not reap the shims it would adopt (they pile up as zombies).
        containerd = Proc(self.containerd_name, [*ns, "containerd", "--config", str(self.workdir / "containerd.toml")],
                          self._containerd_healthy, f"unix://{self.socket}", env=env, cwd=self.workdir)
        healthz = f"http://127.0.0.1:{self.healthz_port}/healthz"
        kubelet = Proc(self.kubelet_name, lambda: [*ns, *self._kubelet_argv()],
                       lambda: netns.run_in(self.netns, lambda: _http_get(healthz) == "ok"),
                       f"{healthz} in netns {self.netns}", env=env, cwd=self.workdir)
        if self.log_archive is None:
            return bridge, containerd, kubelet
        shipper = Proc(self.shipper_name, [sys.executable, "-m", "localenv.log_shipper", "--source",
                                           str(self.pod_logs), "--dest", str(self.log_archive)],
                       lambda: True, env=env, cwd=self.workdir)  # it runs: the supervisor checks that
        return bridge, containerd, kubelet, shipper

    def up(self) -> None:
        self.start_runtime()
        self.import_images()
        self.start_kubelet()

    def start_runtime(self) -> None:
        """Its network namespace, the loopback bridge, containerd and the log shipper: what the images are
        imported into before the kubelet starts."""
        if self.images is None:
            raise NodeError(f"{self.name}: no images to start it with (run scripts/build-images.sh)")
        bridge, containerd, _, *shipper = self.procs()
        self._write_config()
        self._ensure_cgroup_root()
        netns.ensure(self.netns, self.link)
        self.supervisor.ensure([bridge, containerd, *shipper])

    def start_kubelet(self) -> None:
        self.supervisor.ensure([self.procs()[2]])

    def down(self) -> None:
        # The kubelet first (it would restart what containerd stops), then containerd, then its shims
        # (daemons of their own, named by this containerd's socket) and the containers under them.
        self.supervisor.stop([self.kubelet_name])
        self.supervisor.stop([self.containerd_name], timeout=20)
        self._stop_shims()
        self.supervisor.stop([self.bridge_name])
        # The shipper last, once no container writes any more (it copies what is left when it stops).
        self.supervisor.stop([self.shipper_name])
        netns.delete(self.netns, self.link)
        unmount_under(self.workdir)

    def _stop_shims(self, timeout: float = 10.0) -> None:
        import psutil

        address = str(self.socket)
        shims = []
        for p in psutil.process_iter(["cmdline"]):
            argv = p.info["cmdline"] or []
            if argv and argv[0].endswith("containerd-shim-runc-v2") and address in argv:
                shims.append(p)
        procs = shims + [c for p in shims for c in p.children(recursive=True)]
        for p in procs:
            try:
                # A pod sandbox's process (the pause image's `sleep infinity`) is its pid namespace's init with no
                # SIGTERM handler: a SIGTERM never reaches it, so it gets the SIGKILL that containerd's
                # StopPodSandbox sends it (containerd v1.7.29 pkg/cri/server/sandbox_stop.go) now, not after
                # `timeout`; the containers' processes get their SIGTERM.
                p.kill() if deaf_to_sigterm(p.pid) else p.terminate()
            except psutil.NoSuchProcess:
                pass
        _, alive = psutil.wait_procs(procs, timeout=timeout)
        for p in alive:
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(alive, timeout=5)
        if procs:
            self._say(f"{self.name}: stopped {len(shims)} shim(s) and {len(procs) - len(shims)} container process(es)")

    def status(self) -> dict:
        return {name: self.supervisor.status(p)
                for name, p in zip(("bridge", "containerd", "kubelet", "log-shipper"), self.procs())}

    def ctr(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run(["ctr", "--address", str(self.socket), "--namespace", NAMESPACE, *args],
                              capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)

    def import_images(self) -> None:
        """Import the built images (skipping those already there) under their tag and their digest
        reference, the names the kubelet asks the runtime for."""
        have = set(self.ctr("images", "ls", "-q").stdout.split())
        for img in self.images.all():
            if img.reference in have and img.tagged in have:
                continue
            t0 = time.monotonic()
            r = self.ctr("images", "import", "--all-platforms", str(img.archive), timeout=600)
            if r.returncode != 0:
                raise NodeError(f"{self.name}: ctr images import {img.archive} failed: {r.stderr.strip()}")
            r = self.ctr("images", "tag", "--force", img.tagged, img.reference)
            if r.returncode != 0:
                raise NodeError(f"{self.name}: ctr images tag {img.tagged} {img.reference} failed: {r.stderr.strip()}")
            self._say(f"{self.name}: imported {img.reference} ({time.monotonic() - t0:.1f}s)")

    # ------------------------------------------------------------------ configuration
    def _containerd_healthy(self) -> bool:
        if not self.socket.exists():
            return False
        try:
            return subprocess.run(["ctr", "--address", str(self.socket), "version"], capture_output=True,
                                  timeout=5).returncode == 0
        except subprocess.TimeoutExpired:
            return False

    def _write_config(self) -> None:
        wd = self.workdir
        for sub in ("containerd", "cni", "kubelet", "pod-logs"):
            (wd / sub).mkdir(parents=True, exist_ok=True)
        ctd = wd / "containerd"
        disabled = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
                    "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs",
                    "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]
        cri = 'plugins."io.containerd.grpc.v1.cri"'
        (wd / "containerd.toml").write_text(f'''# Written by localenv/node.py: this node's own containerd.
version = 2
root = "{ctd / 'root'}"
state = "{ctd / 'state'}"
disabled_plugins = {json.dumps(disabled)}
[grpc]
  address = "{self.socket}"
[ttrpc]
  address = "{self.socket}.ttrpc"
[debug]
  address = ""
[metrics]
  address = ""
[plugins."io.containerd.internal.v1.opt"]
  path = "{ctd / 'opt'}"
[{cri}]
  sandbox_image = "{self.images.pause.tagged}"
  # A pod's oom_score_adj of -998 needs CAP_SYS_RESOURCE, which this host does not give.
  restrict_oom_score_adj = true
  disable_apparmor = true
  [{cri}.containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [{cri}.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [{cri}.containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = "{ctd / 'runc'}"
  [{cri}.cni]
    bin_dir = "{CNI_BIN_DIR}"
    conf_dir = "{wd / 'cni'}"
''')
        # Only hostNetwork pods run here; a loopback network makes the runtime report its network ready.
        (wd / "cni" / "10-gpufleet-loopback.conflist").write_text(json.dumps({
            "cniVersion": "1.0.0", "name": "gpufleet-hostnetwork-only",
            "plugins": [{"type": "loopback"}]}, indent=2))

        pki = self.kube.pki
        cert, key = ensure_client_cert(pki, f"kubelet-{self.name}", f"system:node:{self.name}", "system:nodes")
        b64 = lambda p: base64.b64encode(Path(p).read_bytes()).decode()  # noqa: E731
        kubeconfig = {
            "apiVersion": "v1", "kind": "Config", "current-context": "node",
            "clusters": [{"name": "local", "cluster": {"server": self.kube.server_url,
                                                        "certificate-authority-data": b64(pki.ca_cert)}}],
            "users": [{"name": "node", "user": {"client-certificate-data": b64(cert), "client-key-data": b64(key)}}],
            "contexts": [{"name": "node", "context": {"cluster": "local", "user": "node"}}],
        }
        _write_private(wd / "kubelet" / "kubeconfig", yaml.safe_dump(kubeconfig))
        # Its HTTPS server's certificate, for the address the API server dials (kubeadm leaves it
        # self-signed and the API server unverifying; here the API server verifies it).
        serving_cert, serving_key = ensure_serving_cert(
            pki, f"kubelet-{self.name}-serving", f"system:node:{self.name}", "system:nodes",
            dns=(self.name,), ips=(self.address,))
        config = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
            "address": self.address, "port": self.kubelet_port, "readOnlyPort": 0,
            "tlsCertFile": str(serving_cert), "tlsPrivateKeyFile": str(serving_key),
            "healthzBindAddress": "127.0.0.1", "healthzPort": self.healthz_port,
            # As kubeadm sets a kubelet up (cmd/kubeadm/app/componentconfigs/kubelet.go, v1.34.4): client
            # certificates from the cluster CA, no anonymous requests, bearer tokens by TokenReview, and
            # every request authorized by a SubjectAccessReview to the API server.
            "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": True},
                               "x509": {"clientCAFile": str(pki.ca_cert)}},
            "authorization": {"mode": "Webhook"},
            "containerRuntimeEndpoint": f"unix://{self.socket}",
            "cgroupDriver": "cgroupfs", "cgroupRoot": self.cgroup_root, "cgroupsPerQOS": True,
            "failCgroupV1": False, "failSwapOn": False,
            # This host: root without CAP_SYS_RESOURCE. The gate makes the kubelet tolerate the
            # oom_score_adj, rlimit and sysctl writes it is not allowed to make.
            "featureGates": {"KubeletInUserNamespace": True},
            "oomScoreAdj": 0, "localStorageCapacityIsolation": False, "protectKernelDefaults": False,
            "makeIPTablesUtilChains": False, "kernelMemcgNotification": False,
            # Never garbage-collect the imported images (they cannot be pulled again), never evict
            # for a disk shared with everything else on this machine.
            "imageGCHighThresholdPercent": 100, "imageGCLowThresholdPercent": 99,
            "evictionHard": {"memory.available": "100Mi", "nodefs.available": "1%", "imagefs.available": "1%",
                             "nodefs.inodesFree": "1%"},
            "podLogsDir": str(self.pod_logs), "maxPods": 20, "resolvConf": "/etc/resolv.conf",
            "shutdownGracePeriod": "0s", "serializeImagePulls": True,
            "nodeStatusUpdateFrequency": "5s", "syncFrequency": "10s",
        }
        (wd / "kubelet" / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))

    def _kubelet_argv(self) -> list[str]:
        wd = self.workdir / "kubelet"
        return [
            str(self.bin_dir / "kubelet"),
            f"--config={wd / 'config.yaml'}",
            f"--kubeconfig={wd / 'kubeconfig'}",
            f"--root-dir={wd / 'root'}",
            f"--cert-dir={wd / 'pki'}",
            f"--hostname-override={self.name}",
            f"--node-ip={self.address}",
            "--node-labels=" + ",".join(f"{k}={v}" for k, v in self.node_labels.items()),
            "--v=1",
        ]

    def _ensure_cgroup_root(self) -> None:
        """The kubelet wants its cgroup root to exist in every v1 hierarchy (cpuset: with cpus and mems)."""
        if not (CGROUP_V1 / "memory").is_dir():
            return
        for ctrl in sorted(p for p in CGROUP_V1.iterdir() if p.is_dir() and p.name != "unified"):
            d = ctrl / self.cgroup_root.lstrip("/")
            d.mkdir(exist_ok=True)
            if ctrl.name == "cpuset":
                for f in ("cpuset.cpus", "cpuset.mems"):
                    if not (d / f).read_text().strip():
                        (d / f).write_text((ctrl / f).read_text())

    def _say(self, msg: str) -> None:
        if self.progress is not None:
            self.progress(f"[local] {msg}")


def unmount_under(folder: Path) -> None:
    """Unmount what the kubelet and containerd left mounted in the node's folder (the kubelet's root
    bind mount, volumes, sandbox shm), deepest first, so the folder can be removed."""
    folder = Path(folder).resolve()
    points = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        mp = line.split()[4].replace("\\040", " ")
        if mp == str(folder) or mp.startswith(f"{folder}/"):
            points.append(mp)
    for mp in sorted(set(points), key=len, reverse=True):
        subprocess.run(["umount", "-l", mp], capture_output=True, timeout=30)


def _write_private(path: Path, text: str) -> None:
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


@dataclass
class SystemNodes:
    """The local environment's real nodes (``system-0``, ``system-1``, ...), one per reconciler replica."""

    root: Path
    kube: LocalKube
    count: int
    bin_dir: Path
    progress: Callable[[str], None] | None = None
    images: BuiltImages | None = None
    start_timeout: float = 120.0
    relay_ports: tuple[int, ...] = ()  # host loopback ports the pods reach besides the API server's
    log_archive: Path | None = None  # where the nodes' log shippers copy container logs (None: none run)

    def __post_init__(self) -> None:
        self.root = Path(self.root)
        self.supervisor = Supervisor(self.root / "run", self.root / "logs", self.start_timeout, 15.0,
                                     progress=lambda line: self.progress and self.progress(line))

    @property
    def names(self) -> list[str]:
        """The configured nodes, and any left from an environment that had more (so down() stops them)."""
        names = [f"system-{i}" for i in range(self.count)]
        if self.root.is_dir():
            names += sorted(p.name for p in self.root.glob("system-*") if p.is_dir() and p.name not in names)
        return names

    def nodes(self) -> list[KubeletNode]:
        return [KubeletNode(name, self.root / name, self.kube, self.images, self.supervisor,
                            netns.link_for(self.root, int(name.rsplit('-', 1)[1])), self.bin_dir,
                            progress=self.progress, relay_ports=self.relay_ports, log_archive=self.log_archive)
                for name in self.names]

    def up(self, timeout: float = 180.0) -> None:
        """Start every node and wait until each is Ready in the API server."""
        if not self.count:
            return
        t0 = time.monotonic()
        if not os.access(self.bin_dir / "kubelet", os.X_OK):
            raise NodeError(f"no kubelet in {self.bin_dir} (build it with scripts/build-kube.sh)")
        if shutil.which("containerd") is None:
            raise NodeError("containerd is missing: run scripts/install-containers.sh")
        if self.images is None:
            from localenv.images import ImagesError, build

            if self.progress:
                self.progress("[local] images: scripts/build-images.sh (seconds when this tree's images are built)")
            try:
                self.images = build()
            except ImagesError as e:
                raise NodeError(str(e)) from e
        nodes = self.nodes()[: self.count]
        try:
            for node in nodes:
                node.start_runtime()
            # Each node's containerd imports the images at the same time (about 12 s a node, one after the other):
            # separate daemons and stores, one `ctr` process each; the first error is raised here.
            with ThreadPoolExecutor(max_workers=len(nodes) or 1) as pool:
                list(pool.map(KubeletNode.import_images, nodes))
            for node in nodes:
                node.start_kubelet()
        except SupervisorError as e:
            raise NodeError(str(e)) from e
        for node in nodes:
            self.wait_ready(node, timeout - (time.monotonic() - t0))
            self.mark_system(node)
        if self.progress:
            self.progress(f"[local] kubelet nodes Ready: {', '.join(self.names)} ({time.monotonic() - t0:.1f}s)")

    def mark_system(self, node: KubeletNode) -> None:
        """What the platform does for a system node once it registered: the system mark, a label no kubelet
        may set on itself (NodeRestriction; labels.SYSTEM_NODE), set here as the cluster's admin."""
        self.kube.core_v1().patch_node(node.name, {"metadata": {"labels": {labels.SYSTEM_NODE: "true"}}})

    def wait_ready(self, node: KubeletNode, timeout: float) -> None:
        from kubernetes.client.exceptions import ApiException

        core = self.kube.core_v1()
        conds: list = []

        def ready() -> bool:
            nonlocal conds
            try:
                n = core.read_node(node.name)
            except ApiException as e:
                if e.status != 404:
                    raise
                return False
            conds = [(c.type, c.status, c.reason) for c in (n.status.conditions or [])]
            return ("Ready", "True") in [(t, s) for t, s, _ in conds]

        try:
            wait_for(f"node {node.name} Ready", ready, max(timeout, 5), interval=0.5)
        except TimeoutError:
            raise NodeError(f"node {node.name} did not become Ready within {timeout:.0f}s (conditions: {conds}); "
                            f"last lines of {self.supervisor.log_path(node.kubelet_name)}:\n"
                            f"{tail(self.supervisor.log_path(node.kubelet_name), 30)}") from None

    def down(self) -> None:
        for node in self.nodes():
            node.down()
        netns.release_block(str(netns.env_block(self.root)))

    def status(self) -> dict:
        procs = ("bridge", "containerd", "kubelet") + (("log-shipper",) if self.log_archive else ())
        out = {}
        for n in self.names:
            out[n] = {p: {"pid": self.supervisor.pid(f"{p}-{n}"), "log": str(self.supervisor.log_path(f"{p}-{n}"))}
                      for p in procs}
        return out
