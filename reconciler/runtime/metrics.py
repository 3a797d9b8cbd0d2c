"""Prometheus metrics and the /healthz endpoint: /metrics on one port, /healthz on it and, in a pod, on a
port of its own (the probes'), each a threaded server whose connections time out.

A server of the standard library's defaults serves one connection at a time and waits for a request as
long as the client likes: one idle TCP connection stopped /healthz, the kubelet restarted both replicas,
healing stalled. Here each connection has a thread (up to MAX_CONNECTIONS at once; more are closed at
once) and REQUEST_TIMEOUT seconds to send its request; the probe's port serves nothing but /healthz, so
a scrape, slow or hostile, never holds the probe up.
"""
from __future__ import annotations

import errno
import logging
import socketserver
import threading
import time
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, make_wsgi_app

log = logging.getLogger(__name__)
BIND_WAIT = 60.0  # seconds a port held by an earlier process is waited for (a pod's termination grace is 30 s)
BIND_RETRY = 1.0
BUCKETS = (0.1, 0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1800)
RETURN_BUCKETS = (10, 30, 60, 120, 300, 600, 1200, 1800, 3600, 7200, 14400, 43200, 86400)


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
        self.refills = Counter("gpufleet_refills_total", "Nodes asked for to refill a pool's spares, and what "
                               "became of them, by pool and outcome (requested, answered, failed)",
                               ["pool", "outcome"], registry=r)
        self.nodes = Gauge("gpufleet_nodes_watched", "Nodes in the reconciler's cache", registry=r)
        self.unlabelled = Gauge("gpufleet_unlabelled_gpu_nodes", "GPU nodes that belong to no pool", registry=r)
        self.lending_nodes = Gauge("gpufleet_lending_nodes", "Nodes of each pool by what they do "
                                   "(active_busy, active_idle, active_lent, spares_lent, spares_unlent, quarantined)",
                                   ["pool", "state"], registry=r)
        self.gpus_lent = Gauge("gpufleet_gpus_lent", "GPUs on loan to borrowers now", ["pool"], registry=r)
        self.slurm_token_seconds_left = Gauge("gpufleet_slurm_token_seconds_left",
                                              "Seconds until the reconciler's Slurm token (a Slinky Token's) expires",
                                              registry=r)
        self.slurm_token_stale = Gauge("gpufleet_slurm_token_stale",
                                       "1 while the Slurm token is past the point its Token should have refreshed it",
                                       registry=r)
        self.slurm_token_nudges = Counter("gpufleet_slurm_token_nudges_total",
                                          "Times the reconciler annotated its stale Token so the operator reconciles it",
                                          registry=r)
        self.gpu_seconds_lent = Counter("gpufleet_gpu_seconds_lent_total", "GPU-seconds lent (counted as loans end)",
                                        ["pool"], registry=r)
        self.lending_events = Counter("gpufleet_lending_events_total", "Loans begun, reclaims begun, reclaims "
                                      "forced past the grace, and loans lost with their machine", ["pool", "event"], registry=r)
        self.reclaim_seconds = Histogram("gpufleet_reclaim_seconds", "From a reclaim's start to its node free",
                                         ["pool"], buckets=BUCKETS, registry=r)
        self.heal_reclaim_wait = Histogram("gpufleet_heal_reclaim_wait_seconds",
                                           "What a lent spare added to a heal: waiting for its borrowers to leave",
                                           buckets=BUCKETS, registry=r)
        # The repair loop and validation before service (issue 25)
        self.repairs = Counter("gpufleet_repairs_total", "Repairs that ended, by pool and outcome (returned, retired, "
                               "stopped; relapsed: a returned node that faulted within min_healthy_seconds)",
                               ["pool", "outcome"], registry=r)
        self.repair_steps = Counter("gpufleet_repair_steps_total", "Steps of repairs, by step (reset-gpu, reboot, "
                                    "validate) and outcome (asked, ok, failed, ...)", ["step", "outcome"], registry=r)
        self.time_to_return = Histogram("gpufleet_time_to_return_seconds",
                                        "From a node's fault to the node back among the spares, proven healthy",
                                        buckets=RETURN_BUCKETS, registry=r)
        self.repairing = Gauge("gpufleet_nodes_repairing", "Nodes by pool and repair phase (Repairing, Validating, "
                               "Stopped, Waiting) and retired nodes (Retired)", ["pool", "phase"], registry=r)
        self.health_checks = Counter("gpufleet_health_checks_total", "Health checks of spares before they serve, by "
                                     "pool and outcome (passed, failed)", ["pool", "outcome"], registry=r)
        self.active_checks = Counter("gpufleet_active_checks_total", "Active checks of idle nodes and spares that "
                                     "ended, by pool and result (passed, failed, abandoned, inconclusive)",
                                     ["pool", "result"], registry=r)
        self.active_checks_running = Gauge("gpufleet_active_checks_running", "Active checks under way, by pool",
                                           ["pool"], registry=r)
        self.active_check_age = Gauge("gpufleet_active_check_age_seconds", "Seconds since the pool's least recently "
                                      "checked node passed a health check (+Inf: one never did on its current boot)",
                                      ["pool"], registry=r)
        self.job_back_seconds = Histogram("gpufleet_job_back_seconds",
                                          "From a fault to a job it requeued running again (the job notes pass)",
                                          buckets=BUCKETS, registry=r)
        self.last_pass = time.monotonic()


REQUEST_TIMEOUT = 5.0  # seconds a connection has to send its request (and between reads)
MAX_CONNECTIONS = 64   # served at once per port; beyond that a connection is closed unanswered


class _Quiet(WSGIRequestHandler):
    def log_message(self, *args):  # no access log on stderr
        pass


class _ThreadedServer(socketserver.ThreadingMixIn, WSGIServer):
    """A thread per connection, at most `max_connections` at once; a connection that times out or drops
    is closed without a traceback on stderr."""

    daemon_threads = True
    block_on_close = False
    max_connections = MAX_CONNECTIONS

    def server_activate(self) -> None:
        self._slots = threading.BoundedSemaphore(self.max_connections)
        super().server_activate()

    def process_request(self, request, client_address) -> None:
        if not self._slots.acquire(blocking=False):
            self.shutdown_request(request)  # full: the client retries, the server stays up
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request, client_address) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def handle_error(self, request, client_address) -> None:
        pass  # a client that timed out or went away: nothing to report


def _server(host: str, port: int, app, name: str, timeout: float, max_connections: int,
            bind_wait: float = BIND_WAIT) -> _ThreadedServer:
    handler = type("_Handler", (_Quiet,), {"timeout": timeout})  # StreamRequestHandler applies it to the socket
    server_class = type("_Server", (_ThreadedServer,), {"max_connections": max_connections})
    deadline = time.monotonic() + bind_wait
    while True:
        try:
            server = make_server(host, port, app, server_class=server_class, handler_class=handler)
            break
        except OSError as e:
            # On the host network a pod that replaced a force-deleted one starts while the old process, which
            # the kubelet has not stopped yet, still listens (SO_REUSEADDR cannot share a listening port):
            # wait for it to end instead of crashing.
            if e.errno != errno.EADDRINUSE or time.monotonic() >= deadline:
                raise
            log.warning("port %d is in use (an earlier process on this node still ending?): trying again", port)
            time.sleep(BIND_RETRY)
    threading.Thread(target=server.serve_forever, name=name, daemon=True).start()
    return server


class Servers:
    """The running servers (one or two); shutdown() stops them all."""

    def __init__(self, servers: list[_ThreadedServer]):
        self.servers = servers

    def shutdown(self) -> None:
        for s in self.servers:
            s.shutdown()
            s.server_close()


def serve(metrics: Metrics, port: int, healthy=lambda: True, host: str = "0.0.0.0", health_port: int | None = None,
          timeout: float = REQUEST_TIMEOUT, max_connections: int = MAX_CONNECTIONS) -> Servers:
    """Serve /metrics and /healthz on `port`, and /healthz alone on `health_port` when given, each in daemon
    threads; returns the servers (call .shutdown())."""
    prom = make_wsgi_app(metrics.registry)

    def health(environ, start_response):
        ok = healthy()
        start_response("200 OK" if ok else "503 Service Unavailable", [("Content-Type", "text/plain")])
        return [b"ok\n" if ok else b"unhealthy\n"]

    def app(environ, start_response):
        if environ.get("PATH_INFO") == "/healthz":
            return health(environ, start_response)
        return prom(environ, start_response)

    def health_only(environ, start_response):
        if environ.get("PATH_INFO") == "/healthz":
            return health(environ, start_response)
        start_response("404 Not Found", [("Content-Type", "text/plain")])
        return [b"not found: this port serves /healthz\n"]

    servers = [_server(host, port, app, "metrics", timeout, max_connections)]
    if health_port and health_port != port:
        servers.append(_server(host, health_port, health_only, "health", timeout, max_connections))
    return Servers(servers)
