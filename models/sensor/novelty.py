"""Departure from a unit's own normal behaviour, scored by the pretrained encoder and its masked-reconstruction decoder.

`NoveltyScorer` gives a window's description (its embedding and its channels' means) and its masked-reconstruction
error: every time step is hidden once, by PATTERNS fixed interleaved span masks, so the score is deterministic (and
exportable). models/sensor/departure.py compares both with the unit's reference; `NoveltyCalibrator` maps the three
departure numbers to a probability of "abnormal" by a logistic regression on validation windows whose weights cannot
be negative: departing further never lowers the probability, whatever fault types validation happens to hold.
"""

from __future__ import annotations

import numpy as np
import torch
from scipy.optimize import minimize
from torch import nn

from models.batching import index_batches
from models.sensor.departure import EPS
from models.sensor.encoder import SensorEncoder

PATTERNS = 4  # span masks: step t is hidden by pattern (t // span) % PATTERNS, so each pattern hides a quarter


class NoveltyScorer(nn.Module):
    """The pretrained encoder and decoder as a scorer: x (B, 2C, T) -> (description (B, E + C), reconstruction error
    (B,)).

    The description is the encoder's embedding followed by the mean of each channel's observed values (0 for a
    channel with none): where a fault moves a channel's level, the window departs from its unit's reference there
    even when the encoder, trained on other faults, does not tell it apart. The error is the mean squared error of the observed values, each reconstructed with its span hidden (the values
    and observed-masks of the hidden steps zeroed, as in pretraining); a window with nothing observed scores 0.
    """

    def __init__(self, encoder: SensorEncoder, decoder: nn.Conv1d, n_channels: int, span: int):
        super().__init__()
        self.encoder, self.decoder = encoder, decoder
        self.n_channels, self.span = n_channels, span

    @property
    def description_size(self) -> int:
        return self.encoder.embedding_size + self.n_channels

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
        observed = x[:, c:]
        means = (x[:, :c] * observed).sum(dim=-1) / observed.sum(dim=-1).clamp(min=1.0)
        return torch.cat([self.encoder(x), means], dim=-1), error


@torch.no_grad()
def score_windows(scorer: NoveltyScorer, features: np.ndarray, batch_size: int = 512) -> tuple[np.ndarray, np.ndarray]:
    """features (n, 2C, T) -> (descriptions (n, E + C), reconstruction errors (n,)), in eval mode on the CPU."""
    scorer.eval().cpu()
    parts = [scorer(torch.from_numpy(np.ascontiguousarray(features[idx]))) for idx in index_batches(len(features),
                                                                                                     batch_size, None)]
    if not parts:
        return np.empty((0, scorer.description_size), np.float32), np.empty(0, np.float32)
    return torch.cat([p[0] for p in parts]).numpy(), torch.cat([p[1] for p in parts]).numpy()


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
    """`fit(features (n, 3), y (n,))` on validation windows; `predict_proba(features) -> (n,)` P(abnormal)."""

    def fit(self, features: np.ndarray, y: np.ndarray) -> NoveltyCalibrator:
        if len(np.unique(y)) < 2:
            raise ValueError("the novelty calibration needs validation windows of both classes")
        self.coef_, self.intercept_ = fit_monotone_logistic(features, y)
        return self

    def predict_proba(self, features: np.ndarray) -> np.ndarray:
        return 1 / (1 + np.exp(-(features @ self.coef_ + self.intercept_)))
