"""Prometheus metrics of one app (its own registry, so several apps can live in one process)."""

from __future__ import annotations

import time

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from starlette.types import ASGIApp, Message, Receive, Scope, Send

SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


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
                                   registry=self.registry)
        # the prediction log (serving.log_writer)
        self.log_queue_rows = Gauge("serving_prediction_log_queue_rows", "prediction rows waiting or being written",
                                    registry=self.registry)
        self.log_written_rows = Counter("serving_prediction_log_written_rows", "prediction rows written to the store",
                                        registry=self.registry)
        self.log_dropped_rows = Counter("serving_prediction_log_dropped_rows", "prediction rows not written, by reason "
                                        "(queue_full, store_error, shutdown)", ["reason"], registry=self.registry)
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

    def render(self) -> bytes:
        return generate_latest(self.registry)


class RequestMetrics:
    """ASGI middleware counting requests and timing them, labelled by route template (not raw path)."""

    def __init__(self, app: ASGIApp, metrics: ServiceMetrics):
        self.app, self.metrics = app, metrics

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
            self.metrics.requests.labels(scope["method"], path, str(status)).inc()
            self.metrics.latency.labels(scope["method"], path).observe(time.perf_counter() - start)
