"""What one prediction costs to serve, measured by the register stage and kept in the card it registers:
featurisation and the model call per item at batch 1 and at batch 64 (median of repeated calls on items the
predictor has not seen, one ONNX Runtime thread, on the CPU), the graph's size, and the machine it was measured on.
The promotion gate compares it with `<family>.registry.serving_budget_ms` (flows/registry.py). It is not in the
exported card: a timing would make the export stage's outputs differ from run to run (docs/decisions/0020)."""

from __future__ import annotations

import os
import platform
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import onnx
import onnxruntime

BATCH_SIZES = (1, 64)
CALLS = {1: 40, 64: 6}  # timed calls per batch size (after one untimed call)
THREADS = 1  # ONNX Runtime intra-op threads while measuring: the service's per-worker default on two cores


class Servable(Protocol):
    """A predictor (models/predictors.py) split where the service splits it."""

    def featurize(self, items: Any) -> Any: ...

    def run_features(self, features: Any) -> Any: ...


def serving_cost(predictor: Servable, items: np.ndarray | Sequence, onnx_path: Path) -> dict:
    """The card's `serving_cost` of `predictor` (made with THREADS threads, on the CPU) over `items` (windows
    (n, C, T) or SMILES, taken in turn): milliseconds per item of featurisation, of the model call and their total,
    at each of BATCH_SIZES; the graph's size; the machine."""
    featurize, model = {}, {}
    for size in BATCH_SIZES:
        predictor.run_features(predictor.featurize(_take(items, 0, size)))  # untimed: first-call allocations
        spent: dict[str, list[float]] = {"featurize": [], "model": []}
        for call in range(CALLS[size]):
            batch = _take(items, (call + 1) * size, size)
            start = time.perf_counter()
            features = predictor.featurize(batch)
            featurized = time.perf_counter()
            predictor.run_features(features)
            spent["featurize"].append(featurized - start)
            spent["model"].append(time.perf_counter() - featurized)
        featurize[f"batch_{size}"] = round(1000 * statistics.median(spent["featurize"]) / size, 6)
        model[f"batch_{size}"] = round(1000 * statistics.median(spent["model"]) / size, 6)
    return {"featurize_ms_per_item": featurize, "model_ms_per_item": model,
            "total_ms_per_item": {key: round(featurize[key] + model[key], 6) for key in featurize},
            "graph": graph_size(onnx_path), "threads": THREADS, "machine": machine()}


def _take(items: np.ndarray | Sequence, start: int, size: int) -> np.ndarray | list:
    """`size` items from `start` on, wrapping around."""
    at = [(start + i) % len(items) for i in range(size)]
    return items[at] if isinstance(items, np.ndarray) else [items[i] for i in at]


def graph_size(onnx_path: Path) -> dict[str, int]:
    """The ONNX file's bytes, its operator nodes (local functions' too) and its parameters (initialiser elements)."""
    model = onnx.load(str(onnx_path), load_external_data=False)
    nodes = len(model.graph.node) + sum(len(function.node) for function in model.functions)
    parameters = sum(int(np.prod(tensor.dims)) for tensor in model.graph.initializer)
    return {"bytes": Path(onnx_path).stat().st_size, "nodes": nodes, "parameters": parameters}


def machine() -> str:
    """The CPU, its count and ONNX Runtime's version, in one line."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as info:
            cpu = next((line.split(":", 1)[1].strip() for line in info if line.startswith("model name")), cpu)
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} CPUs, onnxruntime {onnxruntime.__version__}"


def cost_line(cost: dict) -> str:
    """The cost in one line, for a stage's output."""
    total, graph = cost["total_ms_per_item"], cost["graph"]
    return (f"serving cost {total['batch_1']:.2f} ms per item alone, {total['batch_64']:.2f} ms per item in batches "
            f"of 64 (featurisation {cost['featurize_ms_per_item']['batch_64']:.2f}); graph {graph['nodes']} nodes, "
            f"{graph['parameters']:,} parameters, {graph['bytes'] / 2**20:.1f} MiB")


def cost_metrics(cost: dict) -> dict[str, float]:
    """Flat MLflow metrics of the cost."""
    return {**{f"serve_ms_per_item_{key}": value for key, value in cost["total_ms_per_item"].items()},
            **{f"featurize_ms_per_item_{key}": value for key, value in cost["featurize_ms_per_item"].items()},
            "graph_nodes": cost["graph"]["nodes"], "graph_parameters": cost["graph"]["parameters"]}
