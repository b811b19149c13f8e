"""Prefect flows, one per pipeline stage (flows/stages/, generic over the model families of flows/family.py), and the
code that logs them to MLflow."""

from flows import _environment  # noqa: F401  (must run before prefect/mlflow are imported)
