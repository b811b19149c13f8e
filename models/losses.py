"""Losses for noisy, imbalanced binary labels, and the contrastive NT-Xent loss.

Binary losses take logits z (n,) and targets y (n,) in [0, 1] (soft targets allowed, e.g. after mixup)
and return per-sample losses (n,); `combined_loss` makes a weighted sum and reduces with optional
per-sample weights. p = sigmoid(z) throughout.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

RCE_LOG_FLOOR = 1e-4  # reverse CE: log 0 is replaced by log(1e-4), as in Wang et al. (2019)


def bce(z: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """-[y log p + (1 - y) log(1 - p)]."""
    return F.binary_cross_entropy_with_logits(z, y, reduction="none")


def focal(z: torch.Tensor, y: torch.Tensor, gamma: float = 2.0, alpha: float | None = None) -> torch.Tensor:
    """Focal loss (Lin et al. 2017): -[a1 y (1-p)^g log p + a0 (1-y) p^g log(1-p)], a1 = alpha, a0 = 1 - alpha
    (both 1 when alpha is None). gamma = 0, alpha = None is BCE."""
    p = torch.sigmoid(z)
    a1, a0 = (1.0, 1.0) if alpha is None else (alpha, 1.0 - alpha)
    return a1 * y * (1 - p).pow(gamma) * F.softplus(-z) + a0 * (1 - y) * p.pow(gamma) * F.softplus(z)


def gce(z: torch.Tensor, y: torch.Tensor, q: float = 0.7) -> torch.Tensor:
    """Generalized cross entropy (Zhang & Sabuncu 2018): y (1 - p^q) / q + (1 - y) (1 - (1-p)^q) / q.
    q -> 0 is cross entropy, q = 1 is mean absolute error (robust to label noise)."""
    p_pos = torch.exp(q * F.logsigmoid(z))
    p_neg = torch.exp(q * F.logsigmoid(-z))
    return (y * (1 - p_pos) + (1 - y) * (1 - p_neg)) / q


def sce(z: torch.Tensor, y: torch.Tensor, alpha: float = 0.1, beta: float = 1.0) -> torch.Tensor:
    """Symmetric cross entropy (Wang et al. 2019): alpha * CE(y, p) + beta * RCE, where the reverse CE
    -[p log y + (1-p) log(1-y)] uses log(max(., 1e-4))."""
    p = torch.sigmoid(z)
    log_y = torch.log(y.clamp(RCE_LOG_FLOOR, 1.0))
    log_not_y = torch.log((1 - y).clamp(RCE_LOG_FLOOR, 1.0))
    return alpha * bce(z, y) - beta * (p * log_y + (1 - p) * log_not_y)


def make_loss(terms: dict[str, float], *, focal_gamma: float = 2.0, focal_alpha: float | None = None,
              gce_q: float = 0.7, sce_alpha: float = 0.1, sce_beta: float = 1.0
              ) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """Per-sample loss sum_k w_k * loss_k(z, y) for terms {name: w_k}, names bce, focal, gce, sce."""
    table = {
        "bce": bce,
        "focal": lambda z, y: focal(z, y, focal_gamma, focal_alpha),
        "gce": lambda z, y: gce(z, y, gce_q),
        "sce": lambda z, y: sce(z, y, sce_alpha, sce_beta),
    }
    unknown = sorted(set(terms) - set(table))
    if unknown:
        raise ValueError(f"unknown loss terms {unknown}; known: {sorted(table)}")
    chosen = [(table[name], float(weight)) for name, weight in terms.items() if weight]

    def loss(z: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return sum(weight * fn(z, y) for fn, weight in chosen)

    return loss


def reduce_loss(per_sample: torch.Tensor, weight: torch.Tensor | None = None, drop_largest: float = 0.0) -> torch.Tensor:
    """Weighted mean of per-sample losses (n,), after dropping the `drop_largest` share of the largest
    ones (small-loss curriculum: samples with large loss are likely mislabelled)."""
    if weight is None:
        weight = torch.ones_like(per_sample)
    if drop_largest > 0 and len(per_sample) > 1:
        keep = len(per_sample) - int(drop_largest * len(per_sample))
        idx = torch.argsort(per_sample.detach())[:max(keep, 1)]
        per_sample, weight = per_sample[idx], weight[idx]
    return (per_sample * weight).sum() / weight.sum().clamp(min=1e-12)


def nt_xent(z1: torch.Tensor, z2: torch.Tensor, temperature: float = 0.2) -> torch.Tensor:
    """NT-Xent (SimCLR): views z1[i], z2[i] (n, d) are positives, the other 2n - 2 embeddings negatives;
    cosine similarity / temperature, cross entropy averaged over all 2n anchors."""
    n = len(z1)
    z = F.normalize(torch.cat([z1, z2]).float(), dim=-1)
    similarity = z @ z.T / temperature
    similarity = similarity.masked_fill(torch.eye(2 * n, dtype=torch.bool, device=z.device), float("-inf"))
    target = torch.cat([torch.arange(n, 2 * n), torch.arange(0, n)]).to(z.device)
    return F.cross_entropy(similarity, target)
