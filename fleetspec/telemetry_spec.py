"""The spec of GPU telemetry: where the reconciler reads dcgm-exporter's metrics (`healing.telemetry`), and how
each pool wants hangs and stragglers judged (`pools[].telemetry`). The thresholds themselves are data in
fleetspec/faults/telemetry.py. Pydantic only, like the rest of the spec.
"""
from __future__ import annotations

from typing import Literal
from urllib.parse import urlsplit

from pydantic import Field, field_validator, model_validator

from .models import FieldError, Strict  # defined before models.py imports this module


def _http_url(v: str) -> str:
    parts = urlsplit(v)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{v!r} is not an http(s) URL such as http://prometheus.monitoring:9090")
    return v.rstrip("/")


class TelemetrySpec(Strict):
    """Where dcgm-exporter's metrics are read, and how often."""

    source: Literal["none", "prometheus", "exporter"] = Field(
        "none", description="none: no telemetry is read (faults come from the kernel log and conditions only); "
        "prometheus: the fleet's Prometheus, which scrapes dcgm-exporter (`prometheus_url`); exporter: "
        "dcgm-exporter's /metrics endpoints themselves (`exporter_urls`).")
    prometheus_url: str | None = Field(None, description="Prometheus' base URL, e.g. http://prometheus.monitoring:9090.")
    exporter_urls: list[str] = Field(default_factory=list,
                                     description="dcgm-exporter /metrics URLs (its default port is 9400).")
    every_seconds: int = Field(15, ge=1, le=600, description="How often the metrics are read and judged.")
    timeout_seconds: float = Field(5.0, gt=0, le=60, description="One read's time limit.")

    @field_validator("prometheus_url")
    @classmethod
    def _prometheus(cls, v: str | None) -> str | None:
        return None if v is None else _http_url(v)

    @field_validator("exporter_urls")
    @classmethod
    def _exporters(cls, v: list[str]) -> list[str]:
        return [_http_url(u) for u in v]

    @model_validator(mode="after")
    def _source(self) -> "TelemetrySpec":
        if self.source == "prometheus" and not self.prometheus_url:
            raise FieldError("prometheus_url", "source prometheus needs the Prometheus URL to query")
        if self.source == "exporter" and not self.exporter_urls:
            raise FieldError("exporter_urls", "source exporter needs at least one dcgm-exporter /metrics URL")
        return self


class PoolTelemetry(Strict):
    """How one pool's running jobs are judged from their GPUs' telemetry."""

    hang_after_seconds: int = Field(
        900, ge=1, le=86400, description="A running job whose GPUs all show no activity (DCGM_FI_PROF_SM_ACTIVE, "
        "else DCGM_FI_DEV_GPU_UTIL, at 0) this long is hung: paged.")
    requeue_hung_jobs: bool = Field(
        False, description="The pool consents to a hung job being requeued (it restarts from its last checkpoint); "
        "off: a hang is paged only.")
    straggler_clock_ratio: float = Field(
        0.8, gt=0, lt=1, description="A node whose GPUs' SM clock (median) is below this fraction of the median of "
        "the job's nodes is a straggler, treated as a degraded node.")
    straggler_after_seconds: int = Field(
        300, ge=1, le=86400, description="How long a node must lag (or hold a hardware slowdown) to be a straggler.")
