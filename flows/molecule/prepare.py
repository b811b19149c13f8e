"""Stage `molecule_prepare`: load, standardise, de-duplicate and split molecules (a DVC output)."""

from __future__ import annotations

import mlflow
from prefect import flow

from data.molecules.prepare import PreparedMolecules, prepare_molecule_data, save_prepared
from flows.params import load_params
from flows.paths import MOLECULE
from flows.tasks import cached_io_task, io_task, source_cache_key, stage_cli
from flows.tracking import log_json, stage_run


@cached_io_task(source_cache_key(code=("data.molecules", "data.config", "data.tables"), packages=("rdkit", "datamol")),
                name="load-clean-split")
def build(cfg) -> PreparedMolecules:
    """Pure: the same config, source bytes, data code and RDKit give the same molecules (a cache hit skips the
    RDKit standardisation, e.g. in a nightly data refresh of an unchanged file)."""
    return prepare_molecule_data(cfg)


@io_task(name="save-prepared-molecules")
def save(prepared: PreparedMolecules) -> None:
    save_prepared(prepared, MOLECULE.prepared)


@flow(name="molecule-prepare")
def molecule_prepare(params_file: str = "params.yaml") -> dict:
    """Prepare molecule splits from `molecule.data`."""
    params = load_params(params_file)
    cfg = params.molecule.data
    prepared = build(cfg)
    save(prepared)
    sizes = {name: len(frame) for name, frame in prepared.splits.items()}
    with stage_run(params.tracking, "molecule", "prepare", {"data": cfg.model_dump(mode="json")},
                   {"molecule": MOLECULE.prepared}):
        mlflow.log_metrics({f"n_{name}": float(n) for name, n in sizes.items()})
        log_json(prepared.report, "prepare_report.json")
    print(f"molecules per split: {sizes}; report: {MOLECULE.prepared / 'report.json'}")
    return prepared.report


if __name__ == "__main__":
    stage_cli(molecule_prepare)
