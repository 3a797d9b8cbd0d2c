"""Tell people what happened: Kubernetes Events, webhooks (Slack-compatible JSON), AWS SNS.

A notification that cannot be delivered is retried, then logged, counted
(`gpufleet_notification_failures_total`, which the stack's PrometheusRule alerts on) and raised as a
Warning Event whose message starts with `critical:`; never a reason to stop healing: the fleet
matters more than the message about it. A webhook's URL carries its token: it is registered as a secret
(reconciler/redact.py) and no error text about a delivery leaves here unredacted.
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any, Mapping, Protocol

import httpx
from tenacity import retry, retry_if_exception_type, stop_after_attempt, wait_exponential

from gpufleet.fleetspec import labels, remediation_crd
from gpufleet.fleetspec.models import FleetSpec, SnsTarget, WebhookTarget

from gpufleet.reconciler.core.model import Remediation
from gpufleet.reconciler.redact import redact, register

log = logging.getLogger(__name__)
EMOJI = {"info": ":white_check_mark:", "warning": ":warning:", "critical": ":rotating_light:"}


@dataclass(frozen=True)
class Message:
    event: str
    severity: str  # info | warning | critical
    text: str
    remediation: Remediation | None = None
    job: Mapping[str, Any] | None = None  # a message to a job's owner: job_id, user, account

    def fields(self) -> dict[str, Any]:
        r = self.remediation
        out = {} if r is None else {"node": r.node, "pool": r.pool, "xid": r.xid, "phase": r.phase.value,
                                    "remediation": r.name, "replacement": r.replacement}
        return {**(self.job or {}), **out}


class Channel(Protocol):
    name: str

    def send(self, msg: Message) -> None: ...


class Webhook:
    """POST a Slack-compatible body ({"text": ..., "attachments": [...]}); retried with backoff."""

    def __init__(self, name: str, url: str, timeout: float = 5.0, attempts: int = 3):
        self.name, self.url, self.timeout, self.attempts = name, url, timeout, attempts
        register(url)  # it carries the token: never in a log line, an Event or an error text

    def __repr__(self) -> str:
        return f"Webhook({self.name!r})"

    def body(self, msg: Message) -> dict[str, Any]:
        return {
            "text": f"{EMOJI.get(msg.severity, '')} gpufleet: {redact(msg.text)}".strip(),
            "attachments": [{"color": {"info": "good", "warning": "warning", "critical": "danger"}[msg.severity],
                             "fields": [{"title": k, "value": str(v), "short": True}
                                        for k, v in msg.fields().items() if v is not None]}],
            "gpufleet": {"event": msg.event, "severity": msg.severity, **msg.fields()},
        }

    def send(self, msg: Message) -> None:
        @retry(stop=stop_after_attempt(self.attempts), wait=wait_exponential(multiplier=0.2, max=5), reraise=True,
               retry=retry_if_exception_type(httpx.HTTPError))
        def post():
            r = httpx.post(self.url, json=self.body(msg), timeout=self.timeout)
            r.raise_for_status()

        post()


class Sns:
    """Publish to an SNS topic; throttling, 5xx and connection errors are retried with backoff."""

    def __init__(self, name: str, topic_arn: str, region: str, client: Any = None, attempts: int = 3):
        import boto3

        self.name, self.topic_arn, self.attempts = name, topic_arn, attempts
        self.client = client or boto3.client("sns", region_name=region)

    def send(self, msg: Message) -> None:
        from gpufleet.reconciler.adapters.aws_errors import is_temporary

        @retry(stop=stop_after_attempt(self.attempts), wait=wait_exponential(multiplier=0.2, max=5), reraise=True,
               retry=lambda state: state.outcome.failed and is_temporary(state.outcome.exception()))
        def publish():
            self.client.publish(
                TopicArn=self.topic_arn,
                Subject=f"gpufleet {msg.severity}: {msg.event}"[:100],
                Message=redact(msg.text),
                MessageAttributes={"severity": {"DataType": "String", "StringValue": msg.severity},
                                   "event": {"DataType": "String", "StringValue": msg.event}},
            )

        publish()


def channels_from_spec(spec: FleetSpec, env: dict[str, str] | None = None) -> list[Channel]:
    """Webhook URLs come from the environment (the notifications Secret), never the spec."""
    env = os.environ if env is None else env
    out: list[Channel] = []
    for t in spec.healing.notifications:
        if isinstance(t, WebhookTarget) and t.job_owners is not None:
            continue  # a route to jobs' owners (owner_routes_from_spec), not an on-call channel
        if isinstance(t, WebhookTarget):
            var = f"GPUFLEET_WEBHOOK_{t.name.upper().replace('-', '_')}"
            if env.get(var):
                out.append(Webhook(t.name, env[var]))
            else:
                log.warning("webhook %s has no URL (%s unset): skipped", t.name, var)
        elif isinstance(t, SnsTarget):
            out.append(Sns(t.name, t.topic_arn, t.region))
    return out


def owner_routes_from_spec(spec: FleetSpec, env: dict[str, str] | None = None) -> dict[str, Channel]:
    """The webhook targets with `job_owners`, by name (URLs from the environment, as the others')."""
    env = os.environ if env is None else env
    out: dict[str, Channel] = {}
    for t in spec.healing.notifications:
        if isinstance(t, WebhookTarget) and t.job_owners is not None:
            var = f"GPUFLEET_WEBHOOK_{t.name.upper().replace('-', '_')}"
            if env.get(var):
                out[t.name] = Webhook(t.name, env[var])
            else:
                log.warning("owner route %s has no URL (%s unset): skipped", t.name, var)
    return out


class Notifier:
    def __init__(self, channels: list[Channel], kube: Any = None, namespace: str = "default", on_failure=None,
                 routes: Mapping[str, Channel] | None = None):
        self.channels, self.kube, self.namespace = channels, kube, namespace
        self.on_failure = on_failure or (lambda channel: None)
        self.routes = dict(routes or {})  # owner routes, by name: told about their jobs only

    def send_to(self, route: str, msg: Message) -> None:
        """One message to one owner route; a failure is logged and counted, never raised (nor repeated)."""
        ch = self.routes.get(route)
        if ch is None:
            return
        try:
            ch.send(msg)
        except Exception as e:  # noqa: BLE001 - delivery must never stop healing
            log.error("message to owner route %s failed: %s", route, e)
            self.on_failure(route)

    def send(self, msg: Message) -> None:
        log.info("notify %s: %s", msg.event, redact(msg.text),
                 extra={"remediation": msg.remediation.name if msg.remediation else None, "severity": msg.severity})
        if self.kube is not None and msg.remediation is not None:
            type_ = "Normal" if msg.severity == "info" else "Warning"
            reason = "GpuFleet" + "".join(w.capitalize() for w in msg.event.split("-"))
            text = redact(msg.text)
            self.kube.event({"kind": "Node", "name": msg.remediation.node, "apiVersion": "v1"}, reason, text, type_,
                            self.namespace)
            self.kube.event({"kind": remediation_crd.KIND, "name": msg.remediation.name, "apiVersion": labels.API_VERSION},
                            reason, text, type_, self.namespace)
        for ch in self.channels:
            try:
                ch.send(msg)
            except Exception as e:  # noqa: BLE001 - delivery must never stop healing
                log.error("notification to %s failed: %s", ch.name, redact(f"{type(e).__name__}: {e}"))
                self.on_failure(ch.name)
                self._raise_failure(ch.name, msg, e)

    def _raise_failure(self, channel: str, msg: Message, err: Exception) -> None:
        """People must learn that a page did not go out: a Warning Event marked critical, on the
        remediation when there is one, else on the reconciler's Deployment."""
        if self.kube is None:
            return
        text = redact(f"critical: {msg.severity} notification {msg.event!r} to {channel} failed after retries: "
                      f"{type(err).__name__}: {err}")
        if msg.remediation is not None:
            involved = {"kind": remediation_crd.KIND, "name": msg.remediation.name, "apiVersion": labels.API_VERSION}
        else:
            involved = {"kind": "Deployment", "name": "gpufleet-reconciler", "apiVersion": "apps/v1",
                        "namespace": self.namespace}
        self.kube.event(involved, "NotificationFailed", text, "Warning", self.namespace)
