"""Post-hoc calibration fitted on the validation split (torch-free), and the typed calibrations it produces.

A fitted calibration is a pydantic model whose `method` names its kind (the tagged union's discriminator):
- probability maps of the members' logits (n, members) -> (n,): `temperature`, `isotonic`;
- interval scales of the ensemble's spread (n,): `scaled_variance`, `conformal` (value +- interval_z * scale *
  spread);
- `interval_scale`: a factor of a served uncertainty (a deployed model's recalibration, models/recalibration.py).
`Calibration` validates the JSON form (artifacts/<family>/calibration.json, a model card's `calibration`) into its
class and dumps it back unchanged: keys written next to the parameters (scores, the alert threshold) are kept. A new
kind is a subclass registered with `@register`; nothing else dispatches on `method`.

At import this module needs numpy and pydantic only (serving reads calibrations without scipy or scikit-learn);
fitting and applying import scipy and scikit-learn where they run.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Annotated, Any, Literal, TypeVar, get_args

import numpy as np
from pydantic import BaseModel, BeforeValidator, ConfigDict, SerializeAsAny


def ensemble_probability(logits: np.ndarray, temperature: float = 1.0) -> np.ndarray:
    """Mean over members of sigmoid(logit / T). logits: (n, members) -> (n,)."""
    from scipy.special import expit

    return expit(np.asarray(logits, dtype=float) / temperature).mean(axis=1)


def fit_temperature(logits: np.ndarray, y: np.ndarray) -> float:
    """Temperature T > 0 minimising the validation NLL of `ensemble_probability(logits, T)`.

    logits: (n, members); y: (n,) 0/1.
    """
    from scipy.optimize import minimize_scalar

    y = np.asarray(y, dtype=float)

    def nll(log_t: float) -> float:
        p = np.clip(ensemble_probability(logits, float(np.exp(log_t))), 1e-7, 1 - 1e-7)
        return float(-np.mean(y * np.log(p) + (1 - y) * np.log(1 - p)))

    best = minimize_scalar(nll, bounds=(np.log(0.05), np.log(20.0)), method="bounded")
    return float(np.exp(best.x))


def fit_interval_scale(residuals: np.ndarray, spread: np.ndarray) -> float:
    """Scale s so that residual / (s * spread) has unit mean square on validation (scaled variance).

    residuals, spread: (n,), spread > 0 (e.g. the ensemble's standard deviation).
    """
    z = np.asarray(residuals, dtype=float) / np.maximum(np.asarray(spread, dtype=float), 1e-8)
    return float(np.sqrt(np.mean(z**2)))


def choose_threshold(y: np.ndarray, p: np.ndarray, target_precision: float) -> float:
    """The lowest alert threshold whose validation precision reaches `target_precision`
    (the most recall at that precision); if none does, the threshold of best F2."""
    from sklearn.metrics import precision_recall_curve

    precision, recall, thresholds = precision_recall_curve(y, p)
    precision, recall = precision[:-1], recall[:-1]
    ok = np.flatnonzero(precision >= target_precision)
    if len(ok):
        return float(thresholds[ok[np.argmax(recall[ok])]])
    f2 = 5 * precision * recall / np.maximum(4 * precision + recall, 1e-12)
    return float(thresholds[np.argmax(f2)])


# ---------------------------------------------------------------- isotonic calibration and the choice of method

ISOTONIC_FLOOR = 1e-3  # isotonic probabilities are kept in [1e-3, 1 - 1e-3] (finite NLL, no certain alerts)
MIN_KNOT_GAP = 1e-6  # neighbouring knots closer than this (in p) are pooled: bounded slopes, float32-safe export


def _pava(p: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Pool-adjacent-violators on (p, y) sorted by p, equal p pooled first.

    Returns the blocks as (centre, value, weight) arrays: centre = mean p of the block's points,
    value = mean y (the isotonic fit), weight = number of points; values strictly increase."""
    order = np.argsort(p, kind="stable")
    p, y = p[order], y[order]
    _, first, counts = np.unique(p, return_index=True, return_counts=True)
    sum_p, sum_y, weight = list(np.add.reduceat(p, first)), list(np.add.reduceat(y, first)), list(counts.astype(float))
    out_p: list[float] = []
    out_y: list[float] = []
    out_w: list[float] = []
    for sp, sy, w in zip(sum_p, sum_y, weight):
        out_p.append(sp), out_y.append(sy), out_w.append(w)
        # pool while the last block's mean does not exceed the previous one's (>=: strictly increasing values)
        while len(out_w) > 1 and out_y[-2] / out_w[-2] >= out_y[-1] / out_w[-1]:
            sp, sy, w = out_p.pop(), out_y.pop(), out_w.pop()
            out_p[-1] += sp
            out_y[-1] += sy
            out_w[-1] += w
    w = np.asarray(out_w)
    return np.asarray(out_p) / w, np.asarray(out_y) / w, w


def _pool_close(centre: np.ndarray, value: np.ndarray, weight: np.ndarray, gap: float):
    """Pool neighbouring blocks whose centres are closer than `gap` (weighted means: values stay strictly increasing)."""
    c, v, w = [centre[0]], [value[0]], [weight[0]]
    for ci, vi, wi in zip(centre[1:], value[1:], weight[1:]):
        if ci - c[-1] < gap:
            total = w[-1] + wi
            c[-1], v[-1], w[-1] = (c[-1] * w[-1] + ci * wi) / total, (v[-1] * w[-1] + vi * wi) / total, total
        else:
            c.append(ci), v.append(vi), w.append(wi)
    return np.asarray(c), np.asarray(v), np.asarray(w)


def fit_isotonic(p: np.ndarray, y: np.ndarray) -> tuple[list[float], list[float]]:
    """Centred isotonic regression (CIR, Oron & Flournoy 2017) of y on probabilities p (both (n,)):
    knots (x, y) of a strictly increasing piecewise-linear map on [0, 1].

    Plain isotonic regression (pool-adjacent-violators) is a step function: every window inside a
    block gets the same probability, and those ties destroy the ranking (average precision drops).
    CIR keeps the PAV fit but places one knot at the centre (mean p) of each block, valued at the
    block's mean label, and interpolates linearly between neighbouring centres. PAV block values
    strictly increase, so the map strictly increases between the first and last centre; two anchor
    knots, (0, ISOTONIC_FLOOR / 2) and (1, 1 - ISOTONIC_FLOOR / 2), extend it strictly to [0, 1].
    A strictly increasing map leaves the order of the windows, hence PR-AUC and ROC-AUC, unchanged.

    Block values are clipped to [ISOTONIC_FLOOR, 1 - ISOTONIC_FLOOR] (blocks clipped to the same
    bound are pooled, as are blocks whose centres lie closer than MIN_KNOT_GAP), so outputs stay in
    (0, 1) and slopes stay bounded. np.interp semantics (constant outside [0, 1], never reached by
    probabilities); the ONNX graph evaluates the same map (models/sensor/calibrated.PiecewiseLinear).
    """
    p = np.asarray(p, dtype=float)
    y = np.asarray(y, dtype=float)
    if len(p) == 0:
        raise ValueError("isotonic calibration needs at least one point")
    centre, value, weight = _pava(p, y)
    value = np.clip(value, ISOTONIC_FLOOR, 1 - ISOTONIC_FLOOR)
    # blocks clipped to the same bound tie: pool them (their weighted mean stays at the bound)
    keep_c, keep_v, keep_w = [centre[0]], [value[0]], [weight[0]]
    for ci, vi, wi in zip(centre[1:], value[1:], weight[1:]):
        if vi <= keep_v[-1]:
            total = keep_w[-1] + wi
            keep_c[-1], keep_w[-1] = (keep_c[-1] * keep_w[-1] + ci * wi) / total, total
        else:
            keep_c.append(ci), keep_v.append(vi), keep_w.append(wi)
    centre, value, _ = _pool_close(np.asarray(keep_c), np.asarray(keep_v), np.asarray(keep_w), MIN_KNOT_GAP)
    inside = (centre > MIN_KNOT_GAP) & (centre < 1 - MIN_KNOT_GAP)
    centre, value = centre[inside], value[inside]
    knots_x = [0.0, *centre.tolist(), 1.0]
    knots_y = [ISOTONIC_FLOOR / 2, *value.tolist(), 1 - ISOTONIC_FLOOR / 2]
    return [float(v) for v in knots_x], [float(v) for v in knots_y]


def piecewise_linear(p: np.ndarray, knots_x: list[float], knots_y: list[float]) -> np.ndarray:
    """The isotonic map: linear between knots, constant outside."""
    return np.interp(np.asarray(p, dtype=float), knots_x, knots_y)


def binary_nll(y: np.ndarray, p: np.ndarray, eps: float = 1e-7) -> float:
    p = np.clip(np.asarray(p, dtype=float), eps, 1 - eps)
    y = np.asarray(y, dtype=float)
    return float(-np.mean(y * np.log(p) + (1 - y) * np.log(1 - p)))


def cross_fitted_nll(y: np.ndarray, splits: Iterable[tuple[np.ndarray, np.ndarray]],
                     predict: Callable[[np.ndarray, np.ndarray], np.ndarray]) -> float:
    """NLL of labels y (n,) 0/1 under out-of-fold probabilities: for each (fit, out) index split, predict(fit, out)
    gives the probabilities of rows `out` from a map fitted on rows `fit` alone (a fitting part holding one class
    predicts its rate instead)."""
    p = np.empty(len(y))
    for fit, out in splits:
        p[out] = y[fit].mean() if len(np.unique(y[fit])) < 2 else predict(fit, out)
    return binary_nll(y, p)


# ---------------------------------------------------------------- the typed calibrations and their registry

class Calibrator(BaseModel):
    """A fitted calibration: `method` (the discriminator, a Literal in each registered subclass) and its parameters.
    Other keys read with it are kept (extra) and dumped back, so a file reads and writes unchanged."""

    model_config = ConfigDict(extra="allow", frozen=True)
    method: str

    def to_dict(self) -> dict[str, Any]:
        """The JSON form: the parameters, then whatever else was read or added with them."""
        return self.model_dump(mode="json")

    def with_extra(self, **values: Any) -> Calibrator:
        """The same calibration with `values` written next to it (e.g. its cross-fitted scores)."""
        return type(self).model_validate({**self.to_dict(), **values})


CALIBRATORS: dict[str, type[Calibrator]] = {}
Kind = TypeVar("Kind", bound=Calibrator)


def register(cls: type[Kind]) -> type[Kind]:
    """Class decorator: `cls` becomes the kind of calibration its `method` Literal names."""
    (method,) = get_args(cls.model_fields["method"].annotation)
    CALIBRATORS[method] = cls
    return cls


def calibrator_class(method: str, kind: type[Kind]) -> type[Kind]:
    """The registered class of `method`; ValueError unless it is a `kind` (e.g. ProbabilityCalibrator)."""
    cls = CALIBRATORS.get(method)
    if cls is None or not issubclass(cls, kind):
        known = " | ".join(m for m, c in CALIBRATORS.items() if issubclass(c, kind))
        raise ValueError(f"unknown calibration method '{method}' ({known})")
    return cls


def parse_calibration(value: Calibrator | dict[str, Any]) -> Calibrator:
    """A calibration dict (JSON form) -> its registered class; a Calibrator as it is."""
    if isinstance(value, Calibrator):
        return value
    if not isinstance(value, dict):
        raise ValueError(f"a calibration is a mapping with a `method`, not {type(value).__name__}")
    return calibrator_class(str(value.get("method")), Calibrator).model_validate(value)


# The tagged union over every registered kind, for pydantic fields (e.g. a model card's `calibration`).
Calibration = Annotated[SerializeAsAny[Calibrator], BeforeValidator(parse_calibration)]


class ProbabilityCalibrator(Calibrator):
    """Maps member logits (n, members) to one calibrated probability per row (n,)."""

    def probability(self, logits: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    @classmethod
    def fit(cls, logits: np.ndarray, y: np.ndarray) -> ProbabilityCalibrator:
        """Fitted on logits (n, members) and labels y (n,) 0/1."""
        raise NotImplementedError


@register
class TemperatureCalibration(ProbabilityCalibrator):
    """Mean over members of sigmoid(logit / temperature)."""

    method: Literal["temperature"] = "temperature"
    temperature: float

    def probability(self, logits: np.ndarray) -> np.ndarray:
        return ensemble_probability(logits, self.temperature)

    @classmethod
    def fit(cls, logits: np.ndarray, y: np.ndarray) -> TemperatureCalibration:
        return cls(temperature=fit_temperature(logits, y))


@register
class IsotonicCalibration(ProbabilityCalibrator):
    """The centred isotonic map (fit_isotonic's knots) of the members' mean probability; `temperature` stays 1."""

    method: Literal["isotonic"] = "isotonic"
    temperature: float = 1.0
    knots_x: list[float]
    knots_y: list[float]

    def probability(self, logits: np.ndarray) -> np.ndarray:
        return piecewise_linear(ensemble_probability(logits), self.knots_x, self.knots_y)

    @classmethod
    def fit(cls, logits: np.ndarray, y: np.ndarray) -> IsotonicCalibration:
        knots_x, knots_y = fit_isotonic(ensemble_probability(logits), y)
        return cls(knots_x=knots_x, knots_y=knots_y)


class IntervalCalibrator(Calibrator):
    """value +- interval_z * scale * spread, an interval at `nominal_coverage` from the ensemble's spread (n,)."""

    scale: float
    interval_z: float
    nominal_coverage: float

    @staticmethod
    def fit_scale(residuals: np.ndarray, spread: np.ndarray, z: float) -> float:
        """The scale of spread (n,) fitted to residuals (n,) for intervals of half-width z * scale * spread."""
        raise NotImplementedError

    @classmethod
    def fit(cls, residuals: np.ndarray, spread: np.ndarray, z: float) -> IntervalCalibrator:
        from models.molecule.calibration import nominal_coverage

        return cls(scale=cls.fit_scale(residuals, spread, z), interval_z=z, nominal_coverage=nominal_coverage(z))

    def half_width(self, spread: np.ndarray) -> np.ndarray:
        return self.interval_z * self.scale * spread


@register
class ScaledVarianceCalibration(IntervalCalibrator):
    """residual / (scale * spread) has unit mean square on validation."""

    method: Literal["scaled_variance"] = "scaled_variance"

    @staticmethod
    def fit_scale(residuals: np.ndarray, spread: np.ndarray, z: float) -> float:
        return fit_interval_scale(residuals, np.asarray(spread, dtype=float))


@register
class ConformalCalibration(IntervalCalibrator):
    """value +- interval_z * scale * spread is a split-conformal interval at nominal_coverage."""

    method: Literal["conformal"] = "conformal"

    @staticmethod
    def fit_scale(residuals: np.ndarray, spread: np.ndarray, z: float) -> float:
        from models.molecule.calibration import fit_conformal_scale

        return fit_conformal_scale(residuals, spread, z)


@register
class IntervalScaleRecalibration(Calibrator):
    """A deployed model's served uncertainty (n,) times `factor` (models/recalibration.py)."""

    method: Literal["interval_scale"] = "interval_scale"
    factor: float

    def uncertainty(self, served: np.ndarray) -> np.ndarray:
        return self.factor * np.asarray(served, dtype=float)


def calibrated_probability(logits: np.ndarray, calibration: ProbabilityCalibrator | dict[str, Any]) -> np.ndarray:
    """Ensemble probability (n,) from member logits (n, members) under a probability calibration (or its JSON form).
    The same arithmetic runs inside the exported ONNX graph (models/sensor/calibrated.py)."""
    chosen = parse_calibration(calibration)
    if not isinstance(chosen, ProbabilityCalibrator):
        raise ValueError(f"calibration method '{chosen.method}' maps no probability")
    return chosen.probability(logits)


def select_calibration(logits: np.ndarray, y: np.ndarray, groups: np.ndarray | None, methods: list[str],
                       folds: int = 5) -> tuple[ProbabilityCalibrator, dict[str, float]]:
    """Choose among `methods` by cross-fitted validation NLL (grouped folds, e.g. by unit, so the score is
    not measured on what the map was fitted to), then refit the winner on all of validation.

    Returns (the winner fitted, {method: cross-fitted NLL}). Where nothing can be cross-fitted (one
    method, one group, or a class seen fewer than twice) the first method is fitted on all of validation and the
    scores are empty.
    """
    from sklearn.model_selection import GroupKFold, StratifiedKFold

    kinds = {method: calibrator_class(method, ProbabilityCalibrator) for method in methods}
    y = np.asarray(y).astype(int)
    groups = np.arange(len(y)) if groups is None else np.asarray(groups)
    n_groups = len(np.unique(groups))
    minority = int(np.bincount(y, minlength=2).min())
    if len(methods) == 1 or n_groups < 2 or minority < 2:
        return kinds[methods[0]].fit(logits, y), {}
    if n_groups < len(y):
        splits = list(GroupKFold(n_splits=min(folds, n_groups)).split(logits, y, groups))
    else:
        splits = list(StratifiedKFold(n_splits=min(folds, minority), shuffle=True, random_state=0).split(logits, y))
    scores = {method: cross_fitted_nll(y, splits, lambda fit, out: kinds[method].fit(logits[fit], y[fit])
                                       .probability(logits[out])) for method in methods}
    best = min(scores, key=scores.get)
    return kinds[best].fit(logits, y), scores
