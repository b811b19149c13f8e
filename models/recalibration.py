"""Recalibration of a deployed model on labelled outcomes, composed onto its exported ONNX graph (numpy, scipy, onnx;
torch-free).

The prediction store keeps what a model answered, not its inputs, so the new calibration is a map of the served
output, appended to the graph with onnx.helper; the graph's other nodes are untouched.
- Probability (sensor; molecule classification): temperature or centred isotonic regression (models/calibration.py)
  of the served probability p, chosen by cross-fitted NLL. Both maps g increase strictly, so the ranking of
  windows (PR-AUC, ROC-AUC) is kept. The uncertainty (the members' spread) is carried through g to first order:
  uncertainty * g'(p) (the delta method).
- Interval (molecule regression): the uncertainty times a factor k, fitted by the calibrate stage's rule (scaled
  variance or split conformal) on the outcomes' residuals.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import singledispatch
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from scipy.special import logit

from models.calibration import (Calibrator, IntervalCalibrator, IntervalScaleRecalibration, IsotonicCalibration,
                                ProbabilityCalibrator, TemperatureCalibration, calibrated_probability,
                                calibrator_class, parse_calibration, select_calibration)

EPS = 1e-6  # probabilities are clipped to [EPS, 1 - EPS] before the logit (in numpy and in the graph)


def served_logits(p: np.ndarray) -> np.ndarray:
    """(n,) served probabilities -> (n, 1) logits: one "member" for models/calibration.py."""
    return logit(np.clip(np.asarray(p, dtype=np.float64), EPS, 1 - EPS))[:, None]


def fit_probability_map(p: np.ndarray, y: np.ndarray, groups: np.ndarray | None,
                        methods: list[str]) -> ProbabilityCalibrator:
    """The probability calibration that maps served probabilities p (n,) onto outcomes y (n,) 0/1, the method chosen
    by NLL cross-fitted over `groups` (e.g. units; None: single outcomes); its scores ride along as `cv_nll`."""
    calibration, scores = select_calibration(served_logits(p), y, groups, methods)
    return calibration.with_extra(cv_nll=scores)


def apply_probability_map(p: np.ndarray, calibration: ProbabilityCalibrator | dict) -> np.ndarray:
    """g(p) in numpy: what the composed graph answers for served probabilities p (n,)."""
    return calibrated_probability(served_logits(p), calibration)


def fit_uncertainty_map(y: np.ndarray, value: np.ndarray, uncertainty: np.ndarray, method: str,
                        z: float) -> IntervalScaleRecalibration:
    """A factor k of the served uncertainty (n,), fitted by the calibrate stage's interval `method` on the outcomes'
    residuals: scaled_variance (residual / (k * uncertainty) has unit mean square) or conformal (value +- z * k *
    uncertainty is a split-conformal interval at the nominal coverage of z)."""
    residuals = np.asarray(y, dtype=float) - np.asarray(value, dtype=float)
    factor = calibrator_class(method, IntervalCalibrator).fit_scale(residuals, uncertainty, z)
    return IntervalScaleRecalibration(factor=factor)


def _constant(name: str, value) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(value, dtype=np.float32), name)


@dataclass(frozen=True)
class GraphStep:
    """Nodes and initializers that recompute the graph outputs `outputs` from their served values (tensors named
    `recal_served_<output>`); every other tensor name starts with `recal_`."""

    nodes: list[onnx.NodeProto]
    constants: list[onnx.TensorProto]
    outputs: tuple[str, ...]


@singledispatch
def graph_step(recalibration: Calibrator) -> GraphStep:
    """The recalibration as ONNX nodes; each kind that can be composed onto a served graph registers its own."""
    raise ValueError(f"calibration method '{recalibration.method}' cannot be composed onto a served graph")


def _probability_step(body: list[onnx.NodeProto], constants: list[onnx.TensorProto]) -> GraphStep:
    """g(p) and g'(p) from `body` (reading recal_p, the clipped served probability; writing recal_q = g(p) and
    recal_slope = g'(p)): probability = g(p), uncertainty carried through g to first order."""
    make = helper.make_node
    nodes = [make("Clip", ["recal_served_probability", "recal_eps", "recal_one_minus_eps"], ["recal_p"]), *body,
             make("Identity", ["recal_q"], ["probability"]),
             make("Mul", ["recal_served_uncertainty", "recal_slope"], ["uncertainty"])]
    return GraphStep(nodes, [_constant("recal_eps", EPS), _constant("recal_one_minus_eps", 1 - EPS), *constants],
                     ("probability", "uncertainty"))


@graph_step.register(TemperatureCalibration)
def _temperature_step(calibration: TemperatureCalibration) -> GraphStep:
    """q = sigmoid(logit(p) / T); dq/dp = q (1 - q) / (T p (1 - p))."""
    make = helper.make_node
    body = [
        make("Sub", ["recal_one", "recal_p"], ["recal_1mp"]),
        make("Div", ["recal_p", "recal_1mp"], ["recal_odds"]),
        make("Log", ["recal_odds"], ["recal_logit"]),
        make("Div", ["recal_logit", "recal_temperature"], ["recal_scaled"]),
        make("Sigmoid", ["recal_scaled"], ["recal_q"]),
        make("Sub", ["recal_one", "recal_q"], ["recal_1mq"]),
        make("Mul", ["recal_q", "recal_1mq"], ["recal_dq"]),
        make("Mul", ["recal_p", "recal_1mp"], ["recal_dp"]),
        make("Mul", ["recal_dp", "recal_temperature"], ["recal_dpt"]),
        make("Div", ["recal_dq", "recal_dpt"], ["recal_slope"]),
    ]
    constants = [_constant("recal_one", 1.0), _constant("recal_temperature", calibration.temperature)]
    return _probability_step(body, constants)


@graph_step.register(IsotonicCalibration)
def _isotonic_step(calibration: IsotonicCalibration) -> GraphStep:
    """y0 + sum_i slope_i * min(relu(p - x_i), w_i), as models/sensor/calibrated.PiecewiseLinear; g'(p) the slope of
    the segment p lies in."""
    make = helper.make_node
    x, y = np.asarray(calibration.knots_x, np.float64), np.asarray(calibration.knots_y, np.float64)
    width = x[1:] - x[:-1]
    slope = np.where(width > 0, (y[1:] - y[:-1]) / np.maximum(width, 1e-12), 0.0)
    body = [
        make("Unsqueeze", ["recal_p", "recal_last_axis"], ["recal_column"]),
        make("Sub", ["recal_column", "recal_start"], ["recal_offset"]),
        make("Relu", ["recal_offset"], ["recal_positive"]),
        make("Min", ["recal_positive", "recal_width"], ["recal_steps"]),
        make("Mul", ["recal_steps", "recal_slopes"], ["recal_rises"]),
        make("ReduceSum", ["recal_rises", "recal_last_axis"], ["recal_rise"], keepdims=0),
        make("Add", ["recal_rise", "recal_y0"], ["recal_q"]),
        make("GreaterOrEqual", ["recal_offset", "recal_zero"], ["recal_after_start"]),
        make("Less", ["recal_offset", "recal_width"], ["recal_before_end"]),
        make("And", ["recal_after_start", "recal_before_end"], ["recal_in_segment"]),
        make("Cast", ["recal_in_segment"], ["recal_segment"], to=TensorProto.FLOAT),
        make("Mul", ["recal_segment", "recal_slopes"], ["recal_segment_slopes"]),
        make("ReduceSum", ["recal_segment_slopes", "recal_last_axis"], ["recal_slope"], keepdims=0),
    ]
    constants = [numpy_helper.from_array(np.array([-1], np.int64), "recal_last_axis"),
                 _constant("recal_start", x[:-1]), _constant("recal_width", width), _constant("recal_slopes", slope),
                 _constant("recal_y0", y[0]), _constant("recal_zero", 0.0)]
    return _probability_step(body, constants)


@graph_step.register(IntervalScaleRecalibration)
def _interval_scale_step(recalibration: IntervalScaleRecalibration) -> GraphStep:
    """uncertainty = factor * served uncertainty."""
    nodes = [helper.make_node("Mul", ["recal_served_uncertainty", "recal_factor"], ["uncertainty"])]
    return GraphStep(nodes, [_constant("recal_factor", recalibration.factor)], ("uncertainty",))


def _rename_output(graph: onnx.GraphProto, name: str, new: str) -> None:
    """Make the tensor graph output `name` an internal tensor called `new` (producers and consumers renamed)."""
    for node in graph.node:
        node.output[:] = [new if o == name else o for o in node.output]
        node.input[:] = [new if i == name else i for i in node.input]


def _free_prefix(graph: onnx.GraphProto) -> str:
    """`recal<k>_` for the first k no tensor of `graph` uses yet (a recalibrated graph can be recalibrated again)."""
    names = {n for node in graph.node for n in (*node.input, *node.output)} | {i.name for i in graph.initializer}
    k = 0
    while any(name.startswith(f"recal{k}_") for name in names):
        k += 1
    return f"recal{k}_"


def compose_recalibration(source: Path, destination: Path, recalibration: Calibrator | dict) -> Path:
    """Write `source` ONNX with a recalibration step on its outputs to `destination`.

    recalibration: a probability map (temperature | isotonic, on outputs `probability` and `uncertainty`) or an
    interval scale (output `uncertainty` times its factor), or its JSON form. Output names and shapes stay."""
    step = graph_step(parse_calibration(recalibration))
    model = onnx.load(str(source))
    graph = model.graph
    names = [o.name for o in graph.output]
    if "uncertainty" not in names:
        raise ValueError(f"{source}: the graph has no `uncertainty` output (outputs: {names})")
    for name in step.outputs:
        if name not in names:
            raise ValueError(f"{source}: the graph has no `{name}` output to recalibrate (outputs: {names})")
    for name in step.outputs:
        _rename_output(graph, name, f"recal_served_{name}")
    prefix = _free_prefix(graph)
    for node in graph.node:  # only the served tensors carry the placeholder prefix so far
        node.output[:] = [prefix + o[len("recal_"):] if o.startswith("recal_served_") else o for o in node.output]
        node.input[:] = [prefix + i[len("recal_"):] if i.startswith("recal_served_") else i for i in node.input]
    for node in step.nodes:
        node.input[:] = [prefix + i[len("recal_"):] if i.startswith("recal_") else i for i in node.input]
        node.output[:] = [prefix + o[len("recal_"):] if o.startswith("recal_") else o for o in node.output]
    for constant in step.constants:
        constant.name = prefix + constant.name[len("recal_"):]
    graph.node.extend(step.nodes)
    graph.initializer.extend(step.constants)
    onnx.checker.check_model(model, full_check=True)
    destination.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(destination))
    return destination
