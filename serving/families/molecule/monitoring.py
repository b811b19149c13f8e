"""What the service watches of molecule inputs: the applicability domain (serving/families/molecule/domain.py) of
the molecules the served version answered recently, as the prediction store holds them."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from serving.settings import ServingSettings


def domain_report(rows: Sequence[dict], settings: ServingSettings) -> dict:
    """MoleculeDomain's fields over the served version's recent predictions in the store (their input summaries)."""
    domains = [row["input_summary"] for row in rows if "nearest_similarity" in (row["input_summary"] or {})]
    similarity = np.array([d["nearest_similarity"] for d in domains], dtype=np.float64)
    inside = np.array([bool(d["in_domain"]) for d in domains], dtype=bool)
    outside = np.array([d["descriptors_out_of_range"] for d in domains], dtype=np.float64)
    n = len(similarity)
    out_of_domain = float(1 - inside.mean()) if n else None
    return {"molecules": n, "out_of_domain": out_of_domain,
            "nearest_similarity_mean": float(similarity.mean()) if n else None,
            "out_of_range_any": float((outside > 0).mean()) if n else None,
            "min_similarity": settings.monitor_min_similarity, "max_out_of_domain": settings.monitor_max_out_of_domain,
            "alarm": n >= settings.monitor_min_items and out_of_domain > settings.monitor_max_out_of_domain}
