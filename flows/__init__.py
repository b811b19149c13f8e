"""Prefect flows, one per pipeline stage, and the code that logs them to MLflow."""

from flows import _environment  # noqa: F401  (must run before prefect/mlflow are imported)
