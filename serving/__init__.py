"""The champion models over HTTP: FastAPI in front of ONNX Runtime, models loaded from the MLflow registry."""
