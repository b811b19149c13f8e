"""Readers that turn each sensor source into one long frame with canonical columns.

Canonical frame: one row per (unit, time) with columns `unit`, `time`, the sensor channels, `label` (0/1, 1 = failure
or anomaly at that row; missing: an unlabelled row) and, for split=column, the split column. Validation is data/sensors/validate.py's job.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from data.errors import DataValidationError
from data.sensors.config import SensorDataConfig
from data.sensors.simulator import simulate_fleet
from data.tables import read_csv_checked

CMAPSS_COLUMNS = ["unit", "time", "op_setting_1", "op_setting_2", "op_setting_3", *[f"s{i}" for i in range(1, 22)]]
SKAB_RUN_FOLDERS = ("valve1", "valve2", "other")


def read_table(path: Path) -> pd.DataFrame:
    """A CSV (.csv, .csv.gz) or Parquet (.parquet, .pq) file as a frame."""
    path = Path(path)
    if not path.is_file():
        raise DataValidationError("file not found", file=path)
    suffixes = "".join(path.suffixes[-2:]).lower()
    if suffixes.endswith((".csv", ".csv.gz")):
        return read_csv_checked(path)
    if not suffixes.endswith((".parquet", ".pq")):
        raise DataValidationError(f"unknown file type '{path.suffix}' (expected .csv, .csv.gz, .parquet or .pq)", file=path)
    try:
        return pd.read_parquet(path)
    except Exception as exc:  # pyarrow raises many types for a corrupt file
        raise DataValidationError(f"cannot read the file: {exc}", file=path) from exc


def load_cmapss(path: Path) -> pd.DataFrame:
    """NASA C-MAPSS train_FDxxx.txt(.gz): unit ("e001"...), time (cycle), op_setting_1..3, s1..s21, label.

    Train engines run to failure, so label = 1 on each engine's last cycle; with horizon h a window is then positive
    when the RUL (last cycle - cycle) of its last row is <= h.
    """
    path = Path(path)
    if not path.is_file():
        raise DataValidationError("file not found", file=path)
    raw = read_csv_checked(path, sep=r"\s+", header=None)
    if raw.shape[1] != len(CMAPSS_COLUMNS):
        raise DataValidationError(f"expected {len(CMAPSS_COLUMNS)} columns, found {raw.shape[1]}", file=path)
    frame = raw.set_axis(CMAPSS_COLUMNS, axis=1)
    frame["label"] = (frame["time"] == frame.groupby("unit")["time"].transform("max")).astype(int)
    frame["unit"] = frame["unit"].map(lambda u: f"e{u:03d}")
    return frame


def load_skab(folder: Path) -> pd.DataFrame:
    """SKAB runs in valve1/, valve2/, other/: unit = "valve1/0"..., time = row in file, 8 channels, label = anomaly (0/1).

    anomaly-free/anomaly-free.csv is skipped: it has no labels, and every labelled run starts with normal operation.
    The `datetime` and `changepoint` columns are dropped.
    """
    folder = Path(folder)
    files = [f for sub in SKAB_RUN_FOLDERS for f in sorted((folder / sub).glob("*.csv"), key=lambda f: (len(f.stem), f.stem))]
    if not files:
        raise DataValidationError(f"no SKAB runs in {', '.join(SKAB_RUN_FOLDERS)}", file=folder)
    runs = []
    for file in files:
        run = read_csv_checked(file, sep=";")
        if "anomaly" not in run.columns:
            raise DataValidationError("missing label column", file=file, column="anomaly")
        run = run.drop(columns=["datetime", "changepoint"], errors="ignore").rename(columns={"anomaly": "label"})
        run.insert(0, "unit", file.relative_to(folder).with_suffix("").as_posix())
        run.insert(1, "time", range(len(run)))
        runs.append(run)
    return pd.concat(runs, ignore_index=True)


def load_sensor_frame(cfg: SensorDataConfig) -> tuple[pd.DataFrame, str]:
    """(canonical frame, source description: the file or folder path, or "simulator").

    A `file` source has its cfg.unit_column/time_column/label_column/split_column renamed to the canonical names.
    """
    if cfg.source == "simulator":
        return simulate_fleet(cfg.simulator, cfg.seed), "simulator"
    if cfg.source == "cmapss":
        return load_cmapss(cfg.path), str(cfg.path)
    if cfg.source == "skab":
        return load_skab(cfg.path), str(cfg.path)
    renames = {cfg.unit_column: "unit", cfg.time_column: "time", cfg.label_column: "label", cfg.split_column: "split"}
    return read_table(cfg.path).rename(columns=renames), str(cfg.path)
