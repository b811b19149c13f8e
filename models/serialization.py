"""The pipeline's .pt files (pretrained encoders, fine-tuned ensembles, training checkpoints) hold only tensors
and plain data, and are loaded with `torch.load(weights_only=True)`: a file that holds anything else (a crafted
pickle that would run code on loading) is refused with one line, and nothing in it is executed."""

from __future__ import annotations

import os
import pickle
import re
from collections import OrderedDict
from pathlib import Path

import torch

from data.errors import DataValidationError

_SCALARS = (str, int, float, bool, type(None))


class UnsafeFileError(DataValidationError):
    """A .pt file holds Python objects besides tensors and plain data; loading them could run code."""


def save_state(state: dict, path: str | Path) -> None:
    """Write `state` to `path` atomically (a temporary file, then a rename).

    `state` may nest dicts, lists and tuples of tensors, str, int, float, bool and None, nothing else
    (convert numpy arrays and scalars, configs and other objects to those first): TypeError otherwise.
    """
    _check_plain(state, "state")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)


def load_state(path: str | Path, remedy: str) -> dict:
    """The state save_state wrote, tensors on the CPU. A file holding anything else raises UnsafeFileError,
    `path: refused to load: ... (the first object found); <remedy>`, e.g. remedy "re-create it with `dvc repro
    sensor_finetune`", without running any of it."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as error:
        found = re.search(r"GLOBAL (\S+)", str(error))
        what = f" ({found.group(1)})" if found else ""
        raise UnsafeFileError(f"refused to load: it holds Python objects that could run code{what}, not only "
                              f"tensors and plain data; {remedy}", file=path) from None


def _check_plain(value, where: str) -> None:
    if isinstance(value, torch.Tensor) or type(value) in _SCALARS:
        return
    if type(value) in (dict, OrderedDict):
        for key, item in value.items():
            _check_plain(key, f"{where} key {key!r}")
            _check_plain(item, f"{where}[{key!r}]")
    elif type(value) in (list, tuple):
        for index, item in enumerate(value):
            _check_plain(item, f"{where}[{index}]")
    else:
        raise TypeError(f"{where} is a {type(value).__module__}.{type(value).__qualname__}: only tensors, dicts, "
                        f"lists, tuples, str, int, float, bool and None can be saved")
