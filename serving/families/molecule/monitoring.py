"""What the service watches of molecule inputs: the applicability domain (serving/families/molecule/domain.py) of
the recent molecules each served version answered."""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Sequence

import numpy as np

from serving.loading import LoadedModel
from serving.settings import ServingSettings


class MoleculeInputs:
    """The applicability domain (serving/families/molecule/domain.py) of the last `size` molecules answered, with the version that
    answered each."""

    def __init__(self, size: int):
        self._lock = threading.Lock()
        self._items: deque[tuple[tuple[str, str], float, bool, float]] = deque(maxlen=size)

    def add(self, answers: Sequence[dict], model: LoadedModel) -> None:
        """Keep the domain of each answer that has one (on the request path: appends only)."""
        key = (model.name, model.version)
        with self._lock:
            self._items.extend((key, a["nearest_similarity"], a["in_domain"], a["descriptors_out_of_range"])
                               for a in answers if "nearest_similarity" in a)

    def of(self, model: LoadedModel) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Similarity, in-domain flag and descriptor share outside the range (m,) of the recent molecules `model`
        answered."""
        key = (model.name, model.version)
        with self._lock:
            items = np.array([item[1:] for item in self._items if item[0] == key], dtype=np.float64).reshape(-1, 3)
        return items[:, 0], items[:, 1].astype(bool), items[:, 2]


def domain_report(inputs: MoleculeInputs, model: LoadedModel, settings: ServingSettings) -> dict:
    """MoleculeDomain's fields over the recent molecules `model` answered."""
    similarity, inside, outside = inputs.of(model)
    n = len(similarity)
    out_of_domain = float(1 - inside.mean()) if n else None
    return {"molecules": n, "out_of_domain": out_of_domain,
            "nearest_similarity_mean": float(similarity.mean()) if n else None,
            "out_of_range_any": float((outside > 0).mean()) if n else None,
            "min_similarity": settings.monitor_min_similarity, "max_out_of_domain": settings.monitor_max_out_of_domain,
            "alarm": n >= settings.monitor_min_items and out_of_domain > settings.monitor_max_out_of_domain}
