"""Molecule-only figures (the shared ones are in flows/plots.py): ROC curves for classification."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from sklearn.metrics import roc_auc_score, roc_curve

from flows.plots import _save, plt


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
