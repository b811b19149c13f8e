"""Who answers a prediction request: the champion, or under SERVING_ROLLOUT the `challenger` alias too.

- off: the champion answers; the challenger is not loaded.
- shadow: the champion answers; for SERVING_SHADOW_SHARE of the requests (all by default, chosen by a hash of the
  request id), after its answer is made, the request's items wait (SHADOW_LINGER_S at most) to
  be run by the challenger together with the other requests' items, in one call of its own batcher and model
  thread (never in the champion's queue); its rows are logged with role `shadow` and each request's id. Nobody
  waits for a shadow answer, so batching them costs no latency and saves most of a call's fixed cost. At most
  SERVING_SHADOW_MAX_PENDING requests wait or run in shadow; more are dropped and counted.
- canary: the challenger answers SERVING_CANARY_SHARE of the requests, chosen by a hash of the request id; its
  rows have role `challenger` and the response names it. A failed challenger call is logged and counted, and the
  champion answers the request instead.

Every call is timed and counted per family and role (serving.metrics), and its latency and failure go into its
rows of the prediction store, for the rollout judge of the `monitor` flow (docs/how-to/monitor.md).
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Sequence
from dataclasses import dataclass

from contract.registry import CHALLENGER, CHAMPION
from serving.batching import BatcherClosed
from serving.family import ServedFamily
from serving.loading import LoadedModel
from serving.metrics import ServiceMetrics
from serving.predict import Predictions
from serving.prediction_log import Call, PredictionLog, new_request_id
from serving.settings import ServingSettings
from serving.served_models import ServedModels

SHADOW = "shadow"
SHADOW_LINGER_S = 0.05  # how long a request's shadow items wait for others to share the challenger's call


@dataclass
class ShadowItems:
    """One answered request's items, waiting for the challenger."""

    request_id: str
    items: Sequence


def request_fraction(request_id: str) -> float:
    """A number in [0, 1) fixed by the request id: the request goes to the canary, or runs in shadow too, when it is
    below that mode's share."""
    return int(hashlib.sha256(request_id.encode()).hexdigest()[:8], 16) / 2**32


class Rollout:
    """Answers the prediction routes per SERVING_ROLLOUT; `stop` belongs to the app's lifespan."""

    def __init__(self, settings: ServingSettings, store: ServedModels, predictions: Predictions, log: PredictionLog,
                 metrics: ServiceMetrics):
        self.mode, self.share, self.max_pending = settings.rollout, settings.canary_share, settings.shadow_max_pending
        self.shadow_share = settings.shadow_share
        self.store, self.predictions, self.log, self.metrics = store, predictions, log, metrics
        self._shadow_waiting: dict[str, list[ShadowItems]] = {name: [] for name in predictions.families}
        self._shadow_pending = 0  # requests waiting or running in shadow
        self._shadow_runners: dict[str, asyncio.Task] = {}  # per family, while its shadow items are being run

    def describe(self) -> dict:
        """serving.schemas.RolloutInfo's fields."""
        return {"mode": self.mode, "canary_share": self.share if self.mode == "canary" else None,
                "shadow_share": self.shadow_share if self.mode == SHADOW else None,
                "challengers": [m.describe() for m in self.store.challengers.values()]}

    def role_for(self, family: str, request_id: str, pinned: bool = False) -> str:
        """The role that answers the request: the champion, or in canary mode the challenger for its share of the
        requests (never for a request `pinned` to the champion's version)."""
        if self.mode == "canary" and not pinned and self.store.challenger(family) is not None \
                and request_fraction(request_id) < self.share:
            return CHALLENGER
        return CHAMPION

    async def serve(self, family: ServedFamily, items: Sequence, pinned: bool = False
                    ) -> tuple[list[dict], LoadedModel]:
        """`items` -> the answers (with their `prediction_id`, or an `error`) and the model that gave them (the
        champion when `pinned`); the family keeps what its monitoring needs, and in shadow mode the challenger
        runs the items too."""
        self.metrics.request_items.labels(family.name).observe(len(items))
        request_id = new_request_id()
        answers = None
        if self.role_for(family.name, request_id, pinned) == CHALLENGER:
            try:
                answers, model = await self._call(family, CHALLENGER, request_id, items)
            except BatcherClosed:
                raise
            except Exception:  # logged and counted by _call: the champion answers instead
                pass
        if answers is None:
            answers, model = await self._call(family, CHAMPION, request_id, items)
            if self.mode == SHADOW and request_fraction(request_id) < self.shadow_share:
                self._shadow(family, ShadowItems(request_id, items))
        return answers, model

    async def _call(self, family: ServedFamily, role: str, request_id: str,
                    items: Sequence) -> tuple[list[dict], LoadedModel]:
        """One timed model call of `role`, counted and logged."""
        model = self.predictions.model_of(family.name, role)
        self.metrics.model_requests.labels(family.name, role).inc()
        start = time.perf_counter()
        try:
            answers, model = await self.predictions.predict(family, items, role)
        except BatcherClosed:  # the service stops: no verdict on the model (a cancelled caller is none either)
            raise
        except Exception:
            latency = time.perf_counter() - start
            self.metrics.model_errors.labels(family.name, role).inc()
            self.metrics.model_latency.labels(family.name, role).observe(latency)
            await self.log.record(family, items, family.failed_answers(items), model,
                            Call(request_id, role, latency * 1000, failed=True))
            raise
        latency = time.perf_counter() - start
        self.metrics.model_latency.labels(family.name, role).observe(latency)
        await self.log.record(family, items, answers, model, Call(request_id, role, latency * 1000))
        return answers, model

    def _shadow(self, family: ServedFamily, items: ShadowItems) -> None:
        """Queue the request's items for the challenger's next shadow call (or drop and count them)."""
        if self.store.challenger(family.name) is None:
            return
        if self._shadow_pending >= self.max_pending:
            self.metrics.shadow_dropped.labels(family.name).inc()
            return
        self._shadow_pending += 1
        self._shadow_waiting[family.name].append(items)
        if family.name not in self._shadow_runners:
            runner = asyncio.create_task(self._run_shadows(family))
            self._shadow_runners[family.name] = runner
            runner.add_done_callback(lambda _: self._shadow_runners.pop(family.name, None))

    async def _run_shadows(self, family: ServedFamily) -> None:
        """While requests wait in shadow: after SHADOW_LINGER_S, run all that wait in one challenger call and log
        each request's rows under its own id."""
        while self._shadow_waiting[family.name]:
            await asyncio.sleep(SHADOW_LINGER_S)
            waiting, self._shadow_waiting[family.name] = self._shadow_waiting[family.name], []
            try:
                await self._shadow_call(family, waiting)
            finally:
                self._shadow_pending -= len(waiting)

    async def _shadow_call(self, family: ServedFamily, waiting: list[ShadowItems]) -> None:
        """One challenger call on the items of `waiting`; each request's rows carry the call's latency."""
        model = self.store.challenger(family.name)
        if model is None:  # the challenger went away while the items waited: nothing to run or log
            return
        self.metrics.model_requests.labels(family.name, SHADOW).inc(len(waiting))
        start = time.perf_counter()
        try:
            answers, model = await self.predictions.predict(family, family.joined([w.items for w in waiting]),
                                                            CHALLENGER)
            failed = False
        except BatcherClosed:  # the service stops: no verdict on the model
            return
        except Exception:  # nobody waits for a shadow answer: the failure is counted and logged
            answers, failed = [], True
            self.metrics.model_errors.labels(family.name, SHADOW).inc(len(waiting))
        latency = time.perf_counter() - start
        offset = 0
        for w in waiting:
            self.metrics.model_latency.labels(family.name, SHADOW).observe(latency)
            part = family.failed_answers(w.items) if failed else answers[offset:offset + len(w.items)]
            await self.log.record(family, w.items, part, model, Call(w.request_id, SHADOW, latency * 1000,
                                                                      failed=failed))
            offset += len(w.items)

    async def stop(self) -> None:
        """Cancel the shadow calls still waiting or running."""
        runners = list(self._shadow_runners.values())
        for runner in runners:
            runner.cancel()
        await asyncio.gather(*runners, return_exceptions=True)
