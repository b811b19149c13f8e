"""docs/results.md and its plots are what bench/report.py makes of the committed bench/results/*.json."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

from bench.report import write_report

PROJECT = Path(__file__).resolve().parents[2]
RESULTS = PROJECT / "bench" / "results"
DOCS = PROJECT / "docs"


def test_committed_report_is_regenerated_byte_for_byte(tmp_path: Path) -> None:
    out = write_report(RESULTS, tmp_path)
    assert out.read_text() == (DOCS / "results.md").read_text(), "docs/results.md is stale: run `make report`"
    made = {path.name: path.read_bytes() for path in (tmp_path / "results").glob("*.png")}
    committed = {path.name: path.read_bytes() for path in (DOCS / "results").glob("*.png")}
    assert made.keys() == committed.keys()
    assert [name for name in made if made[name] != committed[name]] == []
    for name in made:
        assert f"](results/{name})" in out.read_text()


def test_every_script_the_report_names_exists(tmp_path: Path) -> None:
    """A results file names its script at the top level or in its meta; the report names a script that is there."""
    named = re.findall(r"\(`(bench/[\w/]+\.py)[^`]*`\)", write_report(RESULTS, tmp_path).read_text())
    assert "bench/tune_benchmark.py" in named
    assert [script for script in named if not (PROJECT / script).exists()] == []


def test_mean_and_sd_over_seeds_and_the_reference_rows(tmp_path: Path) -> None:
    """Two seeds of one condition: mean ± population sd and the per-seed values; FD001 gets ANCHORS.md's rows."""
    results = tmp_path / "bench"
    results.mkdir()
    method = {"pr_auc": 0.9, "ece": 0.05, "roc_auc": 0.95, "recall_at_p90": 0.5, "brier": 0.1}
    runs = {f"fd001/flip0.0/seed{seed}": {"dataset": "fd001", "flip": 0.0, "seed": seed,
                                           "hist_gradient_boosting": {**method, "pr_auc": pr},
                                           "ours_full": {**method, "pr_auc": pr + 0.05}}
            for seed, pr in [(0, 0.90), (1, 0.94)]}
    (results / "sensor.json").write_text(json.dumps(runs))
    text = write_report(results, tmp_path / "docs").read_text()
    hgb = next(line for line in text.splitlines() if line.startswith("| HGB ") and "baseline" in line)
    assert "0.920 ± 0.020" in hgb and "0: 0.900, 1: 0.940" in hgb
    ours = next(line for line in text.splitlines() if line.startswith("| **ours, benchmark recipe (full)**"))
    assert "0.970 ± 0.020" in ours  # the headline where params.yaml's defaults were not measured
    reference = next(line for line in text.splitlines() if line.startswith("| HGB ") and "reference" in line)
    assert "0.975 ± 0.003" in reference
    assert (tmp_path / "docs" / "results" / "sensor_fd001.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_sensor_headline_is_params_yaml_s_defaults_where_measured(tmp_path: Path) -> None:
    results = tmp_path / "bench"
    results.mkdir()
    method = {"pr_auc": 0.9, "ece": 0.05, "roc_auc": 0.95, "recall_at_p90": 0.5, "brier": 0.1}
    runs = {"fd001/flip0.0/seed0": {"dataset": "fd001", "flip": 0.0, "seed": 0, "ours_full": method,
                                    "ours_defaults": {**method, "pr_auc": 0.8}}}
    (results / "sensor.json").write_text(json.dumps(runs))
    lines = write_report(results, tmp_path / "docs").read_text().splitlines()
    bold = [line for line in lines if line.startswith("| **")]
    assert len(bold) == 1 and bold[0].startswith("| **ours, params.yaml defaults**") and "0.800" in bold[0]
    assert any(line.startswith("| ours, benchmark recipe (full) ") and "ablation" in line for line in lines)


def test_recurrent_encoders_are_set_beside_ours_with_their_size_and_time(tmp_path: Path) -> None:
    results = tmp_path / "bench"
    results.mkdir()
    method = {"pr_auc": 0.9, "ece": 0.05, "roc_auc": 0.95, "recall_at_p90": 0.5, "brier": 0.1}
    runs = {f"skab/flip0.0/seed{seed}": {
        "dataset": "skab", "flip": 0.0, "seed": seed, "ours_full": {**method, "pr_auc": 0.8 + seed / 10},
        "recurrent_gru": {**method, "pr_auc": 0.6 + seed / 10, "hidden": 21, "encoder_parameters": 12345,
                          "ours_encoder_parameters": 12000, "ms_per_window": 0.01 * (1 + seed),
                          "ours_ms_per_window": 0.02}} for seed in (0, 1)}
    (results / "sensor.json").write_text(json.dumps(runs))
    lines = write_report(results, tmp_path / "docs").read_text().splitlines()
    start = lines.index("### Recurrent encoders at our encoder's parameter count")
    assert lines[start + 4] == "skab, clean labels, seeds 0, 1:"
    ours = next(line for line in lines[start:] if line.startswith("| ours (CNN"))
    gru = next(line for line in lines[start:] if line.startswith("| GRU encoder"))
    assert "0.850 ± 0.050" in ours and "12,000" in ours and "0.0200" in ours
    assert "0.650 ± 0.050" in gru and "12,345" in gru and "| 21 " in gru and "0.0150" in gru and "| 0.8 " in gru


def test_stale_plots_are_removed(tmp_path: Path) -> None:
    results = tmp_path / "bench"
    shutil.copytree(RESULTS, results)
    for variant in results.glob("molecule_*.json"):  # every molecule file but molecule.json
        variant.unlink()
    write_report(results, tmp_path / "docs")
    (results / "molecule.json").unlink()
    write_report(results, tmp_path / "docs")
    assert sorted(path.name for path in (tmp_path / "docs" / "results").glob("*.png")) == \
        ["sensor_fd001.png", "sensor_fd001_half_labelled.png", "sensor_skab.png"]
