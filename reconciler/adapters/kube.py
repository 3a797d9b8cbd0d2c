"""The reconciler's Kubernetes adapter: nodes, pods, evictions, events, the node condition.

Works on raw dicts (no model deserialisation: it is the cost that grows with the fleet).
One ApiClient is built at start-up and passed in. Every failure is raised as a typed error
(reconciler/errors.py: Conflict, NotFound, AlreadyExists, ... each a TemporaryError or PermanentError),
read from the Status object the API server returns, so callers decide by type, never by message.
"""
from __future__ import annotations

import json
import logging
import queue
import threading
import time
from datetime import datetime, timezone
from typing import Any, Callable, Iterator

from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

from gpufleet.fleetspec import labels, remediation_crd
from gpufleet.fleetspec.placement import SPARE_TAINT

from gpufleet.reconciler.core.actions import NodeShape
from gpufleet.reconciler.errors import Conflict, NotFound, PermanentError, TemporaryError, TooManyRequests, api_error
from gpufleet.reconciler.redact import redact

log = logging.getLogger(__name__)
TIMEOUT = 20  # seconds for any single API call
EVENT_SENDERS = 4  # threads sending the reconciler's Events; one object's Events all go through one of them
# Connections kept open to the API server: every worker, each informer's watch and the Lease renewal
# hold one at once. The client's default (5 per core) is smaller than that, and a connection returned
# to a full pool is dropped, so the next call pays a new TCP and TLS handshake on both ends.
CONNECTIONS = 64


def now_rfc3339() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _call(what: str, fn: Callable[..., Any], *args, **kwargs) -> Any:
    """One API call. A raw response (`_preload_content=False`) is read to its end here, whether or not
    the caller looks at it: only then does its connection go back to the pool (an unread one is
    closed when it is collected, and the next call opens a new TLS connection)."""
    try:
        resp = fn(*args, _request_timeout=TIMEOUT, **kwargs)
        if kwargs.get("_preload_content") is False:
            resp.data  # noqa: B018 - reads the body (kept on the response) and releases the connection
        return resp
    except ApiException as e:
        raise api_error(what, e.status, e.body) from None
    except (HTTPError, OSError) as e:
        raise TemporaryError(f"{what}: {e}") from None


def _json(resp) -> Any:
    return json.loads(resp.data)


def keep_connections(api: client.ApiClient, connections: int) -> None:
    """Let the client's pool keep `connections` open (pools are made per host on first use, with
    these settings; the ones made already are closed and made again)."""
    pm = getattr(getattr(api, "rest_client", None), "pool_manager", None)
    kw = getattr(pm, "connection_pool_kw", None)
    if kw is not None and (kw.get("maxsize") or 1) < connections:
        kw["maxsize"] = connections
        pm.clear()


class Kube:
    def __init__(self, api: client.ApiClient, connections: int = CONNECTIONS, background_events: bool = False,
                 manager: str | None = None):
        """`background_events`: Events (best effort) are sent by threads of their own, each object's in
        order, so a worker does not wait for them (the reconciler; `flush_events` before exit). `manager`: the
        field manager node conditions are written as (labels.MANAGER_*), which names who reported a fault."""
        self.api = api
        self.manager = manager
        keep_connections(api, connections)
        self._events: list[queue.Queue] = [queue.Queue(maxsize=2_500) for _ in range(EVENT_SENDERS)] \
            if background_events else []
        self._senders_started = False
        self._senders_lock = threading.Lock()
        self.core = client.CoreV1Api(api)
        self.policy = client.PolicyV1Api(api)
        self.custom = client.CustomObjectsApi(api)

    # --- list + watch, for the informers ----------------------------------------------------------

    def _lister(self, kind: str):
        if kind == "nodes":
            return self.core.list_node, ()
        if kind == "pods":
            return self.core.list_pod_for_all_namespaces, ()
        if kind == "remediations":
            return self.custom.list_cluster_custom_object, (labels.GROUP, remediation_crd.VERSION, remediation_crd.PLURAL)
        raise ValueError(f"no lister for {kind}")

    def list_page(self, kind: str, limit: int = 500, cont: str | None = None) -> tuple[list[dict], str, str | None]:
        """One page of a list (items, resourceVersion, continue token or None): paged, so a list of
        10,000 nodes never sits in memory as one response."""
        fn, args = self._lister(kind)
        kw = {"limit": limit, "_preload_content": False}
        if cont:
            kw["_continue"] = cont
        data = _json(_call(f"list {kind}", fn, *args, **kw))
        meta = data.get("metadata") or {}
        return data.get("items") or [], meta.get("resourceVersion", ""), meta.get("continue") or None

    def watch(self, kind: str, resource_version: str, timeout_seconds: int = 300) -> Iterator[tuple[str, dict]]:
        """(event type, object) pairs until the server ends the watch. A 410 Expired (or any error)
        surfaces as a typed error: the informer lists again."""
        fn, args = self._lister(kind)
        w = watch.Watch()
        try:
            for ev in w.stream(fn, *args, resource_version=resource_version, deserialize=False,
                               timeout_seconds=timeout_seconds, allow_watch_bookmarks=True):
                obj = ev.get("raw_object") or ev["object"]
                if ev["type"] == "ERROR":
                    raise api_error(f"watch {kind}", obj.get("code"), obj)  # 410 Expired: list again
                yield ev["type"], obj
        except ApiException as e:
            raise api_error(f"watch {kind}", e.status, e.body) from None
        except (HTTPError, OSError) as e:
            raise TemporaryError(f"watch {kind}: {e}") from None
        finally:
            w.stop()

    # --- nodes ---------------------------------------------------------------------------------

    def list_nodes(self) -> tuple[list[dict], str]:
        data = _json(_call("list nodes", self.core.list_node, _preload_content=False))
        return data["items"], data["metadata"]["resourceVersion"]

    def get_node(self, name: str) -> dict:
        return _json(_call(f"get node {name}", self.core.read_node, name, _preload_content=False))

    def patch_node(self, name: str, body: dict) -> dict:
        return _json(_call(f"patch node {name}", self.core.patch_node, name, body, _preload_content=False))

    def update_node(self, name: str, mutate: Callable[[dict], bool], attempts: int = 5) -> dict:
        """Read, change, write with the resourceVersion; retry on conflict. `mutate` returns
        False when nothing needs changing (then nothing is written)."""
        for attempt in range(attempts):
            node = self.get_node(name)
            if not mutate(node):
                return node
            try:
                return _json(_call(f"update node {name}", self.core.replace_node, name, node, _preload_content=False))
            except Conflict:
                if attempt == attempts - 1:
                    raise
        raise TemporaryError(f"update node {name}: conflict after {attempts} attempts")

    def carry_drain(self, name: str, drains: dict[str, str]) -> dict:
        """Add people's Slurm drains to the node's labels.CARRIED_DRAIN annotation (JSON {slurm node: reason});
        an entry already there is kept as it was. The node as written."""
        def mutate(node: dict) -> bool:
            ann = node["metadata"].setdefault("annotations", {})
            try:
                have = json.loads(ann.get(labels.CARRIED_DRAIN) or "{}")
            except ValueError:
                have = {}
            new = {k: v for k, v in drains.items() if k not in have}
            if not new:
                return False
            ann[labels.CARRIED_DRAIN] = json.dumps({**have, **new}, sort_keys=True)
            return True

        return self.update_node(name, mutate)

    def cordon(self, name: str, reason: str, remediation: str | None = None) -> dict:
        """One patch: the cordon, the reason Slinky's operator copies into its Slurm drain (it must be
        there before the cordon is seen, hence the same write), and the record in progress."""
        ann = {labels.SLINKY_CORDON_REASON: reason}
        if remediation:
            ann[labels.REMEDIATION] = remediation
        return self.patch_node(name, {"spec": {"unschedulable": True}, "metadata": {"annotations": ann}})

    def set_node_role(self, name: str, role: str, *, add_taints: list[dict] = (), remove_taints: list[str] = (),
                      annotations: dict[str, str | None] | None = None, schedulable: bool | None = None) -> dict:
        def mutate(node: dict) -> bool:
            meta, spec = node["metadata"], node.setdefault("spec", {})
            before = json.dumps([meta.get("labels"), meta.get("annotations"), spec.get("taints"), spec.get("unschedulable")],
                                sort_keys=True)
            meta.setdefault("labels", {})[labels.ROLE] = role
            ann = meta.setdefault("annotations", {})
            for k, v in (annotations or {}).items():
                if v is None:
                    ann.pop(k, None)
                else:
                    ann[k] = v
            taints = [t for t in spec.get("taints") or [] if t["key"] not in set(remove_taints)]
            for t in add_taints:
                if not any(x["key"] == t["key"] for x in taints):
                    taints.append(dict(t))
            spec["taints"] = taints or None
            if schedulable is not None:
                spec["unschedulable"] = None if schedulable else True
            after = json.dumps([meta.get("labels"), meta.get("annotations"), spec.get("taints"), spec.get("unschedulable")],
                               sort_keys=True)
            return before != after

        return self.update_node(name, mutate)

    # --- lending: one node opened to borrowers, and taken back (reconciler/core/lending.py) -----------

    def lend(self, name: str, pool: str, loan: str, since: str) -> dict:
        """The lending taint (a spare's spare taint gives way to it), the lent label, when."""
        taint = {"key": labels.LENDING_TAINT, "value": pool, "effect": "NoSchedule"}

        def mutate(node: dict) -> bool:
            meta, spec = node["metadata"], node.setdefault("spec", {})
            have = meta.setdefault("labels", {})
            ann = meta.setdefault("annotations", {})
            taints = [t for t in spec.get("taints") or [] if t["key"] != labels.SPARE_TAINT]
            if have.get(labels.LENT) == loan and any(t["key"] == labels.LENDING_TAINT for t in taints) \
                    and len(taints) == len(spec.get("taints") or []):
                return False
            if not any(t["key"] == labels.LENDING_TAINT for t in taints):
                taints.append(taint)
            spec["taints"] = taints
            have[labels.LENT] = loan
            ann.setdefault(labels.LENT_SINCE, since)
            ann.pop(labels.RECLAIMING, None)
            return True

        return self.update_node(name, mutate)

    # --- active checks: an idle node taken for its check, and given back (reconciler/core/active_checks.py) ---

    def take_for_check(self, name: str) -> dict:
        """The check taint (NoSchedule): the node's NodeSet pods, once evicted, do not come back meanwhile."""
        taint = {"key": labels.CHECK_TAINT, "value": "true", "effect": "NoSchedule"}

        def mutate(node: dict) -> bool:
            spec = node.setdefault("spec", {})
            taints = list(spec.get("taints") or [])
            if any(t["key"] == labels.CHECK_TAINT for t in taints):
                return False
            spec["taints"] = taints + [taint]
            return True

        return self.update_node(name, mutate)

    def give_back_from_check(self, name: str) -> dict:
        """The check taint off (its NodeSet pods come back); nothing else is touched."""
        def mutate(node: dict) -> bool:
            spec = node.setdefault("spec", {})
            taints = [t for t in spec.get("taints") or [] if t["key"] != labels.CHECK_TAINT]
            if len(taints) == len(spec.get("taints") or []):
                return False
            spec["taints"] = taints or None
            return True

        return self.update_node(name, mutate)

    def start_reclaim(self, name: str, at: str) -> None:
        """No new borrower lands (the label they require goes); when the reclaim began."""
        self.patch_node(name, {"metadata": {"labels": {labels.LENT: None}, "annotations": {labels.RECLAIMING: at}}})

    def end_loan(self, name: str, back_to_spare: bool) -> dict:
        """The lending taint off, the loan's marks gone; a spare gets its spare taint back."""
        def mutate(node: dict) -> bool:
            meta, spec = node["metadata"], node.setdefault("spec", {})
            have, ann = meta.get("labels") or {}, meta.get("annotations") or {}
            taints = [t for t in spec.get("taints") or [] if t["key"] != labels.LENDING_TAINT]
            if back_to_spare and not any(t["key"] == labels.SPARE_TAINT for t in taints):
                taints.append(dict(SPARE_TAINT))
            changed = taints != (spec.get("taints") or []) or labels.LENT in have or \
                labels.LENT_SINCE in ann or labels.RECLAIMING in ann
            spec["taints"] = taints or None
            have.pop(labels.LENT, None)
            ann.pop(labels.LENT_SINCE, None)
            ann.pop(labels.RECLAIMING, None)
            return changed

        return self.update_node(name, mutate)

    def apply_membership(self, name: str, set_labels: dict[str, str], add_taints: list[dict] | tuple = (),
                         set_annotations: dict[str, str] | None = None, seen: NodeShape | None = None) -> bool:
        """Set labels (and annotations) and add taints a membership plan asks for
        (reconciler/core/membership.py); never removes anything, writes nothing when nothing is missing.
        With `seen`, writes only while the node's role and own taints are as the plan read them (from a cache
        that may be a moment old): a spare promoted meanwhile keeps its promotion, and the next pass plans
        again. False when it was left for that reason."""
        stale = False

        def mutate(node: dict) -> bool:
            nonlocal stale
            meta, spec = node["metadata"], node.setdefault("spec", {})
            have = meta.setdefault("labels", {})
            if seen is not None and not seen.still(have.get(labels.ROLE, ""),
                                                   (t.get("key") for t in spec.get("taints") or [])):
                stale = True
                return False
            changed = {k: v for k, v in set_labels.items() if have.get(k) != v}
            have.update(changed)
            ann = meta.setdefault("annotations", {}) if set_annotations else {}
            new_ann = {k: v for k, v in (set_annotations or {}).items() if ann.get(k) != v}
            ann.update(new_ann)
            changed = {**changed, **new_ann}
            taints = list(spec.get("taints") or [])
            new = [dict(t) for t in add_taints if not any(x["key"] == t["key"] for x in taints)]
            if new:
                spec["taints"] = taints + new
            return bool(changed or new)

        self.update_node(name, mutate)
        return not stale

    def set_condition(self, name: str, ctype: str, status: str, reason: str, message: str) -> None:
        """Set one node condition (the agent's and inject-fault's write). The transition time
        moves only when the status or reason changes, so a repeated signal stays one signal."""
        node = self.get_node(name)
        now = now_rfc3339()
        conds = node.get("status", {}).get("conditions") or []
        old = next((c for c in conds if c.get("type") == ctype), None)
        changed = old is None or old.get("status") != status or old.get("reason") != reason
        cond = {"type": ctype, "status": status, "reason": reason, "message": message, "lastHeartbeatTime": now,
                "lastTransitionTime": now if changed else old.get("lastTransitionTime", now)}
        _call(f"set condition {ctype} on {name}", self.core.patch_node_status, name,
              {"status": {"conditions": [cond]}}, _preload_content=False,
              **({"field_manager": self.manager} if self.manager else {}))

    # --- pods ----------------------------------------------------------------------------------

    def evict(self, pod: dict, grace_seconds: int | None = None) -> bool:
        """Ask for an eviction (with this SIGTERM-to-kill grace, if given); False when a
        PodDisruptionBudget refuses it for now."""
        meta = pod["metadata"]
        body: dict[str, Any] = {"apiVersion": "policy/v1", "kind": "Eviction",
                                "metadata": {"name": meta["name"], "namespace": meta["namespace"]}}
        if grace_seconds is not None:
            body["deleteOptions"] = {"gracePeriodSeconds": grace_seconds}
        try:
            _call(f"evict {meta['namespace']}/{meta['name']}", self.core.create_namespaced_pod_eviction,
                  meta["name"], meta["namespace"], body, _preload_content=False)
        except TooManyRequests:
            return False
        except NotFound:
            return True  # already gone
        return True

    def delete_pod(self, namespace: str, name: str, grace_seconds: int = 0) -> None:
        """Delete a pod whatever its PodDisruptionBudget says (a reclaim whose grace has passed)."""
        try:
            _call(f"delete pod {namespace}/{name}", self.core.delete_namespaced_pod, name, namespace,
                  grace_period_seconds=grace_seconds, _preload_content=False)
        except NotFound:
            pass  # gone already

    # --- the lending ledger (a ConfigMap the stack declares; the reconciler writes its data) ------------

    def read_ledger(self, namespace: str) -> dict[str, str] | None:
        """The ledger's data, or None when the ConfigMap is not there (a stack without lending)."""
        try:
            cm = _json(_call("get the lending ledger", self.core.read_namespaced_config_map, labels.LENDING_LEDGER,
                             namespace, _preload_content=False))
        except NotFound:
            return None
        return cm.get("data") or {}

    def write_ledger(self, namespace: str, pool: str, text: str) -> None:
        """One pool's entry (a merge patch: other pools' entries are left as they are)."""
        _call("patch the lending ledger", self.core.patch_namespaced_config_map, labels.LENDING_LEDGER, namespace,
              {"data": {pool: text}}, _preload_content=False)

    # --- events ----------------------------------------------------------------------------------

    def event(self, involved: dict, reason: str, message: str, type_: str = "Normal",
              namespace: str = "default") -> None:
        """A core/v1 Event on `involved` ({kind, name, apiVersion?, uid?}); best effort.
        Events about cluster-scoped objects (nodes, remediations) must live in `default`: the API
        server rejects them in any other namespace."""
        if "namespace" not in involved:
            namespace = "default"
        ts = now_rfc3339()
        body = {
            "metadata": {"generateName": f"{involved['name']}.", "namespace": namespace},
            "involvedObject": involved, "reason": reason, "message": redact(message)[:1000], "type": type_,
            "source": {"component": "gpufleet-reconciler"}, "firstTimestamp": ts, "lastTimestamp": ts, "count": 1,
        }
        if self._events:
            with self._senders_lock:
                if not self._senders_started:
                    for i, q in enumerate(self._events):
                        threading.Thread(target=self._send_events, args=(q,), name=f"events-{i}", daemon=True).start()
                    self._senders_started = True
            try:
                self._events[hash(involved["name"]) % len(self._events)].put_nowait((namespace, body))
                return
            except queue.Full:
                pass  # the senders are far behind (the API server is): this one waits its turn here
        self._post_event(namespace, body)

    def node_event(self, name: str, reason: str, message: str, type_: str = "Warning",
                   component: str = "gpufleet-agent") -> None:
        """An Event on a node that must not be lost (the node agent's record of a fault that leaves the
        node in service): raises TemporaryError/PermanentError like any other call, so it is retried."""
        ts = now_rfc3339()
        body = {
            "metadata": {"generateName": f"{name}.", "namespace": "default"},
            "involvedObject": {"kind": "Node", "name": name, "apiVersion": "v1"}, "reason": reason,
            "message": message[:1000], "type": type_, "source": {"component": component, "host": name},
            "firstTimestamp": ts, "lastTimestamp": ts, "count": 1,
        }
        _call(f"create event on {name}", self.core.create_namespaced_event, "default", body, _preload_content=False)

    def _post_event(self, namespace: str, body: dict) -> None:
        try:
            _call("create event", self.core.create_namespaced_event, namespace, body, _preload_content=False)
        except (TemporaryError, PermanentError) as e:
            log.warning("event not recorded: %s", e)

    def _send_events(self, q: queue.Queue) -> None:
        while True:
            namespace, body = q.get()
            try:
                self._post_event(namespace, body)
            finally:
                q.task_done()

    def flush_events(self, timeout: float = 5.0) -> bool:
        """Wait (up to `timeout`) until the queued Events are sent; True when none is left."""
        deadline = time.monotonic() + timeout
        while any(q.unfinished_tasks for q in self._events) and time.monotonic() < deadline:
            time.sleep(0.05)
        return not any(q.unfinished_tasks for q in self._events)
