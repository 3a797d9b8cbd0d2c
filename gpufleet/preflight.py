"""`gpufleet preflight --stack STACK`: does a live cluster have what the stack needs before `pulumi up`?

A stack deploys onto a cluster a platform team runs; some of what it needs it does not install
itself. Each check says what it looked for, what it found and the fix:

- cert-manager's CRDs, when the Slinky operator is installed with `cert_manager: true` (the chart's
  webhook certificate is a cert-manager Issuer and Certificate, slurm-operator v1.2.1
  helm/slurm-operator/templates/cert-manager/pki.yaml);
- the Prometheus operator's PrometheusRule CRD, when `healing.prometheus_rule` ships alert rules;
- every StorageClass the stack names (shared storage, slurmctld's state, a MariaDB the stack deploys),
  or a default StorageClass where it names none;
- a GPU device plugin (NVIDIA's, or the GPU operator's) advertising `nvidia.com/gpu` on each pool's
  nodes, at least `gpus_per_node` of them;
- a load-balancer controller that honours the internal-scheme annotation, when the login Service is
  an internal LoadBalancer (the AWS Load Balancer Controller's TargetGroupBinding CRD);
- Pod Security: the Slurm namespace (NodeSet pods run slurmd privileged) and the reconciler's (its
  node agent reads the kernel log) must not enforce a level below `privileged`;
- a Slinky operator installed already: its version (gpufleet pins one release) and whether the stack's
  own install would collide with it.

`gather` reads the cluster (I/O); `evaluate` decides (pure, table-tested); exit 1 when anything is
missing. `gpufleet pulumi up` of a non-local stack runs this first.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Mapping, Optional

import typer

from gpufleet.fleetspec import labels
from gpufleet.fleetspec.models import SLINKY_RELEASE, FleetSpec, MariaDbDatabase
from gpufleet.console import EXIT_FAILED, _err, app, load_spec

GPU = "nvidia.com/gpu"
CERT_MANAGER_CRDS = ("certificates.cert-manager.io", "issuers.cert-manager.io")
PROMETHEUS_RULE_CRD = "prometheusrules.monitoring.coreos.com"
AWS_LB_CONTROLLER_CRD = "targetgroupbindings.elbv2.k8s.aws"
SLINKY_CRDS = tuple(f"{k}.slinky.slurm.net" for k in
                    ("controllers", "nodesets", "loginsets", "restapis", "accountings", "tokens"))
DEFAULT_CLASS = "storageclass.kubernetes.io/is-default-class"
PSA_ENFORCE = "pod-security.kubernetes.io/enforce"
INTERNAL_LB = {"service.beta.kubernetes.io/aws-load-balancer-scheme": "internal",
               "service.beta.kubernetes.io/aws-load-balancer-internal": "true"}


@dataclass(frozen=True)
class ClusterFacts:
    """What preflight reads of a cluster."""

    crds: Mapping[str, Mapping[str, str]] = field(default_factory=dict)  # name -> its labels
    storage_classes: Mapping[str, bool] = field(default_factory=dict)  # name -> is the default
    nodes: tuple[Mapping[str, Any], ...] = ()  # {"name", "labels", "gpus"} (allocatable nvidia.com/gpu)
    namespaces: Mapping[str, Mapping[str, str]] = field(default_factory=dict)  # name -> its labels
    slinky_operators: tuple[Mapping[str, str], ...] = ()  # {"namespace", "name", "version"}


@dataclass(frozen=True)
class Finding:
    check: str
    ok: bool
    detail: str
    fix: str = ""


def _pool_members(spec: FleetSpec, pool, nodes) -> list[Mapping[str, Any]]:
    """A pool's nodes as a cluster shows them before gpufleet labelled them: its pool label, its
    member_selector, or its Auto Scaling group's kubelet labels (a hint for this check only: membership
    itself never trusts a label a kubelet sets)."""
    selectors = [{labels.NODE_POOL: pool.name}]
    if pool.member_selector:
        selectors.append(dict(pool.member_selector))
    if pool.aws is not None and pool.aws.node_labels:
        selectors.append(dict(pool.aws.node_labels))
    return [n for n in nodes if any(all(n["labels"].get(k) == v for k, v in sel.items()) for sel in selectors)]


def storage_needs(spec: FleetSpec) -> list[tuple[str, str | None]]:
    """(what, StorageClass or None for the default) for every claim the stack or the operator makes."""
    out: list[tuple[str, str | None]] = [(f"storage {s.name}", s.storage_class) for s in spec.storage
                                         if s.storage_class is not None]
    if spec.slurm.operator.mode == "helm":
        out.append(("slurmctld's state (slurm.controller_storage)", spec.slurm.controller_storage.storage_class))
    db = spec.slurm.accounting.database
    if spec.slurm.accounting.enabled and isinstance(db, MariaDbDatabase):
        out.append(("the accounting MariaDB", db.storage_class))
    return out


def evaluate(spec: FleetSpec, facts: ClusterFacts) -> list[Finding]:
    out: list[Finding] = []
    slurm, helm = spec.slurm, spec.slurm.operator.mode == "helm"

    if helm and slurm.operator.cert_manager:
        missing = [c for c in CERT_MANAGER_CRDS if c not in facts.crds]
        out.append(Finding("cert-manager", not missing,
                           f"CRDs {missing} missing" if missing else "cert-manager's CRDs are installed",
                           "install cert-manager, or set slurm.operator.cert_manager: false (the operator's chart "
                           "then makes its own webhook certificate)"))
    if spec.healing.prometheus_rule:
        ok = PROMETHEUS_RULE_CRD in facts.crds
        out.append(Finding("prometheus-operator", ok,
                           f"CRD {PROMETHEUS_RULE_CRD} {'installed' if ok else 'missing'} (healing.prometheus_rule)",
                           "install the Prometheus operator (kube-prometheus-stack), or set healing.prometheus_rule: false"))

    default = sorted(n for n, d in facts.storage_classes.items() if d)
    for what, cls in storage_needs(spec):
        if cls is None:
            ok = bool(default)
            detail = f"{what}: no StorageClass named, default {'is ' + default[0] if ok else 'missing'}"
            fix = "mark a StorageClass default (annotation storageclass.kubernetes.io/is-default-class), or name one"
        else:
            ok = cls in facts.storage_classes
            detail = f"{what}: StorageClass {cls} {'exists' if ok else 'missing'}"
            fix = f"install the CSI driver and StorageClass {cls}, or name an existing class in the stack file"
        out.append(Finding("storage-class", ok, detail, fix))

    for pool in spec.pools:
        members = _pool_members(spec, pool, facts.nodes)
        short = [n["name"] for n in members if n["gpus"] < pool.gpus_per_node]
        if not members:
            ok, detail = False, f"pool {pool.name}: no node of the pool has joined, so no {GPU} can be seen"
        else:
            ok = not short
            detail = (f"pool {pool.name}: {len(members)} node(s) advertise {GPU} >= {pool.gpus_per_node}" if ok else
                      f"pool {pool.name}: {len(short)} of {len(members)} node(s) advertise fewer than "
                      f"{pool.gpus_per_node} {GPU}: {short[:5]}")
        out.append(Finding("gpu-device-plugin", ok, detail,
                           "install NVIDIA's device plugin or GPU operator on the GPU nodes (and let the pool's "
                           "nodes join: member_selector / aws.node_labels)"))

    login = slurm.login
    internal = any(login.service_annotations.get(k) == v for k, v in INTERNAL_LB.items())
    if login.replicas and login.service_type == "LoadBalancer" and internal:
        ok = AWS_LB_CONTROLLER_CRD in facts.crds
        out.append(Finding("load-balancer-controller", ok,
                           f"the login Service is an internal LoadBalancer; CRD {AWS_LB_CONTROLLER_CRD} "
                           f"{'installed' if ok else 'missing'}",
                           "install the AWS Load Balancer Controller (the in-tree controller would make a public "
                           "load balancer), or set slurm.login.service_type: ClusterIP"))

    for ns, why in ((slurm.namespace, "slurmd runs privileged in NodeSet pods"),
                    (spec.healing.reconciler.namespace, "the node agent reads the kernel log")):
        level = facts.namespaces.get(ns, {}).get(PSA_ENFORCE)
        ok = level in (None, "privileged")
        out.append(Finding("pod-security", ok,
                           f"namespace {ns}: enforce={level or 'unset'} ({why})" if ns in facts.namespaces else
                           f"namespace {ns}: not there yet (the stack creates it)",
                           f"label namespace {ns} {PSA_ENFORCE}=privileged (or remove the label)"))

    foreign = {c: lab for c, lab in facts.crds.items() if c in SLINKY_CRDS
               and lab.get("gpufleet.io/slinky-definitions") != "crds-only"}
    ours = [c for c, lab in facts.crds.items() if c in SLINKY_CRDS
            and lab.get("gpufleet.io/slinky-definitions") == "crds-only"]
    versions = sorted({o["version"] for o in facts.slinky_operators})
    where = ", ".join(f"{o['namespace']}/{o['name']} {o['version']}" for o in facts.slinky_operators)
    if facts.slinky_operators or foreign:
        wrong = [v for v in versions if v != SLINKY_RELEASE]
        if wrong:
            ok, detail = False, f"slurm-operator installed ({where}): gpufleet pins {SLINKY_RELEASE}"
            fix = f"upgrade it to {SLINKY_RELEASE} (charts and CRDs together), or uninstall it and let the stack install it"
        elif helm:
            ok = False
            detail = (f"slurm-operator already installed ({where or 'its CRDs: ' + ', '.join(sorted(foreign))}): the "
                      "stack's own Helm releases would collide with it")
            fix = ("uninstall it (helm uninstall; keep the CRDs only if they are 1.2.1's), or adopt it: "
                   "`pulumi import` its releases into the stack")
        else:
            ok, detail = False, f"slurm-operator installed ({where}) while slurm.operator.mode is crds-only"
            fix = "set slurm.operator.mode: helm, or uninstall it"
        out.append(Finding("slinky-operator", ok, detail, fix))
    elif ours and helm:
        out.append(Finding("slinky-operator", False, "gpufleet's own Slinky definitions (crds-only) are installed: the "
                           "operator's CRD chart would collide with them",
                           "delete the CRDs labelled gpufleet.io/slinky-definitions=crds-only (after moving the CRs), "
                           "or keep slurm.operator.mode: crds-only"))
    else:
        out.append(Finding("slinky-operator", True,
                           f"no slurm-operator installed: the stack installs {SLINKY_RELEASE}" if helm else
                           "no slurm-operator installed (crds-only: gpufleet's definitions)"))
    return out


def gather(api) -> ClusterFacts:
    """Read what `evaluate` needs (one list of each kind)."""
    from kubernetes import client

    crds = {c.metadata.name: dict(c.metadata.labels or {})
            for c in client.ApiextensionsV1Api(api).list_custom_resource_definition().items}
    classes = {s.metadata.name: (s.metadata.annotations or {}).get(DEFAULT_CLASS) == "true"
               for s in client.StorageV1Api(api).list_storage_class().items}
    nodes = tuple({"name": n.metadata.name, "labels": dict(n.metadata.labels or {}),
                   "gpus": int(str((n.status.allocatable or {}).get(GPU, "0")) or 0)}
                  for n in client.CoreV1Api(api).list_node().items)
    namespaces = {n.metadata.name: dict(n.metadata.labels or {}) for n in client.CoreV1Api(api).list_namespace().items}
    operators = []
    for d in client.AppsV1Api(api).list_deployment_for_all_namespaces(
            label_selector="app.kubernetes.io/part-of=slurm-operator").items:
        lab = d.metadata.labels or {}
        chart = lab.get("helm.sh/chart", "")
        version = chart.rsplit("-", 1)[1] if chart.startswith("slurm-operator-") else lab.get("app.kubernetes.io/version", "?")
        if lab.get("app.kubernetes.io/name", "").endswith("webhook"):
            continue
        operators.append({"namespace": d.metadata.namespace, "name": d.metadata.name, "version": version})
    return ClusterFacts(crds, classes, nodes, namespaces, tuple(operators))


def run_preflight(spec: FleetSpec, kubeconfig: Path, context: str | None) -> list[Finding]:
    from gpufleet.reconciler.app import api_client

    return evaluate(spec, gather(api_client(str(kubeconfig), context)))


def cluster_of(spec: FleetSpec, kubeconfig: Optional[Path]) -> tuple[Path, str | None]:
    """--kubeconfig, else the running local environment's (a local stack), else the spec's kubeconfig and context."""
    from gpufleet import local_cluster

    if kubeconfig is not None:
        return kubeconfig, None
    if spec.cluster.kind == "local":
        local = local_cluster.find()
        return (Path(local.kubeconfig) if local else Path("/nonexistent/no-local-environment-is-up")), None
    return Path(spec.cluster.kubeconfig or "~/.kube/config").expanduser(), spec.cluster.context


def preflight_before_up(stack: str) -> None:
    """What `gpufleet pulumi up` runs first for a stack on a real cluster (a local one is made by
    `gpufleet local up`): exit 1, `pulumi up` not run, when the cluster lacks a prerequisite."""
    spec = load_spec(stack, None)
    if spec.cluster.kind == "local":
        return
    path, context = cluster_of(spec, None)
    typer.echo(f"preflight of stack {stack} (gpufleet preflight -s {stack}; --skip-preflight to go on without):")
    try:
        ok = report(run_preflight(spec, path, context))
    except Exception as e:  # noqa: BLE001 - an unreachable cluster stops `up` as clearly as a missing prerequisite
        _err(f"preflight: cluster unreachable or refusing ({path}): {e}")
        raise typer.Exit(EXIT_FAILED)
    if not ok:
        _err(f"stack {stack}: the cluster lacks what the stack needs (above); `pulumi up` not run")
        raise typer.Exit(EXIT_FAILED)


def report(findings: list[Finding], out=typer.echo) -> bool:
    for f in findings:
        out(f"{'ok     ' if f.ok else 'MISSING'}  {f.check:26} {f.detail}")
        if not f.ok and f.fix:
            out(f"{'':9}{'':26} fix: {f.fix}")
    missing = sum(not f.ok for f in findings)
    out(f"{len(findings) - missing} of {len(findings)} checks passed" + (f"; {missing} missing" if missing else ""))
    return not missing


@app.command()
def preflight(
    stack: str = typer.Option("local", "--stack", "-s", help="Pulumi.<STACK>.yaml: what the stack needs."),
    kubeconfig: Optional[Path] = typer.Option(None, help="Kubeconfig; default: the stack's cluster.kubeconfig and "
                                              "context (the local cluster's for a local stack)."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
) -> None:
    """Check a live cluster for what the stack needs and does not install (cert-manager, the Prometheus
    operator, StorageClasses, a GPU device plugin, a load-balancer controller, Pod Security, an existing
    Slinky operator). Exit 1 when anything is missing."""
    spec = load_spec(stack, None)
    path, context = cluster_of(spec, kubeconfig)
    if not path.exists():
        _err(f"cluster unreachable: no kubeconfig at {path}")
        raise typer.Exit(EXIT_FAILED)
    try:
        findings = run_preflight(spec, path, context)
    except Exception as e:  # noqa: BLE001 - an unreachable or forbidding cluster is said as such
        _err(f"cluster unreachable or refusing ({path}{', context ' + context if context else ''}): {e}")
        raise typer.Exit(EXIT_FAILED)
    if as_json:
        typer.echo(json.dumps({"stack": stack, "ok": all(f.ok for f in findings),
                               "findings": [asdict(f) for f in findings]}, indent=2))
        ok = all(f.ok for f in findings)
    else:
        typer.echo(f"preflight of stack {stack} against {path}{', context ' + context if context else ''}:")
        ok = report(findings)
    if not ok:
        raise typer.Exit(EXIT_FAILED)
