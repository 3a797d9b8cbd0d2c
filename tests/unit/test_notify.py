"""Notifications: a webhook on loopback (retried on failure) and SNS on a moto server."""
from __future__ import annotations

import json
import threading
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, HTTPServer

import boto3
import pytest
from moto.server import ThreadedMotoServer

from gpufleet.fleetspec import parse_fleet
from gpufleet.reconciler.core.model import Remediation
from gpufleet.reconciler.adapters.notify import Message, Notifier, Sns, Webhook, channels_from_spec
from gpufleet.reconciler.core.phases import Phase

REC = Remediation(name="h100-0-xid79-1", node="h100-0", pool="h100", xid=79, message="off the bus",
             phase=Phase.SUCCEEDED, created=datetime(2026, 1, 1, tzinfo=timezone.utc), replacement="h100-spare-0")


class Hook(BaseHTTPRequestHandler):
    received: list[dict] = []
    fail_first = 0

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if Hook.fail_first > 0:
            Hook.fail_first -= 1
            self.send_response(500)
            self.end_headers()
            return
        Hook.received.append(body)
        self.send_response(200)
        self.end_headers()

    def log_message(self, *a):
        pass


@pytest.fixture
def hook():
    server = HTTPServer(("127.0.0.1", 0), Hook)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    Hook.received, Hook.fail_first = [], 0
    yield f"http://127.0.0.1:{server.server_port}/hook"
    server.shutdown()


def test_webhook_posts_slack_compatible_json_and_retries(hook):
    Hook.fail_first = 2
    Webhook("slack", hook, attempts=3).send(Message("succeeded", "info", "h100-0 replaced", REC))
    (body,) = Hook.received
    assert body["text"].startswith(":white_check_mark: gpufleet: h100-0 replaced")
    fields = {f["title"]: f["value"] for f in body["attachments"][0]["fields"]}
    assert fields["node"] == "h100-0" and fields["replacement"] == "h100-spare-0" and fields["xid"] == "79"


def test_undeliverable_notification_never_raises(hook):
    Hook.fail_first = 10
    failed = []
    n = Notifier([Webhook("slack", hook, attempts=2), Webhook("dead", "http://127.0.0.1:9/none", attempts=1)],
                 on_failure=failed.append)
    n.send(Message("detected", "warning", "x", REC))
    assert failed == ["slack", "dead"]


def test_webhook_url_comes_from_the_environment_not_the_spec():
    spec = parse_fleet({
        "environment": "t", "cluster": {"kind": "local"},
        "pools": [{"name": "a", "node_type": "x", "gpu_model": "g", "nodes": 1, "spares": 1}],
        "slurm": {"partitions": [{"name": "p", "pools": ["a"]}]},
        "healing": {"notifications": [{"type": "webhook", "name": "slack-oncall", "url_secret": "k"}]},
    })
    assert channels_from_spec(spec, {}) == []
    (ch,) = channels_from_spec(spec, {"GPUFLEET_WEBHOOK_SLACK_ONCALL": "http://127.0.0.1:1/x"})
    assert ch.url == "http://127.0.0.1:1/x"


@pytest.fixture(scope="module")
def moto():
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


def test_sns_publishes_to_subscribers(moto, monkeypatch):
    for k, v in {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test", "AWS_DEFAULT_REGION": "us-east-1"}.items():
        monkeypatch.setenv(k, v)
    sns = boto3.client("sns", endpoint_url=moto, region_name="us-east-1")
    sqs = boto3.client("sqs", endpoint_url=moto, region_name="us-east-1")
    topic = sns.create_topic(Name="gpufleet-oncall")["TopicArn"]
    queue = sqs.create_queue(QueueName="oncall")["QueueUrl"]
    qarn = sqs.get_queue_attributes(QueueUrl=queue, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    sns.subscribe(TopicArn=topic, Protocol="sqs", Endpoint=qarn)
    Sns("pager", topic, "us-east-1", client=sns).send(Message("storm", "critical", "5 of 10 nodes unhealthy"))
    msgs = sqs.receive_message(QueueUrl=queue, WaitTimeSeconds=1)["Messages"]
    body = json.loads(msgs[0]["Body"])
    assert body["Message"] == "5 of 10 nodes unhealthy" and "critical" in body["Subject"]


class Events:
    """Records the Events the notifier raises (the Kube adapter's `event`)."""

    def __init__(self):
        self.got = []

    def event(self, involved, reason, message, type_="Normal", namespace="default"):
        self.got.append((involved["kind"], involved["name"], reason, message, type_))


def test_a_failed_page_is_retried_then_raised_as_a_critical_event(moto, monkeypatch):
    from botocore.config import Config

    for k, v in {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test"}.items():
        monkeypatch.setenv(k, v)
    down = boto3.client("sns", endpoint_url="http://127.0.0.1:9", region_name="us-east-1",
                        config=Config(retries={"total_max_attempts": 1}, connect_timeout=1))
    calls = []
    down.meta.events.register("before-send.sns.Publish", lambda **kw: calls.append(1))
    events, failed = Events(), []
    n = Notifier([Sns("pager", "arn:aws:sns:us-east-1:123456789012:t", "us-east-1", client=down, attempts=3)],
                 kube=events, namespace="gpufleet-system", on_failure=failed.append)
    n.send(Message("no-spare", "critical", "no spare left in pool h100", REC))
    assert len(calls) == 3  # the endpoint is down: a temporary error, retried
    assert failed == ["pager"]  # counted: gpufleet_notification_failures_total{channel="pager"}
    (ev,) = [e for e in events.got if e[2] == "NotificationFailed"]
    assert ev[0] == "Remediation" and ev[1] == REC.name and ev[4] == "Warning"
    assert ev[3].startswith("critical: critical notification 'no-spare' to pager failed")

    events.got.clear()
    sns = boto3.client("sns", endpoint_url=moto, region_name="us-east-1")
    calls.clear()
    sns.meta.events.register("before-send.sns.Publish", lambda **kw: calls.append(1))
    Notifier([Sns("pager", "arn:aws:sns:us-east-1:123456789012:missing", "us-east-1", client=sns)], kube=events,
             namespace="gpufleet-system").send(Message("storm", "critical", "brake"))
    assert len(calls) == 1  # a missing topic is permanent: not retried
    assert [(e[0], e[2]) for e in events.got] == [("Deployment", "NotificationFailed")]
