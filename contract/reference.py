"""The training reference stored with a model version: `reference.npz` beside `model.onnx`, covered by the signed
manifest. Plain numpy arrays (no pickles), read by the `monitor` flow and, later, by the service.

Sensor: `channels` (C,), `psi_edges` (C, B - 1) inner quantile edges and `psi_proportions` (C, B) training shares
of the per-window channel means; `summary_sample` (n, C) a sample of per-window channel means (for KS).
Molecule: `descriptor_names` (D,), `descriptor_min`/`descriptor_max` (D,), `quantile_levels` (Q,) and
`descriptor_quantiles` (Q, D); `fingerprints` (n, bits / 8) uint8 packed Morgan bits of the training molecules,
`fingerprint_radius` and `fingerprint_bits` (scalars).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

REFERENCE = "reference.npz"


class ReferenceError(RuntimeError):
    """A reference file that cannot be read."""


def write_reference(path: Path, arrays: dict[str, np.ndarray]) -> Path:
    """Write `arrays` to `path` (an .npz; strings as numpy unicode arrays, never objects)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as handle:
        np.savez(handle, **{name: np.asarray(value) for name, value in arrays.items()})
    return path


def read_reference(directory: Path) -> dict[str, np.ndarray] | None:
    """The reference arrays of a version folder; None for a version registered before references existed."""
    path = Path(directory) / REFERENCE
    if not path.is_file():
        return None
    try:
        with np.load(path, allow_pickle=False) as npz:
            return {name: npz[name] for name in npz.files}
    except (ValueError, OSError) as error:
        raise ReferenceError(f"its {REFERENCE} cannot be read ({error})") from None
