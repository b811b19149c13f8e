"""Validation and sources: every bad input raises DataValidationError naming the file and the column."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from data.errors import DataValidationError
from data.sensors.config import SensorDataConfig
from data.sensors.prepare import prepare_sensor_data, prepare_sensor_frame
from data.sensors.sources import load_sensor_frame, read_table
from data.sensors.validate import validate_sensor_frame

SOURCE = "fleet.csv"


def _frame(n_units: int = 6, n_steps: int = 40) -> pd.DataFrame:
    """Units u0..: 2 channels, each unit fails at its last step; split column: u0-u3 train, u4 val, u5 test."""
    rng = np.random.default_rng(0)
    rows = n_units * n_steps
    df = pd.DataFrame(
        {
            "unit": np.repeat([f"u{i}" for i in range(n_units)], n_steps),
            "time": np.tile(np.arange(n_steps), n_units),
            "temp": rng.normal(size=rows),
            "flow": rng.normal(size=rows),
            "label": np.tile(np.r_[np.zeros(n_steps - 1, int), 1], n_units),
        }
    )
    df["split"] = np.repeat(["train"] * (n_units - 2) + ["val", "test"], n_steps)
    return df


COLUMN_CFG = SensorDataConfig(split="column", window=8, stride=2, horizon=4)


def _raises(df: pd.DataFrame, cfg: SensorDataConfig, column: str, match: str) -> DataValidationError:
    with pytest.raises(DataValidationError, match=match) as info:
        prepare_sensor_frame(df, cfg, SOURCE)
    assert info.value.file == SOURCE and info.value.column == column
    assert SOURCE in str(info.value) and f"'{column}'" in str(info.value)
    return info.value


def test_valid_frame_gives_channels_and_prepares():
    assert validate_sensor_frame(_frame(), COLUMN_CFG, SOURCE) == ["temp", "flow"]
    p = prepare_sensor_frame(_frame(), COLUMN_CFG, SOURCE)
    assert p.report["units"] == {"train": 4, "val": 1, "test": 1}
    assert p.report["windows"]["val"] == 17 and p.report["positives"]["val"] == 3  # ends 39, 37, 35 within 4 of t39


@pytest.mark.parametrize("column", ["unit", "time", "label", "split"])
def test_missing_key_column(column):
    _raises(_frame().drop(columns=column), COLUMN_CFG, column, "missing column")


def test_missing_listed_sensor_column():
    _raises(_frame(), COLUMN_CFG.model_copy(update={"sensor_columns": ["temp", "vibration"]}), "vibration", "missing sensor")


def test_non_numeric_sensor_column():
    df = _frame().assign(flow=lambda d: d["flow"].astype(str))
    _raises(df, COLUMN_CFG.model_copy(update={"sensor_columns": ["temp", "flow"]}), "flow", "not numeric")


def test_non_numeric_columns_are_not_sensors_by_default():
    df = _frame().assign(note="x")
    assert validate_sensor_frame(df, COLUMN_CFG, SOURCE) == ["temp", "flow"]


def test_no_sensor_columns():
    with pytest.raises(DataValidationError, match="no sensor columns") as info:
        validate_sensor_frame(_frame().drop(columns=["temp", "flow"]), COLUMN_CFG, SOURCE)
    assert SOURCE in str(info.value)


@pytest.mark.parametrize("bad", [2, -1, 0.5])
def test_label_outside_0_1(bad):
    df = _frame().astype({"label": float})
    df.loc[5, "label"] = bad
    error = _raises(df, COLUMN_CFG, "label", "labels must be 0, 1 or missing")
    assert str(bad) in str(error)


def test_every_label_missing():
    _raises(_frame().assign(label=np.nan), COLUMN_CFG, "label", "every label is missing")


def test_missing_labels_leave_the_splits_and_train_ones_are_kept_unlabelled():
    """Rows without a label: training windows whose horizon reaches them become unlabelled windows, validation ones
    are dropped and counted; positives stay positive (a failure within the horizon is known)."""
    df = _frame()
    labelled = prepare_sensor_frame(df, COLUMN_CFG, SOURCE)
    train_unit = df.loc[df["split"] == "train", "unit"].iloc[0]
    df.loc[(df["unit"] == train_unit) & (df["time"] < 20), "label"] = np.nan
    df.loc[(df["split"] == "val") & (df["time"] < 10), "label"] = np.nan
    p = prepare_sensor_frame(df, COLUMN_CFG, SOURCE)
    assert len(p.unlabelled) == p.report["unlabelled_train_windows"] == p.report["windows_without_label"]["train"] > 0
    assert (p.unlabelled.unit == train_unit).all() and (p.unlabelled.y == -1).all()
    assert p.unlabelled.time.max() < 20
    assert len(p.windows["train"]) + len(p.unlabelled) == len(labelled.windows["train"])
    assert p.report["windows_without_label"]["val"] > 0
    assert len(p.windows["val"]) == len(labelled.windows["val"]) - p.report["windows_without_label"]["val"]
    assert p.report["positives"]["val"] == labelled.report["positives"]["val"]
    assert (p.windows["train"].y >= 0).all() and (p.windows["val"].y >= 0).all()


def test_bad_split_value():
    df = _frame()
    df.loc[0, "split"] = "holdout"
    error = _raises(df, COLUMN_CFG, "split", "train/val/test")
    assert "holdout" in str(error)


def test_duplicate_time_in_a_unit():
    df = _frame()
    df.loc[1, "time"] = 0
    _raises(df, COLUMN_CFG, "time", "same time twice")


def test_empty_split():
    df = _frame()
    df.loc[df["split"] == "val", "split"] = "train"
    _raises(df, COLUMN_CFG, "label", "split 'val' has no windows")


def test_split_without_positives():
    df = _frame()
    df.loc[df["split"] == "test", "label"] = 0
    _raises(df, COLUMN_CFG, "label", "split 'test' has no positive window")


def test_file_source_errors_use_the_users_column_names(tmp_path):
    path = tmp_path / "plant.csv"
    df = _frame().rename(columns={"unit": "machine", "time": "ts", "label": "failed", "split": "fold"})
    df.loc[3, "failed"] = 7
    df.to_csv(path, index=False)
    cfg = COLUMN_CFG.model_copy(
        update={"source": "file", "path": path, "unit_column": "machine", "time_column": "ts", "label_column": "failed", "split_column": "fold"}
    )
    with pytest.raises(DataValidationError) as info:
        prepare_sensor_data(cfg)
    assert info.value.file == str(path) and info.value.column == "failed"


def test_file_source_renames_to_canonical(tmp_path):
    path = tmp_path / "plant.parquet"
    _frame().rename(columns={"unit": "machine", "label": "failed"}).to_parquet(path)
    cfg = COLUMN_CFG.model_copy(update={"source": "file", "path": path, "unit_column": "machine", "label_column": "failed"})
    df, source = load_sensor_frame(cfg)
    assert source == str(path)
    assert list(df.columns) == ["unit", "time", "temp", "flow", "label", "split"]
    assert prepare_sensor_data(cfg).report["windows"]["test"] == 17


def test_read_table_errors(tmp_path):
    with pytest.raises(DataValidationError, match="file not found") as info:
        read_table(tmp_path / "absent.csv")
    assert "absent.csv" in str(info.value)
    (tmp_path / "data.txt").write_text("a,b\n1,2\n")
    with pytest.raises(DataValidationError, match="unknown file type"):
        read_table(tmp_path / "data.txt")
    (tmp_path / "broken.parquet").write_bytes(b"not parquet at all")
    with pytest.raises(DataValidationError, match="cannot read") as info:
        read_table(tmp_path / "broken.parquet")
    assert "broken.parquet" in str(info.value)


def test_read_table_csv(tmp_path):
    _frame().to_csv(tmp_path / "ok.csv", index=False)
    pd.testing.assert_frame_equal(read_table(tmp_path / "ok.csv"), _frame())


def test_infinite_reading_names_column_and_rows():
    df = _frame()
    df.loc[[3, 7], "temp"] = [np.inf, -np.inf]
    error = _raises(df, COLUMN_CFG, "temp", "2 infinite or out-of-float32-range values")
    assert "row 3 inf, row 7 -inf" in str(error) and "nonfinite: as_missing" in str(error)


def test_reading_beyond_float32_is_non_finite():
    df = _frame()
    df.loc[11, "flow"] = 1e39  # float32 max is 3.4e38: the window would hold inf
    assert "row 11 1e+39" in str(_raises(df, COLUMN_CFG, "flow", "1 infinite or out-of-float32-range"))


def test_infinite_readings_as_missing_are_masked_and_counted():
    df = _frame()
    df.loc[[3, 7], "temp"] = [np.inf, -np.inf]
    p = prepare_sensor_frame(df, COLUMN_CFG.model_copy(update={"nonfinite": "as_missing"}), SOURCE)
    assert p.report["nonfinite_as_missing"] == {"temp": 2}
    X = np.concatenate([w.X for w in p.windows.values()])
    assert np.isfinite(X[~np.isnan(X)]).all() and np.isnan(X[:, p.channels.index("temp")]).any()
    assert prepare_sensor_frame(_frame(), COLUMN_CFG, SOURCE).report["nonfinite_as_missing"] == {}


def test_infinite_time_names_the_time_column():
    df = _frame().astype({"time": float})
    df.loc[4, "time"] = np.inf
    _raises(df, COLUMN_CFG, "time", r"infinite time values \(first rows \[4\]\)")


def test_non_numeric_cell_in_a_sensor_column_is_named_not_dropped(tmp_path):
    df = _frame().astype({"temp": object})
    df.loc[[3, 13], "temp"] = ["hot", "n/a?"]
    path = tmp_path / "fleet.csv"
    df.to_csv(path, index=False)
    cfg = COLUMN_CFG.model_copy(update={"source": "file", "path": path})
    with pytest.raises(DataValidationError) as info:
        prepare_sensor_data(cfg)
    assert info.value.column == "temp" and info.value.file == str(path)
    assert "2 of 240 cells are not numbers (row 3 'hot', row 13 'n/a?')" in str(info.value)


def test_wholly_non_numeric_column_is_skipped_and_reported():
    df = _frame().assign(site="plant-a", status=lambda d: np.where(d["label"] == 1, "stopped", "running"))
    p = prepare_sensor_frame(df, COLUMN_CFG, SOURCE)
    assert p.channels == ["temp", "flow"] and p.report["skipped_columns"] == ["site", "status"]


def test_series_shorter_than_the_window():
    _raises(_frame(n_steps=1), COLUMN_CFG, "time", r"every unit is shorter than the window \(8 steps\); the longest has 1 rows")


def test_truncated_csv_is_reported_as_truncated(tmp_path):
    path = tmp_path / "fleet.csv"
    _frame().to_csv(path, index=False)
    *lines, last = path.read_text().splitlines()
    path.write_text("\n".join([*lines, ",".join(last.split(",")[:3])[:-2]]))  # cut inside its third field
    with pytest.raises(DataValidationError) as info:
        read_table(path)
    assert str(info.value) == f"{path}: the last line (row 239) has 3 of 6 fields: the file looks truncated"


def test_malformed_csv_line_is_named(tmp_path):
    path = tmp_path / "fleet.csv"
    path.write_text("unit,time,temp,label\na,0,1.0,0\na,1,2.0,0,9\n")
    with pytest.raises(DataValidationError, match="malformed CSV: Expected 4 fields in line 3, saw 5") as info:
        read_table(path)
    assert info.value.file == str(path)
