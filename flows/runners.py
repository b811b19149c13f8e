"""The task runner of a flow's parallel tasks (ensemble members, tuning trials), from `orchestration`.

threads: Prefect's thread pool in the flow's own process (PyTorch releases the GIL while it computes).
dask: prefect-dask's DaskTaskRunner, on the cluster at `dask_address`, or on a local cluster of
`dask_workers` processes started for the flow run and stopped after it. On a remote cluster the
workers need this project installed, the same PREFECT_API_URL, and the workspace on a shared path.
"""

from __future__ import annotations

from prefect.task_runners import TaskRunner, ThreadPoolTaskRunner

from flows.config import OrchestrationConfig


def task_runner(cfg: OrchestrationConfig) -> TaskRunner:
    """A fresh task runner for one flow run."""
    if cfg.task_runner == "threads":
        return ThreadPoolTaskRunner(max_workers=cfg.max_workers)
    from prefect_dask import DaskTaskRunner

    if cfg.dask_address:
        return DaskTaskRunner(address=cfg.dask_address)
    return DaskTaskRunner(cluster_kwargs={"n_workers": cfg.dask_workers, "threads_per_worker": 1, "processes": True,
                                          "dashboard_address": None})
