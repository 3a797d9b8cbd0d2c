"""Commands for the reconciler, the node agent, drills and on-call."""
from __future__ import annotations

import os
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Optional

import typer

from gpufleet.console import EXIT_FAILED, EXIT_INVALID, _err, app, load_spec, refuse_jwt_key
from gpufleet.fleetspec import labels
from gpufleet import local_cluster
from gpufleet.stop_signal import set_on_signals


def default_kubeconfig(stack: Optional[str]) -> Path | None:
    """For the local stack (or no stack): the running local environment's kubeconfig, else None (the
    user's default kubeconfig, or the service account in a pod)."""
    cluster = local_cluster.find() if stack in (None, "local") else None
    return cluster.kubeconfig if cluster is not None else None


def _api(kubeconfig: Optional[Path], stack: Optional[str] = None):
    from gpufleet.reconciler.app import api_client

    path = kubeconfig or default_kubeconfig(stack)
    if path is not None and not Path(path).exists():
        _err(f"no kubeconfig at {path}: is the cluster up? (`gpufleet local up` for the local one)")
        raise typer.Exit(EXIT_FAILED)
    return api_client(str(path) if path else None)


@app.command()
def reconcile(
    stack: Optional[str] = typer.Option(None, "--stack", "-s", help="Take the policy from Pulumi.<STACK>.yaml."),
    policy: Optional[Path] = typer.Option(None, "--policy", help="Policy file (fleet.json from the ConfigMap)."),
    kubeconfig: Optional[Path] = typer.Option(None, help="Kubeconfig; in a pod, the service account is used."),
    slurm: str = typer.Option("rest", help="Slurm backend: rest (slurmrestd with a JWT, as Slinky), "
                              "cli (scontrol/squeue/scancel, plain Slurm clusters) or none."),
    slurm_url: Optional[str] = typer.Option(None, help="slurmrestd URL (the stack's RestApi Service); "
                                            "locally taken from the running local environment."),
    slurm_token_secret: Optional[str] = typer.Option(None, help="A Slinky Token's Secret, NAMESPACE/NAME (key "
                                                     "SLURM_JWT) or NAMESPACE/NAME/KEY, read through the API "
                                                     "server before expiry."),
    slurm_token_file: Optional[Path] = typer.Option(None, help="File with the JWT (a Slinky Token's Secret, "
                                                    "key SLURM_JWT), re-read before expiry."),
    slurm_jwt_key_file: Optional[Path] = typer.Option(None, help="The cluster's JWT key: sign tokens here "
                                                      "instead of reading a Token's. Refused unless the spec's "
                                                      "cluster is local: whoever holds the key is any Slurm user."),
    slurm_user: Optional[str] = typer.Option(None, help="Slurm user of tokens signed from --slurm-jwt-key-file "
                                             "(default: the spec's slurm.reconciler_user, the reconciler's own)."),
    namespace: Optional[str] = typer.Option(None, help="Namespace for the Lease and Events."),
    leader_elect: bool = typer.Option(False, "--leader-elect", help="Act only while holding the Lease."),
    metrics_port: int = typer.Option(9102, help="Port for /metrics and /healthz (0: off)."),
    health_port: int = typer.Option(0, help="A port of its own for /healthz, the probes' (0: none; /healthz "
                                    "stays on the metrics port too)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Decide and log each action it would take; write, page "
                                 "and signal nothing, and take no Lease."),
    once: bool = typer.Option(False, "--once", help="One pass, then exit (for cron-style runs and tests)."),
    json_logs: bool = typer.Option(True, "--json-logs/--text-logs", help="Structured JSON logs."),
) -> None:
    """Run the self-healing controller: detect GPU faults, drain, requeue, replace from spares."""
    from gpufleet.reconciler import logs
    from gpufleet.reconciler.app import build, load_policy, slurm_client

    logs.setup(json_logs=json_logs)
    spec = load_policy(policy) if policy else load_spec(stack, None)
    # A local cluster: what its environment recorded, where no flag (or SLURM_CONF) says otherwise.
    local = local_cluster.find() if spec.cluster.kind == "local" else None
    slurm_env = local.slurm_env() if local is not None and "SLURM_CONF" not in os.environ else None
    if local is not None and slurm == "rest" and not (slurm_url or slurm_token_file or slurm_token_secret
                                                      or slurm_jwt_key_file):
        slurm_url, slurm_jwt_key_file = local.slurm_rest_url, local.slurm_jwt_key
    if slurm_jwt_key_file and spec.cluster.kind != "local":
        refuse_jwt_key(f"a {spec.cluster.kind} cluster (cluster.kind)", "--slurm-token-secret (the stack's Token)")
    api = _api(kubeconfig, stack)
    try:
        client = slurm_client(slurm, slurm_env, url=slurm_url, token_file=slurm_token_file,
                              token_secret=slurm_token_secret, api=api, jwt_key_file=slurm_jwt_key_file,
                              user=slurm_user or spec.slurm.reconciler_user)
    except ValueError as e:
        _err(str(e))
        raise typer.Exit(EXIT_FAILED)
    rec = build(spec, api, slurm=client, namespace=namespace,
                leader_elect=leader_elect, dry_run=dry_run)
    if once:
        rec.sync()
        rec.process_due()
        rec.kube.flush_events()
        return

    set_on_signals(rec.stop)  # SIGTERM sets it, never from inside the handler (a lock there can deadlock)
    try:
        rec.serve(metrics_port or None, health_port or None)
    except KeyboardInterrupt:
        rec.stop.set()


@app.command()
def agent(
    node: str = typer.Option(..., help="This node's name (the DaemonSet passes spec.nodeName)."),
    kmsg: Path = typer.Option(Path("/dev/kmsg"), help="Kernel log to follow (a file works for drills)."),
    policy: Optional[Path] = typer.Option(None, "--policy", help="The fleet spec the stack renders (fleet.json "
                                          "from the gpufleet-policy ConfigMap): its fault actions and condition. "
                                          "Without it, NVIDIA's catalogue as is (drills)."),
    condition: Optional[str] = typer.Option(None, help="Node condition to set (default: the policy's first "
                                            "condition type, else GpuHealthy)."),
    kubeconfig: Optional[Path] = typer.Option(None),
    from_start: bool = typer.Option(False, help="Read a file from its start instead of its end "
                                                "(/dev/kmsg is always read from its oldest record)."),
    max_backoff: float = typer.Option(30.0, help="Longest wait, in seconds, between retries of the API server."),
    repairs: bool = typer.Option(False, "--repairs", help="Also carry out the GPU resets and reboots the reconciler "
                                 "asks of this node (needs hostPID and root: the DaemonSet sets them when "
                                 "healing.repair is on)."),
) -> None:
    """Node agent: follow the kernel log for GPU and NVSwitch faults and report what each needs.

    A fault that takes the node out sets the GPU condition; a restart-app one is an Event on the
    node. Outlives API server outages and a node not registered yet: what must be reported waits,
    and is reported once the API answers.
    Exit 2: the kernel log or the policy cannot be read. Exit 1: the API refuses for good.
    """
    import logging
    import threading

    from gpufleet.fleetspec import SpecError
    from gpufleet.fleetspec.faults.policy import FaultPolicy
    from gpufleet.reconciler import logs
    from gpufleet.reconciler.agent.daemon import Agent, AgentFailed, KernelLog
    from gpufleet.reconciler.adapters.kube import Kube
    from gpufleet.reconciler.app import load_policy

    logs.setup()
    faults = FaultPolicy()
    if policy is not None:
        try:
            spec = load_policy(policy)
        except (OSError, ValueError, SpecError) as e:
            _err(f"cannot read the policy {policy}: {e}")
            raise typer.Exit(EXIT_INVALID)
        faults = FaultPolicy.from_spec(spec.healing)
        condition = condition or spec.healing.condition_types[0]
    logging.getLogger("urllib3.connectionpool").setLevel(logging.ERROR)  # the agent logs its own retries
    try:
        kernel_log = KernelLog(kmsg, from_start)
    except OSError as e:
        _err(f"cannot read the kernel log {kmsg}: {e.strerror or e}")
        raise typer.Exit(EXIT_INVALID)
    stop = threading.Event()
    set_on_signals(stop)  # SIGTERM sets it, never from inside the handler (a lock there can deadlock)
    kube = Kube(_api(kubeconfig), manager=labels.MANAGER_AGENT)
    ag = Agent(kube, node, kernel_log, condition=condition or "GpuHealthy", policy=faults,
               stop=stop, max_backoff=max_backoff, gpus=_gpu_indexes())
    if repairs:
        from gpufleet.reconciler.agent.repairs import Repairs

        threading.Thread(target=Repairs(kube, node).loop, args=(stop,), name="agent-repairs", daemon=True).start()
    try:
        ag.run()
    except AgentFailed as e:
        _err(f"gpufleet agent: {e}")
        raise typer.Exit(EXIT_FAILED)
    except KeyboardInterrupt:
        stop.set()


def _gpu_indexes() -> dict[str, int]:
    """The node's GPUs by PCI address -> index, from the host's nvidia-smi (as the agent's other host tools run:
    reconciler/agent/gpu_clients.py HOST); {} where there is none (the condition then names the PCI address)."""
    import subprocess

    from gpufleet.reconciler.agent.gpu_clients import HOST
    from gpufleet.reconciler.agent.sightings import gpu_indexes

    try:
        r = subprocess.run(HOST + ["nvidia-smi", "--query-gpu=index,pci.bus_id", "--format=csv,noheader"],
                           capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return {}
    return gpu_indexes(r.stdout) if r.returncode == 0 else {}


@app.command("inject-fault")
def inject_fault(
    node: str = typer.Argument(..., help="Node to fault."),
    xid: int = typer.Option(79, help="XID to report (79: GPU fallen off the bus)."),
    message: Optional[str] = typer.Option(None, help="The driver's text after the XID's meaning; default: says it "
                                          "was injected by a person."),
    pci: str = typer.Option("", help="The faulted GPU's PCI address as the driver prints it (e.g. 0000:3b:00); "
                            "default: none named (the fault is the node's)."),
    action: Optional[str] = typer.Option(None, help="What it needs (none, restart-app, diagnose, reset-gpu, "
                                         "reboot, contact-support, replace); default: the catalogue's, with the "
                                         "stack's overrides."),
    condition: str = typer.Option("GpuHealthy", help="Node condition to set."),
    kubeconfig: Optional[Path] = typer.Option(None),
    stack: Optional[str] = typer.Option(None, "--stack", "-s"),
) -> None:
    """Set the GPU fault condition on NODE, exactly as the node agent would (for demos and drills)."""
    from gpufleet.fleetspec.faults import FaultAction, Kind, describe
    from gpufleet.fleetspec.faults.condition import FaultSignal, format_message, reason_for
    from gpufleet.fleetspec.faults.policy import FaultPolicy
    from gpufleet.reconciler.errors import PermanentError, TemporaryError
    from gpufleet.reconciler.adapters.kube import Kube

    try:
        need = FaultAction(action) if action else None
    except ValueError:
        _err(f"--action {action!r}: one of {', '.join(a.value for a in FaultAction)}")
        raise typer.Exit(EXIT_INVALID)
    if need is None:
        faults = FaultPolicy.from_spec(load_spec(stack, None).healing) if stack else FaultPolicy()
        need = faults.action(Kind.XID, xid)
    reason = reason_for(Kind.XID, xid)
    if pci and (len(pci) > 16 or not set(pci) <= set("0123456789abcdefABCDEF:.")):
        _err(f"--pci {pci!r}: a PCI address as the driver prints it, e.g. 0000:3b:00")
        raise typer.Exit(EXIT_INVALID)
    # format_message puts the XID's meaning first; the text after it is the driver's, here the drill's own
    text = format_message(FaultSignal(Kind.XID, xid, need, pci), message or "injected by `gpufleet inject-fault`")
    if need is FaultAction.NONE:
        typer.echo(f"{node}: {describe(xid)} needs nothing; the agent would only log it")
        return
    kube = Kube(_api(kubeconfig, stack), manager=labels.MANAGER_INJECT_FAULT)
    try:
        if need.remediates:
            kube.set_condition(node, condition, "False", reason, text)
        else:
            kube.node_event(node, reason, text)  # the job's problem: the node stays in service
    except (TemporaryError, PermanentError) as e:
        _err(f"could not report {reason} on {node}: {e}")
        raise typer.Exit(EXIT_FAILED)
    typer.echo(f"{node}: {condition}=False reason={reason} ({text})" if need.remediates
               else f"{node}: Event {reason} ({text}); the node stays in service")


@app.command("mark-healthy")
def mark_healthy(
    node: str = typer.Argument(..., help="A repaired, quarantined node."),
    condition: str = typer.Option("GpuHealthy"),
    kubeconfig: Optional[Path] = typer.Option(None),
    stack: Optional[str] = typer.Option(None, "--stack", "-s"),
) -> None:
    """Remediation that NODE passed its GPU health check; the reconciler then returns it to the spares."""
    from gpufleet.reconciler.adapters.kube import Kube

    Kube(_api(kubeconfig, stack), manager=labels.MANAGER_INJECT_FAULT).set_condition(
        node, condition, "True", "HealthCheckPassed", "GPU health check passed")
    typer.echo(f"{node}: {condition}=True reason=HealthCheckPassed")


def _dur(seconds: float) -> str:
    return f"{seconds:.1f}s" if seconds < 120 else f"{seconds / 60:.1f}m"


def remediation_rows(records) -> list[list[str]]:
    now = datetime.now(timezone.utc)
    rows = []
    for r in sorted(records, key=lambda r: r.created):
        times = list(r.phase_times)
        steps = []
        for i, (phase, at) in enumerate(times):
            end = times[i + 1][1] if i + 1 < len(times) else (None if not r.phase.terminal else at)
            if end is not None and phase not in ("Succeeded", "Failed", "Escalated"):
                steps.append(f"{phase} {_dur((end - at).total_seconds())}")
        total = ((times[-1][1] if r.phase.terminal else now) - r.created).total_seconds()
        outcome = r.phase.value if r.phase.terminal or r.phase.value == "OptedOut" else "in progress"
        rows.append([r.node, str(r.xid), r.phase.value, r.replacement or "-", ", ".join(steps) or "-",
                     _dur(total), outcome])
    return rows


@app.command()
def remediations(
    watch: bool = typer.Option(False, "--watch", "-w", help="Refresh until interrupted."),
    kubeconfig: Optional[Path] = typer.Option(None),
    stack: Optional[str] = typer.Option(None, "--stack", "-s"),
    interval: float = typer.Option(1.0, help="Seconds between refreshes with --watch."),
) -> None:
    """List remediation records: node, XID, phase, replacement, time per phase, outcome."""
    from rich.console import Console
    from rich.live import Live
    from rich.table import Table

    from gpufleet.reconciler.errors import PermanentError, TemporaryError
    from gpufleet.reconciler.adapters.records import KubeRemediationStore

    store = KubeRemediationStore(_api(kubeconfig, stack))

    def table() -> Table:
        t = Table(title="gpufleet remediations")
        for col in ("NODE", "XID", "PHASE", "REPLACEMENT", "TIME PER PHASE", "TOTAL", "OUTCOME"):
            t.add_column(col)
        for row in remediation_rows(store.list()):
            t.add_row(*row)
        return t

    try:
        if not watch:
            Console().print(table())
            return
        with Live(table(), refresh_per_second=4) as live:
            while True:
                time.sleep(interval)
                live.update(table())
    except (TemporaryError, PermanentError) as e:
        _err(str(e))
        raise typer.Exit(EXIT_FAILED)
    except KeyboardInterrupt:
        pass


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def pulumi(ctx: typer.Context, stack: str = typer.Option("local", "--stack", "-s", help="The environment."),
           skip_preflight: bool = typer.Option(False, "--skip-preflight",
                                               help="`up` of a stack on a real cluster without `gpufleet preflight` first.")) -> None:
    """Run the pulumi CLI for a stack with gpufleet's environment (built tools, PULUMI_HOME; for `local`
    the local environment's backend, passphrase and stack configuration): `gpufleet pulumi -s local up`.
    `up` of a stack on a real cluster runs `gpufleet preflight` first and stops when the cluster lacks a
    prerequisite."""
    import os

    from gpufleet.preflight import preflight_before_up
    from gpufleet.stack import PulumiError, Stack, pulumi_binary


    try:
        binary = pulumi_binary()
    except PulumiError as e:
        _err(str(e))
        raise typer.Exit(EXIT_FAILED)
    st = Stack(stack)
    args = list(ctx.args)
    if args and args[0] not in ("stack", "login", "logout", "plugin", "version", "whoami", "about"):
        args += ["--stack", stack]
    try:
        env = st.env()
    except PulumiError as e:
        _err(str(e))
        raise typer.Exit(EXIT_INVALID)
    if ctx.args[:1] == ["up"] and not skip_preflight:
        preflight_before_up(stack)
    os.execve(binary, [binary, *args, *st.config_args(args), "--cwd", str(st.project_dir)], env)
