"""The serving cost a model card carries, measured on a real ONNX Runtime session over a small real graph."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from contract.card import ServingCost
from models.onnx_runtime import load_session, run
from models.serving_cost import BATCH_SIZES, THREADS, cost_line, serving_cost


class RowsPredictor:
    """Rows (n, 3) -> their product with a (3, 4) weight; featurisation casts to float32."""

    def __init__(self, path):
        self.session, _ = load_session(path, prefer_cuda=False, threads=THREADS)
        self.featurized = []

    def featurize(self, rows: np.ndarray) -> dict[str, np.ndarray]:
        self.featurized.append(len(rows))
        return {"x": np.asarray(rows, dtype=np.float32)}

    def run_features(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return run(self.session, inputs)


def small_graph(path) -> None:
    weight = numpy_helper.from_array(np.arange(12, dtype=np.float32).reshape(3, 4), "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"]), helper.make_node("Relu", ["y"], ["z"])],
                              "small", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3])],
                              [helper.make_tensor_value_info("z", TensorProto.FLOAT, ["n", 4])], [weight])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10), str(path))


def test_the_cost_is_measured_per_item_at_each_batch_size_with_the_graphs_size(tmp_path):
    path = tmp_path / "model.onnx"
    small_graph(path)
    predictor = RowsPredictor(path)
    cost = serving_cost(predictor, np.random.default_rng(0).normal(size=(10, 3)), path)
    ServingCost.model_validate(cost)  # the card's model of it
    assert set(predictor.featurized) == set(BATCH_SIZES)  # whole batches of each size, wrapping around 10 items
    for key in ("batch_1", "batch_64"):
        assert cost["featurize_ms_per_item"][key] > 0 and cost["model_ms_per_item"][key] > 0
        assert cost["total_ms_per_item"][key] == round(cost["featurize_ms_per_item"][key] +
                                                       cost["model_ms_per_item"][key], 6)
    assert cost["graph"] == {"bytes": path.stat().st_size, "nodes": 2, "parameters": 12}
    assert cost["threads"] == THREADS and "CPUs" in cost["machine"]
    assert "2 nodes, 12 parameters" in cost_line(cost)
