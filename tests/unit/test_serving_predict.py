"""serving.predict's model threads: in shadow mode the challenger's calls run in its own thread at the lowest CPU
priority (never inline on the event loop); the champion's small calls stay inline."""

from __future__ import annotations

import asyncio
import os
import sys
import threading

import pytest

from contract.registry import CHALLENGER, CHAMPION
from serving.metrics import ServiceMetrics
from serving.predict import Predictions
from serving.settings import ServingSettings


class Store:
    """A champion and a challenger: only the call's thread matters here."""

    def get(self, family):
        return "champion-model"

    def challenger(self, family):
        return "challenger-model"


class Family:
    name, inline_max_items = "sensor", 16

    def __init__(self):
        self.calls = []

    def size_of(self, item) -> int:
        return 1

    def predict(self, model, parts):
        thread = threading.get_native_id()
        self.calls.append((model, thread, os.getpriority(os.PRIO_PROCESS, thread)))
        return [0.0 for part in parts for _ in part]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread priorities are Linux's")
@pytest.mark.parametrize("rollout", ["shadow", "canary"])
def test_the_challenger_runs_at_the_lowest_priority_in_shadow_mode_only(rollout):
    family = Family()
    predictions = Predictions(Store(), ServingSettings(rollout=rollout), ServiceMetrics(), {"sensor": family})

    async def calls() -> int:
        await predictions._run(family, CHAMPION, [[1, 2]])
        await predictions._run(family, CHALLENGER, [[1, 2]])
        return threading.get_native_id()

    loop_thread = asyncio.run(calls())
    (_, champion_thread, champion_nice), (_, challenger_thread, challenger_nice) = family.calls
    own = os.getpriority(os.PRIO_PROCESS, 0)
    assert (champion_thread, champion_nice) == (loop_thread, own)  # inline, at the service's priority
    if rollout == "shadow":
        assert challenger_thread != loop_thread and challenger_nice == 19
    else:  # a canary answers clients: as the champion
        assert (challenger_thread, challenger_nice) == (loop_thread, own)
