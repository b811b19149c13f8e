"""Stage `<family>_baseline`: the family's baselines on the same splits (baseline.json: the one the promotion gate
compares with at the top level, every baseline under `baselines` where there are several)."""

from __future__ import annotations

import mlflow
from prefect import flow

from flows.family import pipeline_family
from flows.json_io import write_json
from flows.params import load_params
from flows.tasks import stage_cli
from flows.tracking import stage_run


@flow(name="baseline", flow_run_name="{family}-baseline")
def baseline(family: str, params_file: str = "params.yaml") -> dict:
    """Fit the baselines on the training split; metrics on test."""
    params = load_params(params_file)
    parts = pipeline_family(family)
    cfg = parts.settings(params)
    content = parts.baselines(cfg)
    write_json(parts.paths.baseline, content)
    results = content.get("baselines", [content])
    with stage_run(params.tracking, family, "baseline", {"baseline": content["name"], **cfg.baseline.model_dump()},
                   {family: parts.paths.prepared}):
        for result in results:
            prefix = "test_" if result["name"] == content["name"] else f"{result['name']}_test_"
            mlflow.log_metrics({f"{prefix}{k}": v for k, v in result["test"].items()})
    for result in results:
        print(f"{family} baseline ({result['name']}) test metrics: "
              f"{ {k: round(v, 4) for k, v in result['test'].items()} }")
    return content["test"]


if __name__ == "__main__":
    stage_cli(baseline)
