"""bench/sensor_benchmark.py: its headline is params.yaml's detector as it is; an ablation is params.yaml with the
keys its recipe file sets, and nothing else."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import sensor_benchmark as bench
from data.sensors.config import SensorDataConfig, SimulatorConfig
from flows.params import load_params, with_overrides
from models.sensor.network import SensorClassifier
from tests.unit.test_params import settings

PROJECT = Path(__file__).resolve().parents[2]
FLEET = SensorDataConfig(window=16, stride=8, horizon=16, reference_steps=40,
                         simulator=SimulatorConfig(n_units=12, n_steps=200, failure_fraction=0.5))


@pytest.mark.parametrize("name", sorted(bench.ablations()))
def test_an_ablation_changes_params_yaml_in_the_keys_it_names_only(name):
    params = load_params(PROJECT / "params.yaml")
    sets = bench.ablations()[name]["sets"]
    ablated = with_overrides(params, {f"sensor.{key}": value for key, value in sets.items()}).sensor
    changed = {key for key, value in settings(ablated).items() if settings(params.sensor)[key] != value}
    assert changed == set(sets), name


def test_the_headline_trains_params_yaml_as_it_is_and_an_ablation_its_overlay(monkeypatch):
    trained_with = []

    def untrained(sensor, x, y, seed, device, make_encoder=None):  # the members as training would hand them over
        trained_with.append(sensor)
        return [SensorClassifier(x["train"].shape[1], sensor.model).fit_statistics(x["train"]) for _ in range(2)], None

    monkeypatch.setattr(bench, "trained", untrained)
    record = bench.run_condition("tiny", 0.0, 0, ["defaults", "plain_ce"], 0, FLEET)
    params = load_params(PROJECT / "params.yaml")
    plain_ce = {f"sensor.{key}": value for key, value in bench.ablations()["plain_ce"]["sets"].items()}
    assert trained_with == [params.sensor, with_overrides(params, plain_ce).sensor]
    for key in ("hist_gradient_boosting", "ours_defaults", "ours_no_calibration", "ours_without_level", "ours_plain_ce"):
        assert 0 <= record[key]["pr_auc"] <= 1, key
    assert "ours_full" not in record and "minirocket" not in record  # no MiniRocket features asked for
    assert set(record["seconds"]) == {"hist_gradient_boosting", "ours_defaults", "ours_plain_ce"}
