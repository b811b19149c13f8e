"""Shadow and canary end to end on the drift scenario (bench/drift_scenario.py): the scenario's logistic
sensor model is the champion, a broken version of it (negated weights: signed and shaped like any other, refused
by the gate) the challenger. The real app (FastAPI TestClient over create_app, ONNX Runtime, the real MLflow
registry) runs it in shadow, then in canary while the drifted fleet is replayed through the HTTP API and its
outcomes sent to /v1/feedback; the `monitor` flow (real Prefect) judges: it rolls the challenger back, the alias
audit log and the registry record the move, the report states the share the challenger answered, and the service
stops running the challenger at its next refresh. A challenger whose files no longer match its signed manifest is
then refused and reported, and the champion keeps answering."""

from __future__ import annotations

import json
import time
from pathlib import Path
from urllib.parse import urlparse

import pytest
from mlflow import MlflowClient
from prefect.settings import PREFECT_API_URL, temporary_settings

from contract.audit import read_moves
from contract.prediction_store import connect, read_predictions
from contract.registry import CHALLENGER, CHAMPION, alias_version, audit_trail, move_alias
from flows.monitor import monitor
from bench.drift_scenario import Scenario, fleet_stream, register_model, train_reference_model, write_params
from flows.params import load_params
from flows.tracking import use_tracking
from tests.integration.replay import predict, send_outcomes, service, wait_for_challenger

pytestmark = pytest.mark.integration

REQUESTS, PER_REQUEST, SHARE = 120, 5, 0.4
SHADOW_REQUESTS = 8


@pytest.fixture(scope="module")
def rollout(tmp_path_factory, prefect_api):
    root = tmp_path_factory.mktemp("rollout")
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(root)  # the flow's workspace
        params_file = write_params(root, {"recalibrate": False, "judge": {
            "min_outcomes": 100, "min_requests": 30, "max_p99_ms": 10_000, "max_calibration_loss": 0.02}})
        params = load_params(params_file)
        use_tracking(params.tracking)
        scenario = Scenario()
        champion = register_model(params, train_reference_model(scenario, root / "champion"))
        broken = register_model(params, train_reference_model(scenario, root / "broken", broken=True))
        stream = fleet_stream(scenario, seed=101, drifted=True)

        shadow_store = f"sqlite:///{root / 'shadow.db'}"
        with service(params_file, shadow_store, "shadow", SHARE) as client:
            shadow_models = wait_for_challenger(client)
            shadow_answers = [predict(client, stream, i * PER_REQUEST, PER_REQUEST) for i in range(SHADOW_REQUESTS)]
            deadline = time.monotonic() + 60
            while len(shadow_rows := read_predictions(connect(shadow_store))) < 2 * SHADOW_REQUESTS * PER_REQUEST:
                assert time.monotonic() < deadline, len(shadow_rows)
                client.app.state.service.log.writer.flush(timeout_s=5)
                time.sleep(0.05)

        with service(params_file, params.monitor.store_url, "canary", SHARE) as client:
            canary_models = wait_for_challenger(client)
            answers = [predict(client, stream, i * PER_REQUEST, PER_REQUEST) for i in range(REQUESTS)]
            labels = stream.windows.y[:REQUESTS * PER_REQUEST]
            ids = [p["prediction_id"] for answer in answers for p in answer["predictions"]]
            send_outcomes(client, [{"prediction_id": key, "observed": float(label)} for key, label in zip(ids, labels)])
            metrics = client.get("/metrics").text
            # the conftest's server: Prefect read its settings when this module imported it, before the variable
            with temporary_settings(updates={PREFECT_API_URL: prefect_api}):
                report = monitor(params_file=str(params_file))
            changes = client.app.state.service.store.refresh()  # what the next registry poll does
            after = client.get("/v1/models").json()
            after_answers = [predict(client, stream, i * PER_REQUEST, PER_REQUEST) for i in range(10)]
            registry, name, challenger = MlflowClient(), params.sensor.registry.model_name, str(broken["registered_version"])
            aliases = {alias: alias_version(registry, name, alias) for alias in (CHAMPION, CHALLENGER)}
            moves, trail = read_moves(root / "mlflow" / "alias_moves.jsonl"), audit_trail(registry, name)

            # the broken version's card edited after signing, and made challenger again by hand
            folder = Path(urlparse(registry.get_model_version_download_uri(name, challenger)).path)
            card = json.loads((folder / "card.json").read_text())
            (folder / "card.json").write_text(json.dumps({**card, "threshold": 0.01}))
            move_alias(registry, name, CHALLENGER, challenger, "test_rollout", "a tampered challenger")
            tampered = client.app.state.service.store.refresh()
            tampered_ready = client.get("/ready")
            tampered_answers = [predict(client, stream, i * PER_REQUEST, PER_REQUEST) for i in range(5)]
        yield {"params": params, "client": MlflowClient(), "root": root, "champion": str(champion["registered_version"]),
               "broken": broken, "shadow_models": shadow_models, "shadow_answers": shadow_answers,
               "shadow_rows": shadow_rows, "canary_models": canary_models, "answers": answers, "metrics": metrics,
               "report": report, "changes": changes, "after": after, "after_answers": after_answers, "moves": moves, "trail": trail, "aliases": aliases,
               "tampered": tampered, "tampered_ready": tampered_ready, "tampered_answers": tampered_answers}


def test_the_broken_challenger_is_signed_refused_by_the_gate_and_run_by_the_service(rollout):
    broken = rollout["broken"]
    assert not broken["promoted"] and any("worse than" in r for r in broken["reasons"])
    challenger = str(broken["registered_version"])
    for models in (rollout["shadow_models"], rollout["canary_models"]):
        assert [m["version"] for m in models["models"]] == [rollout["champion"]]
        assert [(m["version"], m["alias"]) for m in models["rollout"]["challengers"]] == [(challenger, CHALLENGER)]
    assert rollout["shadow_models"]["rollout"]["mode"] == "shadow"
    assert rollout["canary_models"]["rollout"] == {**rollout["canary_models"]["rollout"], "mode": "canary",
                                                   "canary_share": SHARE}


def test_in_shadow_the_champion_answers_and_both_are_logged_under_one_request_id(rollout):
    assert {a["model"]["version"] for a in rollout["shadow_answers"]} == {rollout["champion"]}
    rows = rollout["shadow_rows"]
    by_role = {role: [r for r in rows if r["role"] == role] for role in ("champion", "shadow")}
    assert len(by_role["champion"]) == len(by_role["shadow"]) == SHADOW_REQUESTS * PER_REQUEST
    answered_ids = {p["prediction_id"] for a in rollout["shadow_answers"] for p in a["predictions"]}
    assert {r["id"] for r in by_role["champion"]} == answered_ids  # the shadow's ids are never handed out
    pairs = {(r["request_id"], r["input_digest"]) for r in by_role["champion"]}
    assert {(r["request_id"], r["input_digest"]) for r in by_role["shadow"]} == pairs
    assert all(r["model_version"] == str(rollout["broken"]["registered_version"]) for r in by_role["shadow"])
    assert all(r["latency_ms"] > 0 and r["failed"] is False for r in rows)


def test_in_canary_the_response_names_the_model_that_answered(rollout):
    versions = [a["model"]["version"] for a in rollout["answers"]]
    challenger = str(rollout["broken"]["registered_version"])
    answered = versions.count(challenger)
    assert 0.2 < answered / REQUESTS < 0.6 and versions.count(rollout["champion"]) == REQUESTS - answered
    assert all(a["model"]["alias"] == (CHALLENGER if a["model"]["version"] == challenger else CHAMPION)
               for a in rollout["answers"])
    assert f'serving_model_requests_total{{family="sensor",role="challenger"}} {float(answered)}' in rollout["metrics"]


def test_the_judge_rolls_back_and_reports_the_share_the_challenger_answered(rollout):
    judged = rollout["report"]["sensor"]["rollout"]
    challenger = str(rollout["broken"]["registered_version"])
    versions = [a["model"]["version"] for a in rollout["answers"]]
    answered, first = versions.count(challenger), versions.index(challenger)
    assert judged["decision"] == "rollback" and judged["challenger_version"] == challenger
    assert any(r.startswith("calibration degrades") for r in judged["reasons"])
    assert judged["challenger"]["requests"] == answered and judged["challenger"]["error_rate"] == 0
    # the judged period starts at the challenger's first prediction
    assert judged["answered_share"] == pytest.approx(answered / (REQUESTS - first))
    assert judged["champion"]["requests"] == REQUESTS - first - answered
    assert judged["challenger"]["outcomes"]["n"] == answered * PER_REQUEST
    assert rollout["aliases"] == {CHAMPION: rollout["champion"], CHALLENGER: rollout["champion"]}


def test_the_move_is_in_the_audit_log_and_the_registry_and_the_report_in_mlflow(rollout):
    client, name = rollout["client"], rollout["params"].sensor.registry.model_name
    moves = rollout["moves"]
    challenger = str(rollout["broken"]["registered_version"])
    # the gate set champion (v1) and challenger (v1, then v2); the judge moved challenger back
    assert [(m["alias"], m["from"], m["to"]) for m in moves] == [
        (CHALLENGER, None, "1"), (CHAMPION, None, "1"), (CHALLENGER, "1", challenger), (CHALLENGER, challenger, "1")]
    last = moves[-1]
    assert last["by"].startswith("flows.monitor (rollout judge)") and last["model"] == name
    assert last["why"].startswith(f"rollback of version {challenger}: calibration degrades")
    assert rollout["trail"][-1]["sha256"] == last["sha256"]
    runs = client.search_runs([client.get_experiment_by_name("sensor").experiment_id], "tags.stage = 'monitor'")
    assert len(runs) == 1 and runs[0].data.tags["monitor.rollout"] == "rollback"
    logged = json.loads(open(client.download_artifacts(runs[0].info.run_id, "monitor_report.json")).read())
    assert logged["rollout"]["decision"] == "rollback"
    assert runs[0].data.metrics["rollout_answered_share"] == pytest.approx(logged["rollout"]["answered_share"])


def test_after_the_rollback_the_service_runs_no_challenger(rollout):
    assert rollout["changes"]["sensor.challenger"] == f"no challenger (was version {rollout['broken']['registered_version']})"
    assert rollout["after"]["rollout"]["challengers"] == []
    assert {a["model"]["version"] for a in rollout["after_answers"]} == {rollout["champion"]}


def test_a_tampered_challenger_is_refused_and_reported_and_the_champion_keeps_answering(rollout):
    problem = rollout["tampered"]["sensor.challenger"]
    assert problem.startswith("refused to run the challenger") and "card.json" in problem
    assert rollout["tampered_ready"].status_code == 200
    assert rollout["tampered_ready"].json()["problems"]["sensor.challenger"] == problem
    assert {a["model"]["version"] for a in rollout["tampered_answers"]} == {rollout["champion"]}
