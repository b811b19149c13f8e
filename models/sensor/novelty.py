"""Departure from a unit's own normal behaviour, scored by the pretrained encoder and its masked-reconstruction decoder.

A window's departure is two numbers (`departure`):

* how far its embedding lies from the unit's reference embeddings: the log of the mean squared standardised
  distance over the E embedding dimensions;
* how much worse it is reconstructed than the reference windows: the log of its masked-reconstruction error over the
  reference's typical error. Every time step is hidden once, by PATTERNS fixed interleaved span masks, so the score
  is deterministic (and exportable).

A unit's reference (`fit_reference`) is the mean and spread of the embeddings of its healthy windows and their typical
reconstruction error, shrunk towards the training fleet's normal by PRIOR_WINDOWS windows' worth, so that a short
reference is not over-trusted; a unit without one is scored against the fleet's. `NoveltyCalibrator` maps the two
numbers to a probability of "abnormal" by a logistic regression on validation windows whose weights cannot be
negative: departing further never lowers the probability, whatever fault types validation happens to hold.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from scipy.optimize import minimize
from torch import nn

from models.batching import index_batches
from models.sensor.encoder import SensorEncoder

PATTERNS = 4  # span masks: step t is hidden by pattern (t // span) % PATTERNS, so each pattern hides a quarter
PRIOR_WINDOWS = 8.0  # a reference of n windows weighs n / (n + PRIOR_WINDOWS) against the fleet's
EPS = 1e-6


class NoveltyScorer(nn.Module):
    """The pretrained encoder and decoder as a scorer: x (B, 2C, T) -> (embedding (B, E), reconstruction error (B,)).

    The error is the mean squared error of the observed values, each reconstructed with its span hidden (the values
    and observed-masks of the hidden steps zeroed, as in pretraining); a window with nothing observed scores 0.
    """

    def __init__(self, encoder: SensorEncoder, decoder: nn.Conv1d, n_channels: int, span: int):
        super().__init__()
        self.encoder, self.decoder = encoder, decoder
        self.n_channels, self.span = n_channels, span

    def hidden_steps(self, length: int) -> torch.Tensor:
        """(PATTERNS, T) bool: pattern k hides the steps t with (t // span) % PATTERNS == k."""
        steps = torch.arange(length)
        return ((steps // self.span) % PATTERNS).unsqueeze(0) == torch.arange(PATTERNS).unsqueeze(1)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        batch, width, length = x.shape
        c = self.n_channels
        hidden = self.hidden_steps(length).to(x.device)  # (K, T)
        corrupted = x.unsqueeze(0) * (~hidden).to(x.dtype).view(PATTERNS, 1, 1, length)  # (K, B, 2C, T)
        recon = self.decoder(self.encoder.sequence(corrupted.reshape(PATTERNS * batch, width, length)))
        recon = recon.view(PATTERNS, batch, c, length)
        target = (hidden.view(PATTERNS, 1, 1, length) & (x[:, c:] > 0.5).unsqueeze(0)).to(x.dtype)  # (K, B, C, T)
        squared = (recon - x[:, :c].unsqueeze(0)) ** 2 * target
        error = squared.sum(dim=(0, 2, 3)) / target.sum(dim=(0, 2, 3)).clamp(min=1.0)
        return self.encoder(x), error


@torch.no_grad()
def score_windows(scorer: NoveltyScorer, features: np.ndarray, batch_size: int = 512) -> tuple[np.ndarray, np.ndarray]:
    """features (n, 2C, T) -> (embeddings (n, E), reconstruction errors (n,)), in eval mode on the CPU."""
    scorer.eval().cpu()
    parts = [scorer(torch.from_numpy(np.ascontiguousarray(features[idx]))) for idx in index_batches(len(features),
                                                                                                     batch_size, None)]
    if not parts:
        return np.empty((0, scorer.encoder.embedding_size), np.float32), np.empty(0, np.float32)
    return torch.cat([p[0] for p in parts]).numpy(), torch.cat([p[1] for p in parts]).numpy()


def first_windows(units: np.ndarray, times: np.ndarray, count: int) -> np.ndarray:
    """(n,) bool: the `count` earliest windows of each unit (its reference period when it starts healthy)."""
    order = np.lexsort((times, units))
    sorted_units = units[order]
    starts = np.r_[0, np.flatnonzero(sorted_units[1:] != sorted_units[:-1]) + 1]
    rank = np.arange(len(order)) - np.repeat(starts, np.diff(np.r_[starts, len(order)]))
    chosen = np.zeros(len(units), bool)
    chosen[order] = rank < count
    return chosen


@dataclass(frozen=True)
class Reference:
    """A unit's normal: embedding mean and spread (E,), the log of its typical reconstruction error, and how many
    windows it was fitted on (0: none, the fleet's normal stands in)."""

    mean: np.ndarray
    scale: np.ndarray
    log_error: float
    windows: int


def fit_reference(embeddings: np.ndarray, errors: np.ndarray, prior: Reference | None = None) -> Reference:
    """The reference of n healthy windows: embeddings (n, E), errors (n,). With a `prior` (the fleet's) the moments
    are shrunk towards it by PRIOR_WINDOWS; n = 0 gives the prior itself (with windows 0)."""
    n = len(embeddings)
    if n == 0:
        if prior is None:
            raise ValueError("a reference needs at least one window, or the fleet's reference to stand in")
        return Reference(prior.mean, prior.scale, prior.log_error, 0)
    mean, variance = embeddings.mean(axis=0), embeddings.var(axis=0)
    log_error = float(np.log(errors + EPS).mean())
    if prior is not None:
        own = n / (n + PRIOR_WINDOWS)
        variance = own * variance + (1 - own) * prior.scale ** 2
        mean = own * mean + (1 - own) * prior.mean
        log_error = own * log_error + (1 - own) * prior.log_error
    return Reference(mean.astype(np.float32), np.sqrt(variance + EPS).astype(np.float32), log_error, n)


def departure(embeddings: np.ndarray, errors: np.ndarray, mean: np.ndarray, scale: np.ndarray,
              log_error: np.ndarray) -> np.ndarray:
    """Each window against its unit's reference: embeddings (n, E), errors (n,), mean and scale (n, E), log_error (n,)
    -> (n, 2): [log mean squared standardised distance, log error - the reference's log error]."""
    distance = np.mean(((embeddings - mean) / scale) ** 2, axis=1)
    return np.stack([np.log(distance + EPS), np.log(errors + EPS) - log_error], axis=1).astype(np.float32)


def fit_monotone_logistic(features: np.ndarray, y: np.ndarray, l2: float = 1e-3) -> tuple[np.ndarray, float]:
    """Logistic regression p = sigmoid(features @ w + b) with w >= 0 (L-BFGS-B; a small L2 on w).
    features (n, k), y (n,) 0/1 -> (w (k,), b)."""
    x, y = np.asarray(features, np.float64), np.asarray(y, np.float64)
    k = x.shape[1]

    def loss(theta: np.ndarray) -> tuple[float, np.ndarray]:
        z = x @ theta[:k] + theta[k]
        p = 1 / (1 + np.exp(-z))
        value = np.mean(np.logaddexp(0, z) - y * z) + l2 * theta[:k] @ theta[:k]
        gradient = np.r_[x.T @ (p - y) / len(y) + 2 * l2 * theta[:k], np.mean(p - y)]
        return value, gradient

    prior = np.clip(y.mean(), EPS, 1 - EPS)
    start = np.r_[np.full(k, 0.1), np.log(prior / (1 - prior))]
    fitted = minimize(loss, start, jac=True, method="L-BFGS-B", bounds=[(0, None)] * k + [(None, None)])
    return fitted.x[:k].astype(np.float32), float(fitted.x[k])


class NoveltyCalibrator:
    """`fit(features (n, 2), y (n,))` on validation windows; `predict_proba(features) -> (n,)` P(abnormal)."""

    def fit(self, features: np.ndarray, y: np.ndarray) -> NoveltyCalibrator:
        if len(np.unique(y)) < 2:
            raise ValueError("the novelty calibration needs validation windows of both classes")
        self.coef_, self.intercept_ = fit_monotone_logistic(features, y)
        return self

    def predict_proba(self, features: np.ndarray) -> np.ndarray:
        return 1 / (1 + np.exp(-(features @ self.coef_ + self.intercept_)))
