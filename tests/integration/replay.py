"""Replaying the drift scenario's fleet (bench/drift_scenario.py) through the real app's HTTP API, as a fleet
would: the sensor family served from a scratch workspace's registry, windows sent with their units and times,
outcomes sent back to /v1/feedback."""

from __future__ import annotations

import time

import numpy as np
from fastapi.testclient import TestClient

from contract.registry import CHALLENGER, CHAMPION, RegistrySettings
from serving.app import create_app
from serving.settings import ServingSettings
from serving.served_models import ServedModels

FEEDBACK_ITEMS = 200  # outcomes per /v1/feedback request


def window_json(window: np.ndarray) -> list:
    """(C, T) -> the API's T lists of C values (null for a missing reading)."""
    return [[None if np.isnan(v) else float(v) for v in step] for step in window.T]


def service(params_file, store_url: str, rollout: str = "off", canary_share: float = 0.1) -> TestClient:
    """The app serving the sensor family only (the scenario has no molecule model), so /ready means it."""
    settings = ServingSettings(params_file=str(params_file), prediction_store=store_url, rollout=rollout,
                               canary_share=canary_share, prefer_cuda=False, poll_seconds=3600, featurize_workers=1)
    registry = RegistrySettings.from_params(params_file)
    store = ServedModels(registry.tracking_uri, {"sensor": registry.model_names["sensor"]}, CHAMPION,
                       registry.verify_key, prefer_cuda=False, challenger_alias=CHALLENGER)
    return TestClient(create_app(settings, store=store))


def wait_for_challenger(client: TestClient, timeout: float = 60.0) -> dict:
    deadline = time.monotonic() + timeout
    while not (models := client.get("/v1/models").json())["rollout"]["challengers"]:
        assert time.monotonic() < deadline, models
        time.sleep(0.05)
    return models


def predict(client: TestClient, stream, start: int, count: int) -> dict:
    """POST windows start..start+count of `stream` with their units and times; the answer's JSON."""
    windows = stream.windows
    body = {"windows": [window_json(w) for w in windows.X[start:start + count]],
            "units": [str(u) for u in windows.unit[start:start + count]],
            "times": [float(t) for t in windows.time[start:start + count]]}
    answer = client.post("/v1/sensor/predict", json=body)
    assert answer.status_code == 200, answer.text
    return answer.json()


def send_outcomes(client: TestClient, outcomes: list[dict]) -> None:
    """POST `outcomes` to /v1/feedback, FEEDBACK_ITEMS per request; every one must be accepted."""
    for start in range(0, len(outcomes), FEEDBACK_ITEMS):
        part = outcomes[start:start + FEEDBACK_ITEMS]
        answer = client.post("/v1/feedback", json={"outcomes": part})
        assert answer.status_code == 200 and answer.json()["accepted"] == len(part), answer.text
