"""The devices a test runs on: the CPU always, CUDA where a GPU is present (skipped otherwise, with the reason)."""

import pytest
import torch

DEVICES = [
    pytest.param(torch.device("cpu"), id="cpu"),
    pytest.param(torch.device("cuda"), id="cuda",
                 marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")),
]
