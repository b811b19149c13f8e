"""Torch modules, losses, the training loop and calibration. `metrics`, `calibration_numpy` and
`onnx_runtime` are torch-free so that serving can use them."""
