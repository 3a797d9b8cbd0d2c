"""Reading dcgm-exporter's GPU metrics: from the fleet's Prometheus, or from the exporters' /metrics themselves.
The spec's `healing.telemetry.source` chooses (fleetspec/telemetry_spec.py); both give the same `Sample`s.

- exporter: GET each URL; the body is the Prometheus text format (parsed with prometheus_client's parser, the
  format dcgm-exporter's render_metrics.go writes: github.com/NVIDIA/dcgm-exporter 4.5.3-4.8.2);
- prometheus: one instant query of the fields gpufleet reads, `{__name__=~"DCGM_FI_...|..."}`, through the HTTP API
  (prometheus.io/docs/prometheus/latest/querying/api/ "Instant queries": GET /api/v1/query, `data.resultType`
  "vector", each result's `metric` labels and `value` [unix time, "value"]). Prometheus keeps the exporter's
  labels (`Hostname`, `gpu`, `pci_bus_id`) on the series it scrapes.
A series without `Hostname` or `gpu` names no node's GPU and is skipped. A source that does not answer is a
TemporaryError: the pass tries again; nothing is decided on a read that failed.
"""
from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from datetime import datetime, timezone
from typing import Callable, Protocol

from prometheus_client.parser import text_string_to_metric_families

from gpufleet.fleetspec.faults.telemetry import FIELDS, HOSTNAME
from gpufleet.fleetspec.telemetry_spec import TelemetrySpec

from gpufleet.reconciler.core.telemetry import Sample
from gpufleet.reconciler.errors import TemporaryError

MAX_BODY = 64 * 1024 * 1024  # a fleet's exposition or query answer larger than this is refused, not read whole


class TelemetryReader(Protocol):
    def read(self) -> tuple[list[Sample], dict[tuple[str, str], str]]:
        """The samples of gpufleet's fields, and each (node, GPU)'s PCI bus id."""


def _get(url: str, timeout: float) -> bytes:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:  # noqa: S310 - the spec's http(s) URL
            body = resp.read(MAX_BODY + 1)
    except (urllib.error.URLError, OSError, TimeoutError) as e:
        raise TemporaryError(f"GPU telemetry: {url}: {e}") from e
    if len(body) > MAX_BODY:
        raise TemporaryError(f"GPU telemetry: {url}: answer larger than {MAX_BODY} bytes")
    return body


def _sample(name: str, labels: dict[str, str], value: float, at: datetime,
            pci: dict[tuple[str, str], str]) -> Sample | None:
    node, gpu = labels.get(HOSTNAME), labels.get("gpu")
    if name not in FIELDS or not node or gpu is None:
        return None
    if labels.get("pci_bus_id"):
        pci[(node, gpu)] = labels["pci_bus_id"]
    return Sample(node, gpu, name, value, at, labels.get("pci_bus_id", ""))


def parse_exposition(text: str, at: datetime) -> tuple[list[Sample], dict[tuple[str, str], str]]:
    samples, pci = [], {}
    try:
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                # prometheus_client names a counter's samples `<name>_total` (OpenMetrics); the exporter's are
                # the field's own name
                name = s.name[:-len("_total")] if s.name not in FIELDS and s.name.endswith("_total") else s.name
                got = _sample(name, dict(s.labels), float(s.value), at, pci)
                if got is not None:
                    samples.append(got)
    except ValueError as e:
        raise TemporaryError(f"GPU telemetry: the exposition does not parse: {e}") from e
    return samples, pci


class ExporterReader:
    def __init__(self, urls: list[str], timeout: float, clock: Callable[[], datetime]):
        self.urls, self.timeout, self.clock = urls, timeout, clock

    def read(self):
        samples, pci = [], {}
        for url in self.urls:
            at = self.clock()
            got, where = parse_exposition(_get(url, self.timeout).decode("utf-8", "replace"), at)
            samples += got
            pci.update(where)
        return samples, pci


def query_url(base: str) -> str:
    names = "|".join(sorted(FIELDS))
    return f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": f'{{__name__=~"{names}"}}'})


def parse_query(body: bytes) -> tuple[list[Sample], dict[tuple[str, str], str]]:
    try:
        doc = json.loads(body)
        if doc.get("status") != "success" or doc["data"]["resultType"] != "vector":
            raise TemporaryError(f"GPU telemetry: Prometheus answered {doc.get('status')}: {doc.get('error', '')}")
        samples, pci = [], {}
        for r in doc["data"]["result"]:
            labels, (ts, value) = r["metric"], r["value"]
            got = _sample(labels.get("__name__", ""), labels, float(value),
                          datetime.fromtimestamp(float(ts), timezone.utc), pci)
            if got is not None:
                samples.append(got)
        return samples, pci
    except (ValueError, KeyError, TypeError) as e:
        raise TemporaryError(f"GPU telemetry: Prometheus' answer does not parse: {e}") from e


class PrometheusReader:
    def __init__(self, base: str, timeout: float):
        self.base, self.timeout = base, timeout

    def read(self):
        return parse_query(_get(query_url(self.base), self.timeout))


def reader_for(spec: TelemetrySpec, clock: Callable[[], datetime]) -> TelemetryReader | None:
    if spec.source == "exporter":
        return ExporterReader(list(spec.exporter_urls), spec.timeout_seconds, clock)
    if spec.source == "prometheus":
        assert spec.prometheus_url is not None  # the spec's validation
        return PrometheusReader(spec.prometheus_url, spec.timeout_seconds)
    return None
