"""`gpufleet why JOBID`: a Slurm job's story, for the ML engineer who asks "why was my job requeued?".

Gathers what Slurm and Kubernetes know (the job from slurmrestd, the Slurm nodes' operator comments for
their Kubernetes nodes, the remediations, the GPU conditions and Events of those nodes, the lending ledger,
the lending pass's reclaim Events and the reclaims under way on the nodes) and hands it to
the pure `gpufleet.reconciler.core.job_story`. Accounting (slurmdbd) is not read: the story has what slurmctld
still remembers (an ended job for MinJobAge), and gpufleet's records for the rest.
"""
from __future__ import annotations

import json
import os
import re
from datetime import datetime, timezone
from pathlib import Path
from typing import Optional

import typer

from gpufleet import local_cluster
from gpufleet.console import EXIT_FAILED, _err, app, refuse_jwt_key

XID = re.compile(r"\bxid\s*(\d+)", re.IGNORECASE)


def job_facts(j, source: str = "slurmctld"):
    """A SlurmJob (adapters) as the story's JobFacts (core); `source`: slurmctld, or accounting."""
    from gpufleet.reconciler.adapters.slurm.job_facts import job_facts as facts

    return facts(j, source)


def accounted(slurm, job_id: int):
    """The job as accounting recorded it (slurmrestd's slurmdb API), where the client reads accounting; None
    when it has no record, or no accounting runs (slurmrestd then answers with slurmdbd's error)."""
    from gpufleet.reconciler.adapters.slurm import SlurmError

    read = getattr(slurm, "accounted_job", None)
    if read is None:
        return None
    try:
        return read(job_id)
    except SlurmError as e:
        if e.temporary:
            raise
        return None


def kube_node_of(comment: str) -> str | None:
    """The Kubernetes node in the JSON Slinky's operator writes into a Slurm node's comment."""
    try:
        node = json.loads(comment).get("node") if comment else None
    except (ValueError, AttributeError):
        return None
    return node if isinstance(node, str) and node else None


def slurm_hosts(api, slurm_namespace: str) -> dict[str, str]:
    """Slurm node -> Kubernetes node, from the NodeSet pods of Slinky's namespace only (their hostname label,
    where they run; only pods a NodeSet controls, as the reconciler reads them: observe.pod_view): a pod in a
    tenant's namespace that claims to be a NodeSet's points the story nowhere."""
    from kubernetes import client

    from gpufleet.fleetspec import labels
    from gpufleet.reconciler.core.observe import nodeset_owner

    pods = client.CoreV1Api(api).list_namespaced_pod(slurm_namespace, label_selector=labels.SLINKY_POD_HOSTNAME).items
    return {p.metadata.labels[labels.SLINKY_POD_HOSTNAME]: p.spec.node_name for p in pods if p.spec.node_name
            and nodeset_owner(api.sanitize_for_serialization(p.metadata))}


def node_faults(api, nodes: set[str]) -> list:
    """The GPU faults seen on these Kubernetes nodes: each condition whose reason names an XID, and each
    Event the node agent wrote on the node that names one (job_story.agent_event)."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    from gpufleet.reconciler.core.job_story import NodeFault, agent_event

    core, out = client.CoreV1Api(api), []
    for name in sorted(nodes):
        try:
            node = core.read_node(name)
        except ApiException as e:
            if e.status == 404:
                continue
            raise
        for c in node.status.conditions or []:
            m = XID.search(c.reason or "")
            if m and c.status == "False" and c.last_transition_time:
                out.append(NodeFault(name, c.last_transition_time, int(m.group(1)), c.message or ""))
        events = core.list_namespaced_event("default", field_selector=f"involvedObject.kind=Node,involvedObject.name={name}")
        for e in events.items:
            if not agent_event(name, e.source.component if e.source else None, e.source.host if e.source else None):
                continue
            m = XID.search(f"{e.reason} {e.message}")
            at = e.last_timestamp or e.event_time or e.first_timestamp
            if m and at:
                out.append(NodeFault(name, at, int(m.group(1)), e.message or ""))
    return out


RECLAIM_EVENTS = frozenset({"Reclaiming", "ReclaimForced", "Reclaimed"})  # reconciler/runtime/executor.py


def lending_records(api, namespace: str) -> tuple[dict, list, dict[str, tuple[str, datetime]], dict[str, str]]:
    """The lending ledger (per pool; {} without one), the lending pass's reclaim Events on nodes, the
    reclaims under way (node -> its pool, when it began) and every node's pool."""
    from kubernetes import client

    from gpufleet.fleetspec import labels
    from gpufleet.fleetspec.ledger import LedgerError, parse_data
    from gpufleet.reconciler.adapters.kube import Kube
    from gpufleet.reconciler.core.job_story import LendingEvent
    from gpufleet.reconciler.core.observe import parse_time
    from gpufleet.reconciler.errors import PermanentError, TemporaryError

    kube = Kube(api)
    try:  # one who may not read the reconciler's namespace still gets the story, with the Events' reclaims
        ledgers = parse_data(kube.read_ledger(namespace))
    except (LedgerError, PermanentError, TemporaryError) as e:
        _err(f"{namespace}/{labels.LENDING_LEDGER}: {e}; reclaims are told from the Events alone")
        ledgers = {}
    events = []
    for e in client.CoreV1Api(api).list_namespaced_event("default", field_selector="involvedObject.kind=Node").items:
        at = e.last_timestamp or e.event_time or e.first_timestamp
        if e.reason in RECLAIM_EVENTS and at:
            events.append(LendingEvent(e.involved_object.name, at, e.reason, e.message or ""))
    pools, under_way = {}, {}
    for n in kube.list_nodes()[0]:
        meta = n["metadata"]
        pool = (meta.get("labels") or {}).get(labels.NODE_POOL, "")
        pools[meta["name"]] = pool
        since = (meta.get("annotations") or {}).get(labels.RECLAIMING)
        try:
            if since:
                under_way[meta["name"]] = (pool, parse_time(since))
        except ValueError:
            continue
    return ledgers, events, under_way, pools


def _slurm_namespace(stack: Optional[str]) -> str:
    """Slinky's namespace as the stack's spec declares it (slurm.namespace); its default where no spec reads."""
    from gpufleet.fleetspec import SpecError, load_stack_file, stack_file
    from gpufleet.fleetspec.models import SlurmSpec

    try:
        return load_stack_file(stack_file(stack or "local", Path("."))).fleet.slurm.namespace
    except (SpecError, OSError):
        return SlurmSpec.model_fields["namespace"].default


def _engineer(kubeconfig: Optional[Path], stack: Optional[str], jwt_key: Optional[Path]) -> bool:
    """Whether this is an engineer's shell: no Kubernetes credentials anywhere (no --kubeconfig, KUBECONFIG,
    ~/.kube/config, service account or local environment), or a Slurm token of their own in SLURM_JWT."""
    if kubeconfig is not None or jwt_key is not None:
        return False
    if os.environ.get("SLURM_JWT"):
        return True
    if os.environ.get("KUBECONFIG") or (Path.home() / ".kube" / "config").exists():
        return False
    if Path("/var/run/secrets/kubernetes.io/serviceaccount/token").exists():
        return False
    return stack not in (None, "local") or local_cluster.find() is None


def _why_login(job_id: int, as_json: bool, slurm_url: Optional[str], token_file: Optional[Path],
               scontrol: str) -> None:
    """The engineer's story from Slurm alone: the job as Slurm shows this user, gpufleet's records in its admin
    comment (reconciler/core/job_record.py), told by reconciler/core/engineer_story.py."""
    from gpufleet.reconciler.adapters.slurm import SlurmError
    from gpufleet.reconciler.adapters.slurm.job_facts import job_facts as facts_of
    from gpufleet.reconciler.adapters.slurm.rest import GivenToken, SlurmREST, TokenFile
    from gpufleet.reconciler.adapters.slurm.scontrol_json import ScontrolJobs
    from gpufleet.reconciler.core import engineer_story, job_notes, job_record

    token = os.environ.get("SLURM_JWT", "")
    if slurm_url:
        if token_file is None and not token:
            _err("--slurm-url needs your token: `export $(scontrol token)` (SLURM_JWT) or --slurm-token-file")
            raise typer.Exit(EXIT_FAILED)
        reader = SlurmREST(slurm_url, TokenFile(token_file) if token_file else GivenToken(token), timeout=10)
    else:
        reader = ScontrolJobs(scontrol)
    try:
        found = reader.job(job_id)
    except SlurmError as e:
        _err(f"gpufleet why {job_id}: {e}")
        raise typer.Exit(EXIT_FAILED)
    facts = facts_of(found) if found is not None else None
    comment = facts.admin_comment if facts else ""
    records = job_record.records_in(comment, job_notes.SEPARATOR)
    s = engineer_story.tell(job_id, facts, records, datetime.now(timezone.utc))
    if as_json:
        typer.echo(json.dumps(s.to_json(), indent=2))
    else:
        lines = [x for x in comment.split(job_notes.SEPARATOR) if x.startswith(f"{job_notes.PREFIX} 20")]
        typer.echo(engineer_story.render(s, lines))
    if facts is None:
        raise typer.Exit(EXIT_FAILED)


@app.command()
def why(
    job_id: int = typer.Argument(..., help="The Slurm job id."),
    as_json: bool = typer.Option(False, "--json", help="The story as JSON, for machines."),
    stack: Optional[str] = typer.Option(None, "--stack", "-s", help="The environment (default: the local one)."),
    kubeconfig: Optional[Path] = typer.Option(None, help="Kubeconfig (default: the local environment's, or yours)."),
    slurm_url: Optional[str] = typer.Option(None, help="slurmrestd URL; locally the running environment's."),
    slurm_token_file: Optional[Path] = typer.Option(None, help="File with a Slurm JWT (SLURM_JWT)."),
    slurm_jwt_key_file: Optional[Path] = typer.Option(None, help="The local cluster's JWT key, to sign a token "
                                                      "(refused for any other stack)."),
    slurm_user: str = typer.Option("slurm", help="Slurm user of a token signed from --slurm-jwt-key-file (local)."),
    namespace: str = typer.Option("gpufleet-system", help="The reconciler's namespace (its lending ledger)."),
    login: bool = typer.Option(False, "--login", help="Read through Slurm alone, with your own identity (the "
                               "default without Kubernetes credentials, or with SLURM_JWT set): your scontrol, or "
                               "slurmrestd at --slurm-url with SLURM_JWT (`export $(scontrol token)`)."),
    scontrol: str = typer.Option("scontrol", help="The scontrol to ask (--login without --slurm-url)."),
    slurm_namespace: Optional[str] = typer.Option(None, help="Slinky's namespace, whose NodeSet pods alone map "
                                                  "Slurm nodes to machines (default: the stack's slurm.namespace)."),
) -> None:
    """Why was this job requeued, held or stopped? In your words: which GPU failed, what gpufleet did, whether
    the job checkpointed in time, how long it was not running, and what to do. On the login node it reads
    Slurm alone, with your identity: you see the stories of the jobs Slurm shows you.
    Exit 1 when Slurm shows no such job (and, with Kubernetes credentials, no gpufleet record knows it)."""
    if login or _engineer(kubeconfig, stack, slurm_jwt_key_file):
        _why_login(job_id, as_json, slurm_url, slurm_token_file, scontrol)
        return
    from kubernetes.client.exceptions import ApiException

    from gpufleet.reconciler.adapters.records import KubeRemediationStore
    from gpufleet.reconciler.adapters.slurm import SlurmError, make_client
    from gpufleet.reconciler.core import job_story
    from gpufleet.reconciler.errors import PermanentError, TemporaryError
    from gpufleet.commands import _api

    if slurm_jwt_key_file and stack not in (None, "local"):
        refuse_jwt_key(f"stack {stack}", "--slurm-token-file (a token of your own, `scontrol token`)")
    local = local_cluster.find() if stack in (None, "local") else None
    if local is not None and not (slurm_url or slurm_token_file or slurm_jwt_key_file):
        slurm_url, slurm_jwt_key_file = local.slurm_rest_url, local.slurm_jwt_key
    try:
        slurm = make_client("rest", url=slurm_url, token_file=slurm_token_file, jwt_key_file=slurm_jwt_key_file,
                            user=slurm_user)
    except ValueError as e:
        _err(str(e))
        raise typer.Exit(EXIT_FAILED)
    api = _api(kubeconfig, stack)
    try:
        found, source = slurm.job(job_id), "slurmctld"
        if found is None:
            found, source = accounted(slurm, job_id), "accounting"
        slurm_nodes = slurm.nodes()
        kube_nodes = {n.name: k for n in slurm_nodes if (k := kube_node_of(n.comment))} | slurm_hosts(
            api, slurm_namespace or _slurm_namespace(stack))
        remediations = KubeRemediationStore(api).list()
        job = job_facts(found, source) if found is not None else None
        ledgers, events, under_way, pool_of = lending_records(api, namespace)
        # The pools its partitions use: those of the Kubernetes nodes under the partitions' Slurm nodes.
        parts = set(found.partitions) if found is not None else set()
        pools = {pool_of.get(kube_nodes.get(n.name, n.name), "") for n in slurm_nodes
                 if parts & set(n.partitions)} - {""}
        nodes = {kube_nodes.get(n, n) for n in (job.nodes if job else ())}
        nodes |= {x for r in remediations if job_story.touched(r, job_id, job, pools)
                  for x in (r.node, *(kube_nodes.get(n, n) for n in r.job_nodes))}
        faults = node_faults(api, nodes)
    except (SlurmError, TemporaryError, PermanentError, ApiException) as e:
        _err(f"gpufleet why {job_id}: {e}")
        raise typer.Exit(EXIT_FAILED)
    s = job_story.story(job_id, job, remediations, faults, kube_nodes, datetime.now(timezone.utc),
                        job_story.reclaims(ledgers, events, under_way), pools)
    if s is None:
        _err(f"job {job_id}: unknown to Slurm (slurmctld forgets ended jobs after MinJobAge, and accounting has "
             "no record of it or does not run) and to every gpufleet remediation")
        raise typer.Exit(EXIT_FAILED)
    typer.echo(json.dumps(s.to_json(), indent=2) if as_json else job_story.render(s))
