"""Figures people would rather look at than read: training curves, PR curves, reliability and parity plots."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from sklearn.metrics import precision_recall_curve, roc_auc_score, roc_curve  # noqa: E402


def _save(fig, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110, metadata={"Software": None})
    plt.close(fig)
    return path


def training_curves(histories: dict[str, list[dict[str, float]]], path: Path, score_name: str) -> Path:
    """Train loss and validation score per epoch, one line per run (e.g. per ensemble member)."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.5))
    for name, history in histories.items():
        epochs = [h["epoch"] for h in history]
        left.plot(epochs, [h["train_loss"] for h in history], marker=".", label=name)
        if history and "val_score" in history[0]:
            right.plot(epochs, [h["val_score"] for h in history], marker=".", label=name)
    left.set(xlabel="epoch", ylabel="training loss", title="training loss")
    right.set(xlabel="epoch", ylabel=score_name, title=f"validation {score_name}")
    left.legend(fontsize=7)
    return _save(fig, path)


def pr_curves(y: np.ndarray, scores: dict[str, np.ndarray], path: Path) -> Path:
    """Precision-recall curves of several scorers on the same labels."""
    fig, ax = plt.subplots(figsize=(4.5, 4))
    for name, p in scores.items():
        precision, recall, _ = precision_recall_curve(y, p)
        ax.plot(recall, precision, label=name)
    ax.axhline(np.mean(y), color="grey", linestyle=":", label="prevalence")
    ax.set(xlabel="recall", ylabel="precision", title="precision-recall (test)", xlim=(0, 1), ylim=(0, 1.02))
    ax.legend(fontsize=8)
    return _save(fig, path)


def reliability_diagram(y: np.ndarray, probabilities: dict[str, np.ndarray], path: Path, n_bins: int = 15) -> Path:
    """Observed frequency against mean predicted probability per equal-width bin (top), and how many
    items fall in each bin (bottom, log scale): with rare positives most bins hold a handful."""
    fig, (ax, counts) = plt.subplots(2, 1, figsize=(4.5, 5.2), sharex=True, height_ratios=[3, 1])
    ax.plot([0, 1], [0, 1], color="grey", linestyle=":")
    edges = np.linspace(0, 1, n_bins + 1)
    for name, p in probabilities.items():
        bins = np.minimum((p * n_bins).astype(int), n_bins - 1)
        used = [b for b in range(n_bins) if (bins == b).any()]
        ax.plot([p[bins == b].mean() for b in used], [y[bins == b].mean() for b in used], marker="o", label=name)
        counts.stairs(np.bincount(bins, minlength=n_bins), edges, label=name)
    ax.set(ylabel="observed frequency", title="reliability")
    counts.set(xlabel="predicted probability", ylabel="items", yscale="log", xticks=edges[::3])
    ax.legend(fontsize=8)
    return _save(fig, path)


def parity_plot(y: np.ndarray, predictions: dict[str, np.ndarray], path: Path) -> Path:
    """Predicted against measured values."""
    fig, ax = plt.subplots(figsize=(4.5, 4))
    low, high = float(np.min(y)), float(np.max(y))
    ax.plot([low, high], [low, high], color="grey", linestyle=":")
    for name, pred in predictions.items():
        ax.scatter(y, pred, s=8, alpha=0.6, label=name)
    ax.set(xlabel="measured", ylabel="predicted", title="parity (test)")
    ax.legend(fontsize=8)
    return _save(fig, path)


def roc_curves(y: np.ndarray, scores: dict[str, np.ndarray], path: Path) -> Path:
    """ROC curves of several scorers on the same 0/1 labels, AUC in the legend."""
    fig, ax = plt.subplots(figsize=(4.5, 4))
    ax.plot([0, 1], [0, 1], color="grey", linestyle=":")
    for name, p in scores.items():
        fpr, tpr, _ = roc_curve(y, p)
        ax.plot(fpr, tpr, label=f"{name} (AUC {roc_auc_score(y, p):.3f})")
    ax.set(xlabel="false positive rate", ylabel="true positive rate", title="ROC (test)", xlim=(0, 1), ylim=(0, 1.02))
    ax.legend(fontsize=8)
    return _save(fig, path)
