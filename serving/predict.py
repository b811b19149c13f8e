"""The prediction path behind the routes, for any family: items in, one answer per item out, through the family's
`preprocess`, the fair micro-batchers (serving.batching) and its `predict` on a model thread, then its
`postprocess`. The champion and the challenger (serving.rollout) each have their own batchers and model threads,
so a challenger call never queues a champion call; in shadow mode the challenger's thread runs at the lowest CPU
priority."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from contract.registry import CHALLENGER, CHAMPION
from serving.batching import Batcher
from serving.errors import NotReady
from serving.family import ServedFamily
from serving.loading import LoadedModel
from serving.metrics import ServiceMetrics
from serving.settings import ServingSettings
from serving.served_models import ServedModels

ROLES = (CHAMPION, CHALLENGER)


class Predictions:
    """Owns each family's batchers and model threads; `start` and `stop` belong to the app's lifespan."""

    def __init__(self, store: ServedModels, settings: ServingSettings, metrics: ServiceMetrics,
                 families: dict[str, ServedFamily]):
        self.store, self.families = store, families
        batch = dict(max_items=settings.batch_max_items, max_bytes=settings.batch_max_bytes, share=settings.batch_share)
        self.batchers = {(name, role): Batcher(functools.partial(self._run, family, role), **batch,
                                               size_of=family.size_of,
                                               on_batch=metrics.batch_items.labels(name).observe)
                         for name, family in families.items() for role in ROLES}
        # one thread per family and role: a model call never waits for another family's or the challenger's. In
        # shadow mode nobody waits for the challenger: its calls always run in its thread, at the lowest CPU
        # priority, so that they take only what the champion leaves
        self._background = {CHALLENGER} if settings.rollout == "shadow" else set()
        self._threads = {(name, role): ThreadPoolExecutor(1, thread_name_prefix=f"onnxruntime-{name}-{role}",
                                                          initializer=_lowest_priority if role in self._background
                                                          else None)
                         for name in families for role in ROLES}

    def model_of(self, family: str, role: str = CHAMPION) -> LoadedModel:
        """The model of `family` answering as `role` (`champion` or `challenger`); NotReady when none is loaded."""
        model = self.store.get(family) if role == CHAMPION else self.store.challenger(family)
        if model is None:
            if role == CHAMPION:
                raise NotReady(f"no {family} model is loaded yet: {self.store.problems.get(family, 'loading')}")
            raise NotReady(f"no {family} challenger is loaded: {self.store.problems.get(f'{family}.{role}', 'none')}")
        return model

    async def predict(self, family: ServedFamily, items: Sequence, role: str = CHAMPION
                      ) -> tuple[list[dict], LoadedModel]:
        """The answers of `items` (one per item) and the model (of `role`) that gave them."""
        model = self.model_of(family.name, role)
        prepared = await family.preprocess(items, model)
        if len(prepared.batch):
            outputs, model = await self.batchers[family.name, role].submit(prepared.batch)
        else:
            outputs = []
        return family.postprocess(items, prepared, outputs, model), model

    async def _run(self, family: ServedFamily, role: str, parts: list[Sequence]) -> tuple[list[list], LoadedModel]:
        if role not in self._background and sum(len(part) for part in parts) <= family.inline_max_items:
            # cheaper than a thread hop
            return self._call(family, role, parts)
        return await asyncio.get_running_loop().run_in_executor(self._threads[family.name, role], self._call,
                                                                family, role, parts)

    def _call(self, family: ServedFamily, role: str, parts: list[Sequence]) -> tuple[list[list], LoadedModel]:
        model = self.model_of(family.name, role)
        return _split(family.predict(model, parts), parts), model

    async def start(self) -> None:
        for family in self.families.values():
            await family.start()

    def close(self) -> None:
        """Refuse new work and answer the waiting requests 'shutting down' (what is in flight finishes)."""
        for batcher in self.batchers.values():
            batcher.close()
        for family in self.families.values():
            family.close()

    async def stop(self) -> None:
        """Close, end the families' workers, wait for the model calls in flight, end the model threads."""
        self.close()
        for family in self.families.values():
            await family.stop()
        for batcher in self.batchers.values():
            await batcher.drain()
        for threads in self._threads.values():
            threads.shutdown(wait=True)


def _lowest_priority() -> None:
    """This thread runs at niceness 19 (Linux schedules threads one by one; elsewhere nothing changes)."""
    with contextlib.suppress(AttributeError, OSError):
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)


def _split(rows: list, parts: Sequence[Sequence]) -> list[list]:
    out, start = [], 0
    for part in parts:
        out.append(rows[start:start + len(part)])
        start += len(part)
    return out
