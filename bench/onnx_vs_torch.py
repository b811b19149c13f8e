"""ONNX Runtime against PyTorch eager on the models `make run` trained (not a test).

Both families, batch sizes 1, 16 and 64, the same calibrated ensemble in both runtimes; molecules
also with featurisation (SMILES -> arrays) included; the sensor model also as its int8 version
(models/quantization.py, calibrated on validation windows, what `sensor.export.quantize: true` exports), with
how far its test probabilities move. Run it after `make run` (float export, the default), from the project root:

    .venv/bin/python bench/onnx_vs_torch.py [--repeats 30]

Results go to bench/results/onnx_vs_torch.json and .md. Target: ONNX Runtime at least 2.5 times
faster than eager for the sensor model on CPU.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from data.molecules.featurize import MODEL_INPUTS
from data.molecules.prepare import load_prepared as load_molecules
from data.molecules.tokenizer import SmilesTokenizer
from data.sensors.prepare import load_prepared
from flows.json_io import read_json
from flows.molecule.artifacts import load_ensemble as load_molecule_ensemble
from flows.paths import MOLECULE, SENSOR
from flows.sensor.artifacts import load_ensemble as load_sensor_ensemble
from models.export import CalibratedClassifierEnsemble, CalibratedRegressorEnsemble
from models.molecule.training import Molecules, model_arrays
from models.onnx_runtime import load_session, run
from models.quantization import quantize_sensor_model
from models.sensor.calibrated import calibrated_ensemble

RESULTS = Path(__file__).resolve().parents[1] / "bench" / "results"
BATCHES = (1, 16, 64)


def median_ms(call: Callable[[], object], repeats: int) -> float:
    """Median wall time of `call` in milliseconds, after two warm-up calls."""
    call(), call()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def sensor_rows(repeats: int, workdir: Path) -> list[dict]:
    if read_json(SENSOR.model_card).get("quantization"):
        raise SystemExit("the exported sensor model is already int8: export it with sensor.export.quantize: false")
    members, featurizer, _ = load_sensor_ensemble(SENSOR.finetuned)
    model = calibrated_ensemble(members, read_json(SENSOR.calibration)).eval()
    session, provider = load_session(SENSOR.onnx, prefer_cuda=False)
    prepared = load_prepared(SENSOR.prepared)
    int8_path = quantize_sensor_model(SENSOR.onnx, workdir / "sensor_int8.onnx",
                                      featurizer.transform(prepared.windows["val"].X))
    int8_session, _ = load_session(int8_path, prefer_cuda=False)
    windows = prepared.windows["test"].X
    every = featurizer.transform(windows)
    moved = float(np.abs(run(int8_session, {"features": every})["probability"]
                         - run(session, {"features": every})["probability"]).max())
    rows = []
    for batch in BATCHES:
        features = featurizer.transform(windows[:batch])
        tensor = torch.from_numpy(features)
        with torch.no_grad():
            eager = median_ms(lambda: model(tensor), repeats)
        onnx = median_ms(lambda: run(session, {"features": features}), repeats)
        int8 = median_ms(lambda: run(int8_session, {"features": features}), repeats)
        rows.append({"model": "sensor", "batch": batch, "featurisation": "excluded", "torch_ms": eager,
                     "onnxruntime_ms": onnx, "speedup": eager / onnx, "provider": provider,
                     "onnxruntime_int8_ms": int8, "int8_speedup": eager / int8, "int8_max_probability_diff": moved})
    return rows


def molecule_rows(repeats: int) -> list[dict]:
    members, state = load_molecule_ensemble(MOLECULE.finetuned)
    calibration = read_json(MOLECULE.calibration)
    if state["task"] == "regression":
        model = CalibratedRegressorEnsemble(members, state["target_mean"], state["target_std"], calibration["scale"])
    else:
        model = CalibratedClassifierEnsemble(members, calibration["temperature"])
    model.eval()
    tokenizer = SmilesTokenizer.from_dict(state["tokenizer"])
    session, provider = load_session(MOLECULE.onnx, prefer_cuda=False)
    smiles = list(load_molecules(MOLECULE.prepared).splits["test"]["smiles"])
    rows = []
    for batch in BATCHES:
        chosen = (smiles * (batch // len(smiles) + 1))[:batch]
        arrays = model_arrays(Molecules.from_smiles(chosen, tokenizer))
        tensors = [torch.from_numpy(arrays[name]) for name in MODEL_INPUTS]

        def eager_call(with_featurisation: bool):
            a = model_arrays(Molecules.from_smiles(chosen, tokenizer)) if with_featurisation else arrays
            with torch.no_grad():
                return model(*(torch.from_numpy(a[name]) for name in MODEL_INPUTS)) if with_featurisation \
                    else model(*tensors)

        def onnx_call(with_featurisation: bool):
            a = model_arrays(Molecules.from_smiles(chosen, tokenizer)) if with_featurisation else arrays
            return run(session, {name: a[name] for name in MODEL_INPUTS})

        for included in (False, True):
            eager = median_ms(lambda: eager_call(included), repeats)
            onnx = median_ms(lambda: onnx_call(included), repeats)
            rows.append({"model": "molecule", "batch": batch, "featurisation": "included" if included else "excluded",
                         "torch_ms": eager, "onnxruntime_ms": onnx, "speedup": eager / onnx, "provider": provider})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=30)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="onnx-bench-") as tmp:
        rows = sensor_rows(args.repeats, Path(tmp)) + molecule_rows(args.repeats)
    meta = {"machine": platform.processor() or platform.machine(), "torch_threads": torch.get_num_threads(),
            "repeats": args.repeats}
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "onnx_vs_torch.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2) + "\n")
    lines = ["| model | batch | featurisation | PyTorch eager (ms) | ONNX Runtime (ms) | speed-up | "
             "ONNX Runtime int8 (ms) | int8 speed-up |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        int8 = (f"{r['onnxruntime_int8_ms']:.2f} | {r['int8_speedup']:.2f}x" if "int8_speedup" in r else "n/a | n/a")
        lines.append(f"| {r['model']} | {r['batch']} | {r['featurisation']} | {r['torch_ms']:.2f} | "
                     f"{r['onnxruntime_ms']:.2f} | {r['speedup']:.2f}x | {int8} |")
    moved = next(r["int8_max_probability_diff"] for r in rows if "int8_max_probability_diff" in r)
    lines.append(f"\nint8 sensor model: max |probability - float probability| on the test windows {moved:.4f}")
    (RESULTS / "onnx_vs_torch.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
