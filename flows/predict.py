"""Batch scoring: a registered model scores a file (`make predict FAMILY=... INPUT=... OUTPUT=...`, or the `predict`
deployment of `make ui`).

The version (an alias, `champion` by default, or a number) is downloaded and verified as the service verifies it
(signed manifest, valid card), and scored with the service's own code (models/predictors.py). The input is CSV or
Parquet, a local path or any fsspec URL (`s3://...`): molecules by their SMILES column, sensor readings in the long
format the pipeline reads (`unit`, `time`, the model's channels), cut into windows per unit at `stride`. Chunks of
`chunk_rows` molecules, or of whole units, are tasks on the configured task runner (`orchestration`), a chunk's
molecules featurised by a pool of processes (one per core; on Dask, by the worker itself); each finished
chunk is kept in `.predict/<job>/`, so a stopped job started again with the same input, model and chunking
continues from its finished chunks and ends with the same output bytes. The output (Parquet, or CSV by its suffix)
has one row per molecule or window with the input's id column, the answer, the model's name and version, and
`error` where an item could not be scored; nothing is dropped. One MLflow run per job records the lineage.
"""

from __future__ import annotations

import functools
import hashlib
import io
import json
import multiprocessing
import os
import shutil
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

import fsspec
import mlflow
import numpy as np
import pandas as pd
import typer
from mlflow import MlflowClient
from mlflow.exceptions import MlflowException
from prefect import flow, task
from prefect.cache_policies import NO_CACHE
from tqdm import tqdm

from contract.card import CardError
from contract.manifest import ManifestError, load_verify_key, public_key_path
from contract.registry import alias_version, download_verified
from data.errors import DataValidationError
from data.sensors.windows import scoring_windows
from flows._environment import workspace
from flows.family import pipeline_family
from flows.params import load_params
from flows.tasks import stage_cli
from flows.tracking import signing_key, stage_run, use_tracking
from models.predictors import featurize_smiles

JOBS = ".predict"  # finished chunks of unfinished jobs, per job, in the workspace
FORMATS = {".csv": "csv", ".parquet": "parquet", ".pq": "parquet"}


@dataclass(frozen=True)
class Job:
    """What one batch job scores and with what: equal jobs share their finished chunks."""

    family: str
    input: str
    input_sha256: str
    model_name: str
    version: str
    chunk_rows: int
    columns: tuple[str, ...]  # the id column, then the SMILES column or the channels
    stride: int

    @property
    def key(self) -> str:
        """The job's identity: everything but where the input was read from (its content counts)."""
        identity = {k: v for k, v in asdict(self).items() if k != "input"}
        return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]


def table_format(location: str) -> str:
    suffix = Path(location.split("?")[0]).suffix.lower()
    if suffix not in FORMATS:
        raise DataValidationError(f"{location}: give a .csv or .parquet file (the suffix says which)")
    return FORMATS[suffix]


def read_table(location: str) -> tuple[pd.DataFrame, str]:
    """The table at `location` (a path or fsspec URL) and the sha256 of its bytes."""
    kind = table_format(location)
    try:
        with fsspec.open(location, "rb") as handle:
            data = handle.read()
    except FileNotFoundError:
        raise DataValidationError(f"{location}: no such file") from None
    reader = pd.read_csv if kind == "csv" else pd.read_parquet
    try:
        frame = reader(io.BytesIO(data))
    except Exception as error:
        raise DataValidationError(f"{location}: cannot be read as {kind} ({str(error).splitlines()[0]})") from None
    return frame, hashlib.sha256(data).hexdigest()


def write_table(frame: pd.DataFrame, location: str) -> None:
    with fsspec.open(location, "wb", auto_mkdir=True) as handle:
        if table_format(location) == "csv":
            handle.write(frame.to_csv(index=False).encode())
        else:
            frame.to_parquet(handle, index=False)


@functools.cache
def served_predictor(family: str, model_folder: str):
    """The version's predictor, one per process (a task runner's worker loads it once)."""
    card = json.loads((Path(model_folder) / "card.json").read_text())
    return pipeline_family(family).predictor(Path(model_folder) / "model.onnx", card)


@functools.cache
def featurization_pool() -> tuple[ProcessPoolExecutor, int] | None:
    """Processes that featurise molecules, one per usable core, one pool per process, and their number; None in a
    process that may not start any (a Dask worker is daemonic: its own processes are the parallelism) or where one
    core is all."""
    workers = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    if workers < 2 or multiprocessing.current_process().daemon:
        return None
    return ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")), workers


def featurize(smiles: list[str]) -> list:
    """`featurize_smiles` of the SMILES, spread over the featurisation pool where there is one (in order)."""
    pool = featurization_pool()
    if pool is None or len(smiles) < 2 * pool[1]:
        return featurize_smiles(smiles)
    pool, workers = pool
    size = -(-len(smiles) // workers)
    return [item for part in pool.map(featurize_smiles, [smiles[i:i + size] for i in range(0, len(smiles), size)])
            for item in part]


def score_molecules(predictor, smiles: list[str]) -> pd.DataFrame:
    """One row per SMILES: prediction, uncertainty, modality, error (None where answered)."""
    out = predictor.answer(featurize(smiles))
    return pd.DataFrame({"prediction": out["prediction"], "uncertainty": out["uncertainty"],
                         "modality": out["modality"].astype(object), "error": out["error"]})


def score_sensor(predictor, readings: pd.DataFrame, channels: list[str], window: int, stride: int) -> pd.DataFrame:
    """One row per window of the units in `readings` (unit, time of its last reading, the answer), and one row with
    an error per unit with fewer readings than a window."""
    readings = readings.sort_values(["unit", "time"], kind="stable")
    X, unit, end = scoring_windows(readings, channels, window, stride)
    scored = pd.DataFrame({"unit": unit, "time": end})
    if len(X):
        out = predictor.predict(X)
        for name, values in out.items():
            scored[name] = values.astype(object) if values.dtype == object else values
    scored["error"] = None
    counts = readings.groupby("unit", sort=True).size()
    short = counts[counts < window]
    errors = pd.DataFrame({"unit": short.index.astype(str), "time": readings.groupby("unit")["time"].max()[short.index]
                           .to_numpy(np.int64),
                           "error": [f"unit {u}: {n} readings, fewer than the model's window of {window}"
                                     for u, n in short.items()]})
    return pd.concat([scored, errors], ignore_index=True).sort_values(["unit", "time"], kind="stable",
                                                                      ignore_index=True)


@task(cache_policy=NO_CACHE, retries=1, retry_delay_seconds=1)
def score_chunk(job: Job, index: int, items: pd.DataFrame, model_folder: str, card: dict, folder: str) -> int:
    """Score one chunk and keep it as `<index>.parquet` in the job's folder (written whole or not at all); its rows."""
    predictor = served_predictor(job.family, model_folder)
    if job.family == "molecule":
        scored = score_molecules(predictor, items[job.columns[1]].astype(str).tolist())
        scored.insert(0, job.columns[0], items[job.columns[0]].to_numpy())
        scored.insert(1, job.columns[1], items[job.columns[1]].to_numpy())
    else:
        scored = score_sensor(predictor, items, list(job.columns[1:]), int(card["window"]), job.stride)
    scored["model_name"], scored["model_version"] = job.model_name, job.version
    part = Path(folder) / f"{index:06d}.parquet"
    partial = part.with_suffix(".partial")
    scored.to_parquet(partial, index=False)
    partial.replace(part)
    return len(scored)


def chunks(job: Job, frame: pd.DataFrame) -> list[pd.DataFrame]:
    """Molecules: `chunk_rows` rows each, in order. Sensors: whole units, about `chunk_rows` readings each."""
    if job.family == "molecule":
        return [frame.iloc[i:i + job.chunk_rows] for i in range(0, len(frame), job.chunk_rows)] or [frame]
    units = frame["unit"].astype(str)
    sizes = units.value_counts(sort=False).sort_index()
    group = (sizes.cumsum() - 1) // job.chunk_rows
    member = units.map(group)
    return [frame[member == g] for g in sorted(group.unique())] or [frame]


def check_columns(family: str, frame: pd.DataFrame, card: dict, id_column: str | None, smiles_column: str,
                  location: str) -> tuple[str, ...]:
    """(id column, then the SMILES column or the channels); a DataValidationError naming what is missing."""
    wanted = [smiles_column] if family == "molecule" else ["unit", "time", *card["channels"]]
    if id_column is not None:
        wanted.append(id_column)
    missing = [c for c in wanted if c not in frame.columns]
    if missing:
        raise DataValidationError(f"{location}: no column {', '.join(missing)} (columns: "
                                  f"{', '.join(map(str, frame.columns))})")
    if family == "molecule":
        return (id_column or "row", smiles_column)
    return ("unit", *card["channels"])


@flow(name="predict", flow_run_name="{family}-predict")
def predict(family: str, input: str, output: str, alias: str = "champion", version: str | None = None,
            chunk_rows: int = 10_000, id_column: str | None = None, smiles_column: str = "smiles",
            stride: int | None = None, params_file: str = "params.yaml") -> dict:
    """Score `input` with `family`'s registered model (`version`, else the version `alias` points at) into
    `output`; returns the job's summary."""
    params = load_params(params_file)
    for setting, value in (("chunk_rows", chunk_rows), ("stride", stride)):
        if value is not None and value < 1:
            raise DataValidationError(f"{setting} is {value}: give 1 or more")
    settings = pipeline_family(family).settings(params)
    name = settings.registry.model_name
    use_tracking(params.tracking)
    client = MlflowClient()
    version = version or alias_version(client, name, alias)
    if version is None:
        raise DataValidationError(f"{name} has no version with the alias '{alias}'")
    try:
        client.get_model_version(name, str(version))
    except MlflowException:
        raise DataValidationError(f"{name} has no version {version}") from None
    table_format(output)
    frame, input_sha256 = read_table(input)
    with tempfile.TemporaryDirectory(prefix="predict-") as scratch:
        try:
            verified = download_verified(client, name, str(version), Path(scratch),
                                         load_verify_key(public_key_path(signing_key(params.tracking))))
        except (ManifestError, CardError) as error:  # never scored with: as the service refuses it
            raise DataValidationError(f"refused: {error}") from None
        card = verified.card
        columns = check_columns(family, frame, card, id_column, smiles_column, input)
        if family == "molecule" and id_column is None:
            frame = frame.assign(row=np.arange(len(frame)))
        job = Job(family, input, input_sha256, name, str(version), chunk_rows, columns,
                  (stride or settings.data.stride) if family == "sensor" else 0)
        folder = workspace() / JOBS / job.key
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "job.json").write_text(json.dumps(asdict(job), indent=2))
        parts = chunks(job, frame)
        done = {int(p.stem) for p in folder.glob("*.parquet")}
        started = time.perf_counter()
        futures = [score_chunk.submit(job, i, part, str(verified.directory), card, str(folder))
                   for i, part in enumerate(parts) if i not in done]
        if done:
            print(f"{family}: {len(done)} of {len(parts)} chunks kept from before", flush=True)
        for future in tqdm(futures, desc=f"{family}: scoring", unit="chunk", disable=None):
            future.result()
        scored = pd.concat([pd.read_parquet(folder / f"{i:06d}.parquet") for i in range(len(parts))],
                           ignore_index=True)
        seconds = time.perf_counter() - started
    write_table(scored, output)
    shutil.rmtree(folder, ignore_errors=True)
    summary = {"family": family, "model_name": name, "model_version": str(version), "input": input,
               "input_sha256": input_sha256, "output": output, "rows": len(scored),
               "errors": int(scored["error"].notna().sum()), "chunks": len(parts), "chunks_kept": len(done),
               "rows_per_s": round(len(scored) / seconds, 1) if seconds > 0 else None}
    with stage_run(params.tracking, family, "predict", {"predict": {k: v for k, v in summary.items()
                                                                     if k in ("input", "output")},
                                                        "chunk_rows": chunk_rows}):
        mlflow.set_tags({"predict.model": f"{name} v{version}", "predict.input_sha256": input_sha256})
        mlflow.log_metrics({k: summary[k] for k in ("rows", "errors", "chunks", "chunks_kept")
                            if summary[k] is not None} | ({"rows_per_s": summary["rows_per_s"]}
                                                          if summary["rows_per_s"] else {}))
    print(f"{family}: {summary['rows']} rows scored by {name} v{version} into {output} ({summary['errors']} with an "
          f"error, {summary['rows_per_s']} rows/s)")
    return summary


if __name__ == "__main__":
    stage_cli(predict, locked=False,
              input=typer.Option(..., "--input", help="CSV or Parquet: a path or an fsspec URL"),
              output=typer.Option(..., "--output", help="CSV or Parquet (by its suffix): a path or an fsspec URL"),
              alias=typer.Option("champion", "--alias", help="the registry alias to score with"),
              version=typer.Option(None, "--version", help="a version number instead of the alias"),
              chunk_rows=typer.Option(10_000, "--chunk-rows", help="molecules, or readings of whole units, per chunk"),
              id_column=typer.Option(None, "--id-column", help="molecules: the input's id column (default: the "
                                     "row number)"),
              smiles_column=typer.Option("smiles", "--smiles-column", help="molecules: the SMILES column"),
              stride=typer.Option(None, "--stride", help="sensors: steps between windows (default: "
                                  "sensor.data.stride)"))
