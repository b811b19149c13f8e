"""ONNX Runtime sessions: CUDA when it really loads, CPU otherwise (torch-free, used by serving)."""

from __future__ import annotations

import contextlib
import functools
import io
import os
from pathlib import Path

import numpy as np
import onnxruntime as ort

# onnxruntime-gpu lists CUDA among the available providers even where the CUDA libraries cannot
# load, and its failed attempt logs an error. We try CUDA with that log quieted and read the
# providers of the live session instead of trusting get_available_providers().
_ERRORS, _FATAL_ONLY = 3, 4


def _threads_from_environment() -> int:
    """OMP_NUM_THREADS (its first level), which torch's intra-op threads follow too; 0 where it is unset or no count:
    ONNX Runtime's default, one thread per physical core."""
    first = os.environ.get("OMP_NUM_THREADS", "").split(",")[0].strip()
    return int(first) if first.isdigit() else 0


_intra_op_threads = _threads_from_environment()
_intra_op_spinning = True  # ONNX Runtime's default: idle intra-op threads spin a while before they sleep


def set_intra_op_threads(threads: int, spinning: bool = True) -> None:
    """Threads each session created from now on uses within one operator (0: ONNX Runtime's default; before any
    call, OMP_NUM_THREADS where it is set), and whether they spin, waiting for the next operator, instead of sleeping
    (the CPU time they burn so is lost to whatever else runs on those cores)."""
    global _intra_op_threads, _intra_op_spinning
    _intra_op_threads, _intra_op_spinning = threads, spinning


@functools.cache
def _preload_cuda_libraries() -> None:
    """Load CUDA and cuDNN from the nvidia-* wheels (`pip install '.[gpu]'`), which are not on the library path.
    Where they are missing ONNX Runtime prints each failure; kept quiet: the session then runs on the CPU."""
    with contextlib.redirect_stdout(io.StringIO()):
        ort.preload_dlls()


def load_session(path: str | Path, prefer_cuda: bool = True, threads: int | None = None
                 ) -> tuple[ort.InferenceSession, str]:
    """An inference session for `path` and the provider it actually runs on; `threads`: its intra-op threads (None:
    as set by `set_intra_op_threads`)."""
    options = ort.SessionOptions()
    options.log_severity_level = _ERRORS
    options.intra_op_num_threads = _intra_op_threads if threads is None else threads
    options.add_session_config_entry("session.intra_op.allow_spinning", "1" if _intra_op_spinning else "0")
    providers = ["CPUExecutionProvider"]
    if prefer_cuda and "CUDAExecutionProvider" in ort.get_available_providers():
        _preload_cuda_libraries()
        providers.insert(0, "CUDAExecutionProvider")
    ort.set_default_logger_severity(_FATAL_ONLY)
    try:
        session = ort.InferenceSession(str(path), sess_options=options, providers=providers)
    finally:
        ort.set_default_logger_severity(_ERRORS)
    return session, session.get_providers()[0]


def run(session: ort.InferenceSession, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Run `session` on named inputs; returns outputs by name."""
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, inputs)))
