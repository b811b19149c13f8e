"""Device choice: CUDA (with bf16 autocast) when present, CPU otherwise."""

from __future__ import annotations

import contextlib

import torch


def pick_device() -> torch.device:
    """The first CUDA device if there is one, else the CPU."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def autocast(device: torch.device):
    """bf16 autocast on CUDA; a no-op context on CPU."""
    if device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()

