"""Prometheus metrics and the /healthz endpoint, served on one port."""
from __future__ import annotations

import threading
import time
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, make_wsgi_app

BUCKETS = (0.1, 0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1800)


class Metrics:
    def __init__(self, registry: CollectorRegistry | None = None):
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.remediations = Counter("gpufleet_remediations_total", "Remediations that ended, by XID and outcome",
                                    ["xid", "outcome"], registry=r)
        self.started = Counter("gpufleet_remediations_started_total", "Remediations started, by pool and XID",
                               ["pool", "xid"], registry=r)
        self.in_progress = Gauge("gpufleet_remediations_in_progress", "Remediations not yet ended", registry=r)
        self.phase_seconds = Histogram("gpufleet_phase_seconds", "Time spent in each phase", ["phase"],
                                       buckets=BUCKETS, registry=r)
        self.time_to_healthy = Histogram("gpufleet_time_to_healthy_seconds",
                                         "From the fault signal to a healthy replacement taking jobs",
                                         buckets=BUCKETS, registry=r)
        self.held = Gauge("gpufleet_nodes_held", "Faulted nodes held back by a gate", ["reason"], registry=r)
        self.action_errors = Counter("gpufleet_action_errors_total", "Failed actions, by kind and error type",
                                     ["action", "error"], registry=r)
        self.notify_failures = Counter("gpufleet_notification_failures_total", "Undelivered notifications",
                                       ["channel"], registry=r)
        self.reaction = Histogram("gpufleet_reaction_seconds", "From a node change seen to the pass that acted on it",
                                  buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5), registry=r)
        self.nodes = Gauge("gpufleet_nodes_watched", "Nodes in the reconciler's cache", registry=r)
        self.unlabelled = Gauge("gpufleet_unlabelled_gpu_nodes", "GPU nodes that belong to no pool", registry=r)
        self.lending_nodes = Gauge("gpufleet_lending_nodes", "Nodes of each pool by what they do "
                                   "(active_busy, active_idle, active_lent, spares_lent, spares_unlent, quarantined)",
                                   ["pool", "state"], registry=r)
        self.gpus_lent = Gauge("gpufleet_gpus_lent", "GPUs on loan to borrowers now", ["pool"], registry=r)
        self.gpu_seconds_lent = Counter("gpufleet_gpu_seconds_lent_total", "GPU-seconds lent (counted as loans end)",
                                        ["pool"], registry=r)
        self.lending_events = Counter("gpufleet_lending_events_total", "Loans begun, reclaims begun, and reclaims "
                                      "forced past the grace", ["pool", "event"], registry=r)
        self.reclaim_seconds = Histogram("gpufleet_reclaim_seconds", "From a reclaim's start to its node free",
                                         ["pool"], buckets=BUCKETS, registry=r)
        self.heal_reclaim_wait = Histogram("gpufleet_heal_reclaim_wait_seconds",
                                           "What a lent spare added to a heal: waiting for its borrowers to leave",
                                           buckets=BUCKETS, registry=r)
        self.job_back_seconds = Histogram("gpufleet_job_back_seconds",
                                          "From a fault to a job it requeued running again (the job notes pass)",
                                          buckets=BUCKETS, registry=r)
        self.last_pass = time.monotonic()


class _Quiet(WSGIRequestHandler):
    def log_message(self, *args):  # no access log on stderr
        pass


def serve(metrics: Metrics, port: int, healthy=lambda: True, host: str = "0.0.0.0"):
    """Serve /metrics and /healthz in a daemon thread; returns the server (call .shutdown())."""
    prom = make_wsgi_app(metrics.registry)

    def app(environ, start_response):
        if environ.get("PATH_INFO") == "/healthz":
            ok = healthy()
            start_response("200 OK" if ok else "503 Service Unavailable", [("Content-Type", "text/plain")])
            return [b"ok\n" if ok else b"unhealthy\n"]
        return prom(environ, start_response)

    server = make_server(host, port, app, handler_class=_Quiet)
    threading.Thread(target=server.serve_forever, name="metrics", daemon=True).start()
    return server
