"""serving.rollout on stand-in models: the canary's choice is fixed by the request id and takes its share; a
failed canary call is logged and counted and the champion answers; requests in shadow are bounded (the excess
dropped and counted), run by the challenger together in one call, and logged under each answered request's id."""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass

import numpy as np
import pytest

from serving.metrics import ServiceMetrics
from serving.rollout import Rollout, request_fraction
from serving.settings import ServingSettings


@dataclass
class Model:
    version: str
    alias: str


class Store:
    def __init__(self):
        self.challengers = {"sensor": Model("2", "challenger")}

    def challenger(self, family):
        return self.challengers.get(family)


@dataclass
class Windows:
    """A request's items as the sensor family has them: windows (n, T, C) and each one's unit."""

    windows: np.ndarray
    units: list | None = None

    def __len__(self) -> int:
        return len(self.windows)


class Family:
    """The parts of a served family the rollout uses."""

    name = "sensor"

    def joined(self, items):
        return Windows(np.concatenate([i.windows for i in items]),
                       [u for i in items for u in (i.units or [None] * len(i))])

    def failed_answers(self, items):
        return [{} for _ in range(len(items))]

    def observe(self, items, answers, model):
        pass


class Models:
    """Answers as the champion (v1) or challenger (v2), one answer per window (its probability the window's first
    reading); the challenger fails or waits when told to."""

    def __init__(self, challenger_fails: bool = False):
        self.challenger_fails, self.release = challenger_fails, asyncio.Event()
        self.challenger_calls: list[int] = []  # items per challenger call
        self.challenger_units: list = []  # the windows' units per challenger call
        self.families = {"sensor": Family()}

    def model_of(self, family, role):
        return Model("1", "champion") if role == "champion" else Model("2", "challenger")

    async def predict(self, family, items, role):
        if role == "challenger":
            self.challenger_calls.append(len(items))
            self.challenger_units.append(items.units)
            if self.challenger_fails:
                raise RuntimeError("broken challenger")
            await self.release.wait()
        return [{"failure_probability": float(w[0, 0])} for w in items.windows], self.model_of("sensor", role)


class Log:
    def __init__(self, recorded: list):
        self.recorded = recorded

    async def record(self, family, items, answers, model, call):
        self.recorded.append((model.version, call, answers))


def rollout(mode: str, models: Models, **settings) -> tuple[Rollout, list, ServiceMetrics]:
    metrics, recorded = ServiceMetrics(), []
    serving = Rollout(ServingSettings(rollout=mode, **settings), Store(), models, Log(recorded), metrics)
    return serving, recorded, metrics


def window(value: float, units: list | None = None) -> Windows:
    return Windows(np.full((1, 4, 2), value, dtype=np.float32), units)


def count(metrics: ServiceMetrics, name: str, **labels) -> float:
    return metrics.registry.get_sample_value(name, labels) or 0.0


def test_the_canary_choice_is_fixed_by_the_request_id_and_takes_its_share():
    ids = [uuid.uuid4().hex for _ in range(20_000)]
    assert [request_fraction(i) for i in ids[:50]] == [request_fraction(i) for i in ids[:50]]
    assert sum(request_fraction(i) < 0.3 for i in ids) / len(ids) == pytest.approx(0.3, abs=0.015)
    serving, _, _ = rollout("canary", Models(), canary_share=0.3)
    assert {serving.role_for("sensor", i) for i in ids if request_fraction(i) < 0.3} == {"challenger"}
    assert {serving.role_for("sensor", i) for i in ids if request_fraction(i) >= 0.3} == {"champion"}
    assert serving.role_for("molecule", ids[0]) == "champion"  # no molecule challenger: the champion answers


def test_a_failed_canary_call_is_logged_and_counted_and_the_champion_answers():
    models = Models(challenger_fails=True)
    serving, recorded, metrics = rollout("canary", models, canary_share=1.0)
    answers, model = asyncio.run(serving.serve(Family(), window(0.5)))
    assert model.version == "1" and answers == [{"failure_probability": 0.5}]
    (failed_version, failed, _), (answered_version, answered, _) = recorded
    assert (failed_version, failed.role, failed.failed) == ("2", "challenger", True)
    assert (answered_version, answered.role, answered.failed) == ("1", "champion", False)
    assert failed.request_id == answered.request_id
    assert count(metrics, "serving_model_errors_total", family="sensor", role="challenger") == 1
    assert count(metrics, "serving_model_requests_total", family="sensor", role="champion") == 1


def test_requests_in_shadow_are_bounded_run_together_and_logged_under_each_answered_request():
    async def scenario():
        models = Models()
        serving, recorded, metrics = rollout("shadow", models, shadow_max_pending=3)
        for i in range(5):
            _, model = await serving.serve(Family(), window(i, None if i == 1 else [f"pump-{i}"]))
            assert model.version == "1"  # answered without waiting for the shadow
        assert len(recorded) == 5 and count(metrics, "serving_shadow_dropped_total", family="sensor") == 2
        models.release.set()
        deadline = asyncio.get_running_loop().time() + 10
        while len(recorded) < 8:
            assert asyncio.get_running_loop().time() < deadline, recorded
            await asyncio.sleep(0.01)
        await serving.stop()
        return models, recorded, metrics

    models, recorded, metrics = asyncio.run(scenario())
    assert models.challenger_calls == [3]  # the three requests' windows in one challenger call
    assert models.challenger_units == [["pump-0", None, "pump-2"]]  # each window's unit goes with it
    shadows = [(call, answers) for version, call, answers in recorded if call.role == "shadow"]
    answered = [call.request_id for version, call, _ in recorded if call.role == "champion"]
    assert [call.request_id for call, _ in shadows] == answered[:3]
    assert [answers for _, answers in shadows] == [[{"failure_probability": float(i)}] for i in range(3)]
    assert count(metrics, "serving_model_requests_total", family="sensor", role="shadow") == 3


def test_a_failed_shadow_call_is_logged_for_each_request_and_counted():
    async def scenario():
        models = Models(challenger_fails=True)
        serving, recorded, metrics = rollout("shadow", models)
        for i in range(2):
            await serving.serve(Family(), window(i))
        deadline = asyncio.get_running_loop().time() + 10
        while len(recorded) < 4:
            assert asyncio.get_running_loop().time() < deadline, recorded
            await asyncio.sleep(0.01)
        await serving.stop()
        return recorded, metrics

    recorded, metrics = asyncio.run(scenario())
    shadows = [(call, answers) for version, call, answers in recorded if call.role == "shadow"]
    assert [(call.failed, answers) for call, answers in shadows] == [(True, [{}]), (True, [{}])]
    assert count(metrics, "serving_model_errors_total", family="sensor", role="shadow") == 2


def test_shadow_mirrors_only_its_share_of_the_requests_chosen_by_the_request_id():
    async def scenario(share: float):
        models = Models()
        models.release.set()
        serving, recorded, _ = rollout("shadow", models, shadow_share=share)
        for i in range(40):
            await serving.serve(Family(), window(i))
        answered = {call.request_id for _, call, _ in recorded if call.role == "champion"}
        expected = sum(request_fraction(i) < share for i in answered)
        deadline = asyncio.get_running_loop().time() + 10
        while sum(call.role == "shadow" for _, call, _ in recorded) < expected:  # the mirrored requests' calls
            assert asyncio.get_running_loop().time() < deadline, recorded
            await asyncio.sleep(0.01)
        await serving.stop()
        return answered, {call.request_id for _, call, _ in recorded if call.role == "shadow"}

    for share in (0.0, 0.5, 1.0):
        answered, shadowed = asyncio.run(scenario(share))
        assert len(answered) == 40 and shadowed == {i for i in answered if request_fraction(i) < share}
    assert 0 < len(asyncio.run(scenario(0.5))[1]) < 40
