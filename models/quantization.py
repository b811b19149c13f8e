"""int8 quantisation of an exported sensor ONNX model with ONNX Runtime's tools (no torch; used by the export stage).

Convolutions get static int8 (per-channel weights, activation ranges calibrated by MinMax on featurised
validation windows); MatMuls get dynamic int8 weights (activations quantised at run time). On the sensor ensemble
this was the fastest mix measured (docs/decisions/0008-onnx-export.md): static MatMul quantisation moved
probabilities by up to 0.06, dynamic Conv (ConvInteger) was slower than float. Weights use 7 of their 8 bits (`reduce_range`): on x86 CPUs
without VNNI (AVX2 only) ONNX Runtime's u8 x s8 kernels sum pairs of products in 16 bits, which saturate with full-range
weights (a trained ensemble's probabilities moved by 0.18 on an AMD EPYC with AVX2, 0.012 with the reduced range). The result's outputs differ from the float model's, so the export
stage evaluates and registers the quantised file itself and bounds the difference.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import onnx
from onnxruntime.quantization import (CalibrationDataReader, CalibrationMethod, QuantFormat, QuantType,
                                      quantize_dynamic, quantize_static)
from onnxruntime.quantization.shape_inference import quant_pre_process


class _Batches(CalibrationDataReader):
    """Feeds the graph's inputs ({name: (n, ...)}) to the calibrator in batches."""

    def __init__(self, inputs: dict[str, np.ndarray], batch_size: int):
        n = len(next(iter(inputs.values())))
        self._batches = iter([{name: value[i:i + batch_size] for name, value in inputs.items()}
                              for i in range(0, n, batch_size)])

    def get_next(self) -> dict | None:
        return next(self._batches, None)


def quantize_sensor_model(source: str | Path, target: str | Path, calibration: np.ndarray | dict[str, np.ndarray],
                          batch_size: int = 64) -> Path:
    """Write an int8 version of the float ONNX model `source` to `target`: static int8 Conv calibrated on
    `calibration` (n, 2C, T) float32 featurised windows (e.g. validation; never test), or the graph's inputs by name
    for a graph that takes more (the novelty graph's references), then dynamic int8 MatMul."""
    if not isinstance(calibration, dict):
        calibration = {"features": calibration}
    calibration = {name: np.asarray(value, dtype=np.float32) for name, value in calibration.items()}
    if len(calibration["features"]) == 0:
        raise ValueError("quantisation needs at least one calibration window")
    target = Path(target)
    with tempfile.TemporaryDirectory(prefix="quantize-") as tmp:
        prepared, convs = Path(tmp) / "prepared.onnx", Path(tmp) / "static_conv.onnx"
        quant_pre_process(str(source), str(prepared), skip_symbolic_shape=True)  # ORT's symbolic pass fails here
        quantize_static(str(prepared), str(convs), _Batches(calibration, batch_size),
                        quant_format=QuantFormat.QOperator, op_types_to_quantize=["Conv"], per_channel=True,
                        activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8,
                        calibrate_method=CalibrationMethod.MinMax, reduce_range=True)
        static = onnx.load(str(convs))
        del static.graph.value_info[:]  # stale shapes from before the Conv rewrite fail the next shape inference
        unshare_gemm_weights(static.graph)
        onnx.save(static, str(convs))
        quantize_dynamic(str(convs), str(target), op_types_to_quantize=["MatMul"], per_channel=True,
                         weight_type=QuantType.QInt8, reduce_range=True)
    return target


def unshare_gemm_weights(graph: onnx.GraphProto) -> None:
    """Give every Gemm its own copy of a weight initializer it shares with another node. quantize_dynamic rewrites
    each Gemm with transB as a MatMul by transposing its weight in place, assuming nobody else reads it: a weight
    shared by two Gemms (one Linear run on each fixed-mask pass, models/mc_dropout.py) would be transposed twice."""
    initializers = {tensor.name: tensor for tensor in graph.initializer}
    readers: dict[str, int] = {}
    for node in graph.node:
        for name in node.input:
            readers[name] = readers.get(name, 0) + 1
    for node in graph.node:
        weight = node.input[1] if node.op_type == "Gemm" and len(node.input) > 1 else None
        if weight in initializers and readers[weight] > 1:
            readers[weight] -= 1
            copy = onnx.TensorProto()
            copy.CopyFrom(initializers[weight])
            copy.name = f"{weight}.{node.name}"
            graph.initializer.append(copy)
            node.input[1] = copy.name
