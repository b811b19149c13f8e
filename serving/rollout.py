"""Who answers a prediction request: the champion, or under SERVING_ROLLOUT the `challenger` alias too.

- off: the champion answers; the challenger is not loaded.
- shadow: the champion answers; after its answer is made, the challenger runs the same items in its own batcher
  and model thread (never in the champion's queue), its rows logged with role `shadow` and the request's id. At
  most SERVING_SHADOW_MAX_PENDING shadow calls wait or run; more are dropped and counted.
- canary: the challenger answers SERVING_CANARY_SHARE of the requests, chosen by a hash of the request id; its
  rows have role `challenger` and the response names it. A failed challenger call is logged and counted, and the
  champion answers the request instead.

Every call is timed and counted per family and role (serving.metrics), and its latency and failure go into its
rows of the prediction store, for the rollout judge of the `monitor` flow (docs/monitoring.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import time
from collections.abc import Awaitable, Callable, Sequence

import numpy as np

from contract.registry import CHALLENGER, CHAMPION
from serving.batching import BatcherClosed
from serving.loading import LoadedModel
from serving.metrics import ServiceMetrics
from serving.predict import Predictions
from serving.prediction_log import Call, PredictionLog, new_request_id
from serving.settings import ServingSettings
from serving.store import ModelStore

SHADOW = "shadow"
ModelCall = Callable[[str], Awaitable[tuple[list[dict], LoadedModel]]]  # role -> (answers, model)
Record = Callable[[list[dict], LoadedModel, Call], None]  # answers (or placeholders), model, call -> queue rows


def canary_fraction(request_id: str) -> float:
    """A number in [0, 1) fixed by the request id: the request goes to the canary when it is below the share."""
    return int(hashlib.sha256(request_id.encode()).hexdigest()[:8], 16) / 2**32


class Rollout:
    """Answers the /v1 prediction routes per SERVING_ROLLOUT; `stop` belongs to the app's lifespan."""

    def __init__(self, settings: ServingSettings, store: ModelStore, predictions: Predictions, log: PredictionLog,
                 metrics: ServiceMetrics):
        self.mode, self.share, self.max_pending = settings.rollout, settings.canary_share, settings.shadow_max_pending
        self.store, self.predictions, self.log, self.metrics = store, predictions, log, metrics
        self._shadows: set[asyncio.Task] = set()

    def describe(self) -> dict:
        """serving.schemas.RolloutInfo's fields."""
        return {"mode": self.mode, "canary_share": self.share if self.mode == "canary" else None,
                "challengers": [m.describe() for m in self.store.challengers.values()]}

    def role_for(self, family: str, request_id: str) -> str:
        if self.mode == "canary" and self.store.challenger(family) is not None \
                and canary_fraction(request_id) < self.share:
            return CHALLENGER
        return CHAMPION

    async def windows(self, windows: np.ndarray, units: Sequence[str] | None,
                      times: Sequence[float] | None) -> tuple[list[dict], LoadedModel]:
        """Windows (n, T, C) -> the answers (with their `prediction_id`) and the model that gave them."""
        def record(answers: list[dict], model: LoadedModel, call: Call) -> None:
            self.log.record_windows(windows, answers, model, units, times, call)

        return await self._serve("sensor", lambda role: self.predictions.predict_windows(windows, role), record,
                                 lambda: [{} for _ in range(len(windows))])

    async def smiles(self, smiles: Sequence[str]) -> tuple[list[dict], LoadedModel]:
        """SMILES -> the answers (with their `prediction_id`, or an `error`) and the model that gave them."""
        def record(answers: list[dict], model: LoadedModel, call: Call) -> None:
            self.log.record_smiles(answers, model, call)

        return await self._serve("molecule", lambda role: self.predictions.predict_smiles(smiles, role), record,
                                 lambda: [{"smiles": s, "canonical_smiles": None} for s in smiles])

    async def _serve(self, family: str, predict: ModelCall, record: Record,
                     failed_answers: Callable[[], list[dict]]) -> tuple[list[dict], LoadedModel]:
        request_id = new_request_id()
        role = self.role_for(family, request_id)
        if role == CHALLENGER:
            try:
                return await self._call(family, role, request_id, predict, record, failed_answers)
            except BatcherClosed:
                raise
            except Exception:  # logged and counted by _call: the champion answers instead
                pass
        answers, model = await self._call(family, CHAMPION, request_id, predict, record, failed_answers)
        if self.mode == SHADOW:
            self._shadow(family, request_id, predict, record, failed_answers)
        return answers, model

    async def _call(self, family: str, role: str, request_id: str, predict: ModelCall, record: Record,
                    failed_answers: Callable[[], list[dict]],
                    logged_as: str | None = None) -> tuple[list[dict], LoadedModel]:
        """One timed model call of `role`, counted and recorded as `logged_as` (default: `role`)."""
        logged_as = logged_as or role
        model = self.predictions.model_of(family, role)
        self.metrics.model_requests.labels(family, logged_as).inc()
        start = time.perf_counter()
        try:
            answers, model = await predict(role)
        except BatcherClosed:  # the service stops: no verdict on the model (a cancelled caller is none either)
            raise
        except Exception:
            latency = time.perf_counter() - start
            self.metrics.model_errors.labels(family, logged_as).inc()
            self.metrics.model_latency.labels(family, logged_as).observe(latency)
            record(failed_answers(), model, Call(request_id, logged_as, latency * 1000, failed=True))
            raise
        latency = time.perf_counter() - start
        self.metrics.model_latency.labels(family, logged_as).observe(latency)
        record(answers, model, Call(request_id, logged_as, latency * 1000))
        return answers, model

    def _shadow(self, family: str, request_id: str, predict: ModelCall, record: Record,
                failed_answers: Callable[[], list[dict]]) -> None:
        """Start the challenger's call on the request's items in the background (or drop and count it)."""
        if self.store.challenger(family) is None:
            return
        if len(self._shadows) >= self.max_pending:
            self.metrics.shadow_dropped.labels(family).inc()
            return

        async def shadow() -> None:
            with contextlib.suppress(Exception):  # counted and logged by _call; nobody waits for the answer
                await self._call(family, CHALLENGER, request_id, predict, record, failed_answers, logged_as=SHADOW)

        task = asyncio.create_task(shadow())
        self._shadows.add(task)
        task.add_done_callback(self._shadows.discard)

    async def stop(self) -> None:
        """Cancel the shadow calls still waiting or running."""
        for task in list(self._shadows):
            task.cancel()
        await asyncio.gather(*self._shadows, return_exceptions=True)
