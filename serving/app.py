"""The FastAPI app: health and readiness, model info, the two predict endpoints, feedback, depiction, reload,
monitoring, metrics, the page. Every error answer is `{"detail": str}` (serving.errors), documented per route."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import signal
import threading
from collections.abc import Callable
from pathlib import Path

import orjson
from fastapi import APIRouter, FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import HTMLResponse, JSONResponse, Response
from fastapi_offline import FastAPIOffline
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import BaseModel, ValidationError

from contract.prediction_store import engine_for, resolve_url
from contract.registry import CHALLENGER, RegistrySettings
from models.onnx_runtime import set_intra_op_threads
from serving.admin import admin_router
from serving.auth import api_key_guard
from serving.batching import BatcherClosed, MixedAnswer
from serving.deadline import ClientGone, DeadlineExceeded, within_deadline
from serving.depict import Depicter, DepictionBroken
from serving.errors import BODY_ERRORS, error_responses
from serving.featurizing import FeaturizerBroken
from serving.feedback import feedback_router
from serving.inputs import BadInput, check_count, check_smiles, sensor_windows
from serving.limits import BodySizeLimit
from serving.loading import LoadedModel
from serving.metrics import RequestMetrics, ServiceMetrics
from serving.monitoring import Monitor, monitoring_router
from serving.open_inference import protocol_router
from serving.predict import NotReady, Predictions
from serving.prediction_log import PredictionLog
from serving.rollout import Rollout
from serving.schemas import (
    ModelsAnswer, MoleculeRequest, MoleculeResponse, Readiness, SensorRequest, SensorResponse,
)
from serving.settings import ServingSettings
from serving.store import ModelStore
from serving.units import UnitReferences, units_router

log = logging.getLogger("serving")
PAGE = Path(__file__).parent / "static" / "index.html"
PAGE_LAYOUT_SLOT = '<script id="sensor-layout" type="application/json">null</script>'
MAX_ERRORS_SHOWN = 5
# Answered 503 with Retry-After: the work may succeed when sent again.
RETRYABLE = (NotReady, BatcherClosed, FeaturizerBroken, MixedAnswer, DepictionBroken)
CLIENT_CLOSED = 499  # nginx's status for a request whose client went away; only the metrics see it


def _answer(model: LoadedModel, predictions: list[dict]) -> Response:
    body = {"model": {"name": model.name, "version": model.version, "alias": model.alias}, "predictions": predictions}
    return Response(orjson.dumps(body), media_type="application/json")


def _parse_json(body: bytes, content_type: str, schema: type[BaseModel]) -> BaseModel:
    """`body` validated by `schema` straight from JSON; problems raised as FastAPI's own validation errors."""
    if not content_type.startswith("application/json") or not body:
        raise RequestValidationError([{"type": "missing", "loc": ("body",), "msg": "Field required", "input": None}])
    try:
        return schema.model_validate_json(body)
    except ValidationError as error:
        raise RequestValidationError([{**e, "loc": ("body", *e["loc"])} for e in error.errors()]) from None


def _close_on_signals(close: Callable[[], None]) -> Callable[[], None]:
    """On SIGINT/SIGTERM uvicorn stops accepting and waits for the requests in flight; `close` (run at the same
    moment) answers the queued ones 503 at once. Returns the function that restores uvicorn's handlers."""
    if threading.current_thread() is not threading.main_thread():  # signals reach the main thread only
        return lambda: None
    loop = asyncio.get_running_loop()
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}

    def handle(sig: int, frame) -> None:
        loop.call_soon_threadsafe(close)
        if callable(previous[sig]):
            previous[sig](sig, frame)

    for sig in previous:
        signal.signal(sig, handle)
    return lambda: [signal.signal(sig, handler) for sig, handler in previous.items()]


def freeze_long_lived() -> None:
    """Move every object alive now (the libraries, the loaded models) out of the garbage collector's sight. Under
    load the full collections otherwise walked them all, 140-260 ms each every two seconds with nothing to free,
    and every request waiting at that moment waited as long (docs/serving.md)."""
    gc.collect()
    gc.freeze()


def build_store(settings: ServingSettings) -> ModelStore:
    """The registry, model names and trusted key named by the params file's `tracking` and `<family>.registry`
    sections (MLFLOW_TRACKING_URI and SERVING_VERIFY_KEY win); nothing else of the file is read."""
    registry = RegistrySettings.from_params(settings.params_file)
    verify_key = Path(settings.verify_key) if settings.verify_key else registry.verify_key
    return ModelStore(registry.tracking_uri, registry.model_names, settings.alias, verify_key, settings.prefer_cuda,
                      challenger_alias=CHALLENGER if settings.rollout != "off" else None)


def create_app(settings: ServingSettings | None = None, store: ModelStore | None = None) -> FastAPI:
    settings = settings or ServingSettings()
    set_intra_op_threads(settings.intra_op_threads, settings.intra_op_spinning)
    store = store or build_store(settings)
    metrics = ServiceMetrics()
    units = UnitReferences(engine_for(resolve_url(Path(settings.params_file).resolve().parent,
                                                  settings.prediction_store)),
                           settings.max_units, settings.units_refresh_s)  # the sensor units' references
    predictions = Predictions(store, settings, metrics, units)
    depicter = Depicter(settings.depict_workers, settings.max_heavy_atoms)
    prediction_log = PredictionLog.from_settings(settings, metrics)  # each answer's id and its row in the store
    rollout = Rollout(settings, store, predictions, prediction_log, metrics)  # champion, shadow or canary
    monitor = Monitor(store, settings, metrics, prediction_log)  # drift, domain and outcome figures, in the background

    def served() -> set[int]:
        return {id(model) for model in (*store.models.values(), *store.challengers.values())}

    async def refresh() -> dict[str, str]:
        before = served()
        changes = await asyncio.to_thread(store.refresh)
        for family, model in store.models.items():
            metrics.model_version.labels(family, model.name).set(float(model.version))
        if served() - before:  # a version loaded now lives as long as the libraries
            freeze_long_lived()
        return changes

    async def poll_once() -> None:
        try:
            await refresh()
        except Exception:  # the registry may be briefly unreachable; try again next round
            log.exception("registry poll failed")

    async def poll() -> None:
        while True:
            await asyncio.sleep(settings.poll_seconds)
            await poll_once()

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI):
        restore_signals = _close_on_signals(predictions.close)
        await predictions.start()
        prediction_log.start()
        # The first round is part of start-up: uvicorn accepts connections only after it, so with several workers
        # none answers before it has loaded the models (or knows why it cannot).
        await poll_once()
        freeze_long_lived()  # after everything start-up made (cheap when the round has just frozen what it loaded)
        poller = asyncio.create_task(poll())
        monitoring = asyncio.create_task(monitor.run())
        yield
        monitoring.cancel()
        poller.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await poller
        await rollout.stop()
        with contextlib.suppress(asyncio.CancelledError):
            await monitoring
        await predictions.stop()
        await depicter.stop()
        await asyncio.to_thread(prediction_log.stop, settings.shutdown_timeout_s)
        gc.unfreeze()  # what the service held may be collected again (an app in a longer-lived process)
        restore_signals()

    app = FastAPIOffline(title="failsafe-ml serving", version="1", lifespan=lifespan,
                         description="Champion models from the MLflow registry on ONNX Runtime. See docs/serving.md.")
    app.state.settings, app.state.store, app.state.metrics = settings, store, metrics
    app.state.predictions = predictions
    app.state.prediction_log = prediction_log
    app.state.rollout = rollout
    app.state.monitor = monitor
    app.add_middleware(BodySizeLimit, max_bytes=settings.max_body_bytes)
    app.add_middleware(RequestMetrics, metrics=metrics)
    if settings.cors_origins:  # outermost, so that refusals (413, 401) reach the allowed pages too
        app.add_middleware(CORSMiddleware, allow_origins=settings.cors_origins, allow_methods=["GET", "POST"],
                           allow_headers=["Authorization", "Content-Type"])

    @app.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, error: RequestValidationError) -> JSONResponse:
        errors = error.errors()
        content_type = request.headers.get("content-type", "")
        if request.method == "POST" and not content_type.startswith("application/json"):
            return JSONResponse({"detail": f"send the body as JSON with `Content-Type: application/json` "
                                           f"(got {content_type or 'no content type'})"}, status_code=415)
        if any(e["type"] == "json_invalid" for e in errors):
            return JSONResponse({"detail": f"the body is not valid JSON: {errors[0].get('ctx', {}).get('error', '')}"},
                                status_code=400)
        if any(e["type"] == "missing" and tuple(e["loc"]) == ("body",) for e in errors):
            return JSONResponse({"detail": "the request body is empty: send a JSON object (see /docs)"}, status_code=422)
        lines = [f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in errors[:MAX_ERRORS_SHOWN]]
        if len(errors) > MAX_ERRORS_SHOWN:
            lines.append(f"... and {len(errors) - MAX_ERRORS_SHOWN} more")
        return JSONResponse({"detail": "; ".join(lines)}, status_code=422)

    @app.exception_handler(BadInput)
    async def bad_input(_: Request, error: BadInput) -> JSONResponse:
        return JSONResponse({"detail": str(error)}, status_code=422)

    async def not_ready(_: Request, error: Exception) -> JSONResponse:
        return JSONResponse({"detail": str(error)}, status_code=503, headers={"Retry-After": "5"})

    for retryable in RETRYABLE:
        app.add_exception_handler(retryable, not_ready)

    @app.exception_handler(DeadlineExceeded)
    async def too_late(_: Request, error: DeadlineExceeded) -> JSONResponse:
        return JSONResponse({"detail": str(error)}, status_code=504)

    @app.exception_handler(ClientGone)
    async def client_gone(_: Request, error: ClientGone) -> JSONResponse:
        return JSONResponse({"detail": str(error)}, status_code=CLIENT_CLOSED)

    @app.get("/health", tags=["service"])
    async def health() -> dict[str, str]:
        """The process is up (models may still be loading: see /ready)."""
        return {"status": "ok"}

    @app.get("/ready", tags=["service"], response_model=Readiness,
             responses={503: {"model": Readiness, "description": "a model or the store is missing: see `problems`"}})
    async def ready() -> JSONResponse:
        """200 once both models are loaded, 503 before (with what is missing)."""
        body = {"ready": store.ready, "models": {f: m.version for f, m in store.models.items()},
                "problems": store.problems}
        return JSONResponse(body, status_code=200 if store.ready else 503)

    @app.get("/metrics", tags=["service"], response_class=Response,
             responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}}}})
    async def prometheus() -> Response:
        """Prometheus text format."""
        return Response(metrics.render(), media_type=CONTENT_TYPE_LATEST)

    page_template = PAGE.read_text()

    @app.get("/", include_in_schema=False)
    async def page() -> HTMLResponse:
        """The page, with the sensor model's channels and window length embedded (its example window needs no
        API key)."""
        sensor = store.get("sensor")
        layout = {"channels": sensor.card["channels"], "window": int(sensor.card["window"])} if sensor else None
        embedded = orjson.dumps(layout).decode().replace("<", "\\u003c")  # no `</script>` inside the script
        return HTMLResponse(page_template.replace(PAGE_LAYOUT_SLOT, PAGE_LAYOUT_SLOT.replace("null", embedded)))

    v1 = APIRouter(prefix="/v1", dependencies=api_key_guard(settings.api_key),
                   responses=error_responses(401))
    predict_errors = error_responses(*BODY_ERRORS, 503, 504)

    @v1.get("/models", tags=["models"], response_model=ModelsAnswer)
    async def models() -> dict:
        """Each loaded model: name, version, alias, provider, sha256, test metrics (and sensor input layout); the
        rollout mode and its challengers."""
        return {"models": [m.describe() for m in store.models.values()], "problems": store.problems,
                "rollout": rollout.describe()}

    sensor_body = {"requestBody": {"required": True, "content": {
        "application/json": {"schema": SensorRequest.model_json_schema()}}}}

    @v1.post("/sensor/predict", tags=["predict"], response_model=SensorResponse, openapi_extra=sensor_body,
             responses=predict_errors)
    async def predict_sensor(request: Request) -> Response:
        """Failure probability, alert flag and uncertainty per window (body: SensorRequest); with a model that has
        a novelty score also the novelty score against each window's unit reference, the combined alert
        probability and the part that raised the alert."""
        body = _parse_json(await request.body(), request.headers.get("content-type", ""), SensorRequest)
        check_count(len(body.windows), settings.max_items, "windows")
        windows = sensor_windows(body.windows, predictions.model_of("sensor").card)
        metrics.request_items.labels("sensor").observe(len(windows))
        rows, model = await within_deadline(request, rollout.windows(windows, body.units, body.times),
                                            settings.request_timeout_s)
        monitor.record_windows(windows, model)
        return _answer(model, rows)

    @v1.post("/molecule/predict", tags=["predict"], response_model=MoleculeResponse, responses=predict_errors)
    async def predict_molecule(body: MoleculeRequest, request: Request) -> Response:
        """`value` (regression) or `probability` (classification) and `uncertainty` per SMILES, or its `error`
        (one that does not parse, or has more than SERVING_MAX_HEAVY_ATOMS heavy atoms)."""
        check_count(len(body.smiles), settings.max_items, "SMILES")
        check_smiles(body.smiles, settings.max_smiles_length)
        predictions.model_of("molecule")
        metrics.request_items.labels("molecule").observe(len(body.smiles))
        rows, model = await within_deadline(request, rollout.smiles(body.smiles), settings.request_timeout_s)
        monitor.record_smiles(rows, model)
        return _answer(model, rows)

    @v1.get("/molecule/depict", tags=["predict"], response_class=Response,
            responses={200: {"content": {"image/svg+xml": {"schema": {"type": "string"}}}},
                       **error_responses(422, 503, 504)})
    async def depict(request: Request, smiles: str = Query(...)) -> Response:
        """The molecule drawn by RDKit, as SVG (422 for a SMILES that does not parse, or has more than
        SERVING_MAX_HEAVY_ATOMS heavy atoms). Drawn in a separate process, SERVING_DEPICT_WORKERS at a time."""
        check_smiles([smiles], settings.max_smiles_length)
        svg = await within_deadline(request, depicter.svg(smiles), settings.request_timeout_s)
        return Response(svg, media_type="image/svg+xml")

    async def reload() -> dict:
        changes = await refresh()
        return {"changes": changes, "models": [m.describe() for m in store.models.values()],
                "problems": store.problems, "rollout": rollout.describe()}

    v1.include_router(feedback_router(prediction_log, settings.max_items))
    v1.include_router(units_router(units, lambda: predictions.model_of("sensor"), settings.max_items))
    v1.include_router(monitoring_router(monitor))
    app.include_router(v1)
    app.include_router(protocol_router(settings, store, predictions, rollout, monitor, metrics))
    app.include_router(admin_router(settings.admin_key, reload))
    return app
