"""Prometheus metrics of one app (its own registry, so several apps can live in one process). A service of several
workers shares them: with PROMETHEUS_MULTIPROC_DIR set (`python -m serving` sets it for its workers) each worker keeps
its values in that folder and /metrics, whichever worker answers, renders the whole service's (prometheus_client's
multiprocess mode: counters and histograms summed over workers, gauges summed, maximised or the latest, per gauge)."""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector, mark_process_dead
from starlette.types import ASGIApp, Message, Receive, Scope, Send

SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
# how several workers' values of a gauge make the service's (live workers only)
LATEST, SUMMED, HIGHEST = "livemostrecent", "livesum", "livemax"


class ServiceMetrics:
    """Requests, latencies, request and micro-batch sizes, the model version served, and the prediction log."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter("serving_requests_total", "HTTP requests answered", ["method", "path", "status"],
                                registry=self.registry)
        self.latency = Histogram("serving_request_duration_seconds", "time to answer an HTTP request",
                                 ["method", "path"], registry=self.registry,
                                 buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10))
        self.request_items = Histogram("serving_request_items", "windows or SMILES per prediction request",
                                       ["family"], buckets=SIZES, registry=self.registry)
        self.batch_items = Histogram("serving_batch_items", "items per model call (one micro-batch)",
                                     ["family"], buckets=SIZES, registry=self.registry)
        self.model_version = Gauge("serving_model_version", "registry version being served", ["family", "name"],
                                   registry=self.registry, multiprocess_mode=LATEST)
        # the prediction log (serving.log_writer)
        self.log_queue_rows = Gauge("serving_prediction_log_queue_rows", "prediction rows waiting or being written "
                                    "(as of the last batch sent or written)",
                                    registry=self.registry, multiprocess_mode=SUMMED)
        self.log_written_rows = Counter("serving_prediction_log_written_rows", "prediction rows written to the store",
                                        registry=self.registry)
        self.log_dropped_rows = Counter("serving_prediction_log_dropped_rows", "prediction rows not written, by reason "
                                        "(queue_full, store_error, writer_exited, journal_error, shutdown)",
                                        ["reason"], registry=self.registry)
        self.log_spilled_rows = Gauge("serving_prediction_log_spilled_rows", "prediction rows waiting in the journal "
                                      "alone (the queue was full), read back as the queue drains",
                                      registry=self.registry, multiprocess_mode=SUMMED)
        self.log_rejected_rows = Counter("serving_prediction_log_rejected_rows", "prediction rows the store refused, "
                                         "set aside in its rejected_predictions table", registry=self.registry)
        self.log_failing = Gauge("serving_prediction_log_failing", "1 while the prediction store cannot be written "
                                 "(the writer retries it)", registry=self.registry, multiprocess_mode=HIGHEST)
        # each role's model calls (serving.rollout): champion, challenger (canary), shadow
        self.model_requests = Counter("serving_model_requests", "prediction requests, by the role of the model "
                                      "called", ["family", "role"], registry=self.registry)
        self.model_errors = Counter("serving_model_errors", "prediction requests whose model call failed",
                                    ["family", "role"], registry=self.registry)
        self.model_latency = Histogram("serving_model_duration_seconds", "one request's model call (queueing and "
                                       "featurisation included)", ["family", "role"], registry=self.registry,
                                       buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10))
        self.shadow_dropped = Counter("serving_shadow_dropped", "shadow calls not made: SERVING_SHADOW_MAX_PENDING "
                                      "were pending", ["family"], registry=self.registry)
        self.log_pruned_rows = Counter("serving_prediction_log_pruned_rows", "prediction rows deleted by retention "
                                       "and size limits", registry=self.registry)

        # the service's own monitoring (serving.monitoring), recomputed every SERVING_MONITOR_SECONDS
        self.input_psi = Gauge("serving_input_psi", "sensor: PSI of recent windows' channel means against the served "
                               "version's training reference", ["family", "channel"],
                               registry=self.registry, multiprocess_mode=LATEST)
        self.input_ks = Gauge("serving_input_ks", "sensor: Kolmogorov-Smirnov statistic of recent windows' channel "
                              "means against the training sample", ["family", "channel"],
                              registry=self.registry, multiprocess_mode=LATEST)
        self.monitor_items = Gauge("serving_monitor_items", "recent inputs (kind=inputs) and labelled outcomes "
                                   "(kind=outcomes) the monitoring figures are computed on", ["family", "kind"],
                                   registry=self.registry, multiprocess_mode=LATEST)
        self.out_of_domain = Gauge("serving_out_of_domain_share", "molecule: share of recent molecules outside the "
                                   "applicability domain", ["family"], registry=self.registry, multiprocess_mode=LATEST)
        self.nearest_similarity = Gauge("serving_nearest_similarity_mean", "molecule: mean Tanimoto similarity of "
                                        "recent molecules to their nearest training molecule", ["family"],
                                        registry=self.registry, multiprocess_mode=LATEST)
        self.outcome_metric = Gauge("serving_outcome_metric", "quality of the served version's recent labelled "
                                    "outcomes (brier, ece, pr_auc; rmse, coverage)", ["family", "metric"],
                                    registry=self.registry, multiprocess_mode=LATEST)
        self.monitor_alarm = Gauge("serving_monitor_alarm", "1 when a monitoring threshold is crossed (check: "
                                   "input_drift, domain, calibration)", ["family", "check"],
                                   registry=self.registry, multiprocess_mode=LATEST)
        self.monitor_computed = Gauge("serving_monitor_computed_timestamp_seconds", "when the monitoring figures "
                                      "were last computed (Unix time)", ["family"],
                                      registry=self.registry, multiprocess_mode=LATEST)

    def show_monitoring(self, families: dict[str, dict]) -> None:
        """Set the monitoring gauges to serving.monitoring's figures per family (undefined ones are left out)."""
        gauges = (self.input_psi, self.input_ks, self.monitor_items, self.out_of_domain, self.nearest_similarity,
                  self.outcome_metric, self.monitor_alarm, self.monitor_computed)
        for gauge in gauges:
            gauge.clear()

        def put(gauge: Gauge, value, *labels: str) -> None:
            if value is not None and value == value:
                gauge.labels(*labels).set(float(value))

        for family, report in families.items():
            drift, domain, outcomes = report.get("input_drift"), report.get("domain"), report.get("outcomes")
            if drift:
                put(self.monitor_items, drift["windows"], family, "inputs")
                put(self.monitor_alarm, drift["alarm"], family, "input_drift")
                for channel in drift["channels"]:
                    put(self.input_psi, channel["psi"], family, channel["channel"])
                    put(self.input_ks, channel["ks"], family, channel["channel"])
            if domain:
                put(self.monitor_items, domain["molecules"], family, "inputs")
                put(self.monitor_alarm, domain["alarm"], family, "domain")
                put(self.out_of_domain, domain["out_of_domain"], family)
                put(self.nearest_similarity, domain["nearest_similarity_mean"], family)
            if outcomes:
                put(self.monitor_items, outcomes["outcomes"], family, "outcomes")
                put(self.monitor_alarm, outcomes["alarm"], family, "calibration")
                for metric, value in outcomes["metrics"].items():
                    put(self.outcome_metric, value, family, metric)
            if report.get("model"):
                put(self.monitor_computed, time.time(), family)

    def render(self) -> bytes:
        """The exposition text: this app's, or with PROMETHEUS_MULTIPROC_DIR every live worker's together."""
        folder = os.environ.get(MULTIPROCESS_FOLDER)
        if not folder:
            return generate_latest(self.registry)
        forget_dead_workers(Path(folder))
        registry = CollectorRegistry()
        MultiProcessCollector(registry, path=folder)
        return generate_latest(registry)

    def leave(self) -> None:
        """This worker stops: its gauges leave the service's figures (its counts stay in them)."""
        if os.environ.get(MULTIPROCESS_FOLDER):
            mark_process_dead(os.getpid())


MULTIPROCESS_FOLDER = "PROMETHEUS_MULTIPROC_DIR"
_LIVE_GAUGE_FILE = re.compile(r"gauge_live\w+_(\d+)\.db")


def forget_dead_workers(folder: Path) -> None:
    """Drop the gauges of workers that ended without leaving (killed outright), so that live-worker gauges count
    live workers only."""
    pids = {int(m.group(1)) for path in folder.glob("gauge_live*.db") if (m := _LIVE_GAUGE_FILE.fullmatch(path.name))}
    for pid in pids:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            mark_process_dead(pid, str(folder))
        except PermissionError:  # alive, another user's
            pass


class RequestMetrics:
    """ASGI middleware counting requests and timing them, labelled by route template (not raw path)."""

    def __init__(self, app: ASGIApp, metrics: ServiceMetrics):
        self.app, self.metrics = app, metrics
        self._counters: dict[tuple[str, str, str], Counter] = {}  # labelled children, looked up once
        self._timers: dict[tuple[str, str], Histogram] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start, status = time.perf_counter(), 500

        async def record_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, record_status)
        finally:
            route = scope.get("route")
            path = getattr(route, "path", "other")
            method = scope["method"]
            counter = self._counters.get((method, path, status))
            if counter is None:
                counter = self._counters[method, path, status] = self.metrics.requests.labels(method, path, str(status))
            timer = self._timers.get((method, path))
            if timer is None:
                timer = self._timers[method, path] = self.metrics.latency.labels(method, path)
            counter.inc()
            timer.observe(time.perf_counter() - start)
