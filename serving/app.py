"""The FastAPI app: health and readiness, model info, the two predict endpoints, feedback, depiction, reload,
monitoring, metrics, the page. Every error answer is `{"detail": str}` (serving.errors), documented per route."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import logging
import signal
import threading
from collections.abc import Callable
from pathlib import Path

import orjson
from fastapi import APIRouter, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import HTMLResponse, JSONResponse, Response
from fastapi_offline import FastAPIOffline
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import BaseModel, ValidationError

from contract.lifetime import die_with_parent
from contract.registry import CHALLENGER, CHAMPION, RegistrySettings
from models.onnx_runtime import set_intra_op_threads
from serving.admin import admin_router
from serving.auth import api_key_guard
from serving.batching import BatcherClosed, MixedAnswer
from serving.deadline import ClientGone, DeadlineExceeded, within_deadline
from serving.errors import BODY_ERRORS, NotReady, RetryLater, error_responses
from serving.family import ServedFamily, family_class
from serving.feedback import feedback_router
from serving.inputs import BadInput
from serving.limits import BodySizeLimit
from serving.loading import LoadedModel
from serving.metrics import RequestMetrics, ServiceMetrics
from serving.monitoring import Monitor, monitoring_router
from serving.open_inference import protocol_router
from serving.predict import Predictions
from serving.prediction_log import PredictionLog
from serving.rollout import Rollout
from serving.schemas import ModelsAnswer, Readiness
from serving.settings import ServingSettings
from serving.workers import CHECK_S, HEARTBEAT_S, WAIT_S, Workers
from serving.served_models import ServedModels

log = logging.getLogger("serving")
PAGE = Path(__file__).parent / "static" / "index.html"
PAGE_LAYOUT_SLOT = '<script id="model-layouts" type="application/json">null</script>'
MAX_ERRORS_SHOWN = 5
# Answered 503 with Retry-After: the work may succeed when sent again.
RETRYABLE = (NotReady, BatcherClosed, MixedAnswer, RetryLater)
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
    and every request waiting at that moment waited as long (docs/decisions/0014-serving-timeout-workers-gc.md)."""
    gc.collect()
    gc.freeze()


def build_store(settings: ServingSettings) -> ServedModels:
    """The registry, model names and trusted key named by the params file's `tracking` and `<family>.registry`
    sections (MLFLOW_TRACKING_URI and SERVING_VERIFY_KEY win); nothing else of the file is read."""
    registry = RegistrySettings.from_params(settings.params_file, settings.families)
    verify_key = Path(settings.verify_key) if settings.verify_key else registry.verify_key
    return ServedModels(registry.tracking_uri, registry.model_names, settings.alias, verify_key, settings.prefer_cuda,
                      challenger_alias=CHALLENGER if settings.rollout != "off" else None)


class Service:
    """The app's collaborators: the served models, each family's part, the prediction path, the log, the
    rollout and the monitoring; `start` and `stop` are the app's lifespan."""

    def __init__(self, settings: ServingSettings, store: ServedModels):
        self.settings, self.store, self.metrics = settings, store, ServiceMetrics()
        self.families = {name: family_class(name)(settings, self.metrics) for name in store.names}
        self.predictions = Predictions(store, settings, self.metrics, self.families)
        self.log = PredictionLog.from_settings(settings, self.metrics)  # each answer's id and its row in the store
        # each family's input figures and the outcome figures, computed in the background
        self.monitor = Monitor(store, settings, self.metrics, self.log, self.families)
        self.rollout = Rollout(settings, store, self.predictions, self.log, self.metrics)
        # the other worker processes (and replicas) on the prediction store's database: reloads reach them all (with
        # the log off there is no store: each worker follows the registry alone)
        self.workers = Workers(self.log.writer.engine) if self.log.writer is not None else None
        self._workers_failing = False  # the workers' table could not be used last time (logged once)
        self._tasks: list[asyncio.Task] = []

    def _served(self) -> set[int]:
        return {id(model) for model in (*self.store.models.values(), *self.store.challengers.values())}

    async def refresh(self) -> dict[str, str]:
        """Follow the registry's aliases now; {family: what changed}."""
        before = self._served()
        changes = await asyncio.to_thread(self.store.refresh)
        for family, model in self.store.models.items():
            self.metrics.model_version.labels(family, model.name).set(float(model.version))
        if self._served() - before:  # a version loaded now lives as long as the libraries
            freeze_long_lived()
        return changes

    async def _poll_once(self) -> None:
        try:
            await self.refresh()
        except Exception:  # the registry may be briefly unreachable; try again next round
            log.exception("registry poll failed")

    async def _poll(self) -> None:
        while True:
            await asyncio.sleep(self.settings.poll_seconds)
            await self._poll_once()

    async def reload(self) -> dict:
        """serving.schemas.ReloadAnswer's fields: this worker reloads at once, and every other live worker within
        serving.workers.CHECK_S; the answer comes once they have (at most serving.workers.WAIT_S)."""
        generation = await self._shared(self.workers.ask) if self.workers else None
        changes = await self.refresh()
        if generation is None:
            return {"changes": changes, **self.models(), "workers": 1, "lagging": []}
        self.workers.applied = max(self.workers.applied, generation)
        await self._shared(self.workers.report, self.versions())
        deadline = asyncio.get_running_loop().time() + WAIT_S
        while (lagging := await self._shared(self.workers.lagging, generation)) and \
                asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(CHECK_S)
        live = await self._shared(self.workers.live)
        return {"changes": changes, **self.models(), "workers": (live or 1) - len(lagging or []),
                "lagging": lagging or []}

    def versions(self) -> dict[str, str]:
        return {family: model.version for family, model in self.store.models.items()}

    async def _shared(self, call: Callable, *args):
        """`call(*args)` on the workers' table off the event loop; None when the database fails (logged once until
        it works again)."""
        try:
            answer = await asyncio.to_thread(call, *args)
        except Exception as error:
            if not self._workers_failing:
                log.warning("workers: the prediction store's database cannot be used to agree with the other "
                            "workers (%s); retrying", str(error).splitlines()[0][:300] if str(error) else
                            type(error).__name__)
            self._workers_failing = True
            return None
        if self._workers_failing:
            log.info("workers: the prediction store's database can be used again")
            self._workers_failing = False
        return answer

    async def _follow_reloads(self) -> None:
        """Reload when another worker was asked to; say every HEARTBEAT_S that this worker is alive."""
        heartbeat = 0.0
        while True:
            generation = await self._shared(self.workers.generation)
            if generation is not None and generation > self.workers.applied:
                await self._poll_once()
                self.workers.applied = generation
                heartbeat = 0.0
            now = asyncio.get_running_loop().time()
            if now >= heartbeat:
                await self._shared(self.workers.report, self.versions())
                heartbeat = now + HEARTBEAT_S
            await asyncio.sleep(CHECK_S)

    def models(self) -> dict:
        """serving.schemas.ModelsAnswer's fields."""
        return {"models": [m.describe() for m in self.store.models.values()], "problems": self.store.problems,
                "rollout": self.rollout.describe()}

    async def start(self) -> None:
        await self.predictions.start()
        self.log.start()
        # The first round is part of start-up: uvicorn accepts connections only after it, so with several workers
        # none answers before it has loaded the models (or knows why it cannot).
        await self._poll_once()
        freeze_long_lived()  # after everything start-up made (cheap when the round has just frozen what it loaded)
        self._tasks = [asyncio.create_task(self._poll()), asyncio.create_task(self.monitor.run())]
        if self.workers is not None and await self._shared(self.workers.start) is None:
            self.workers = None  # each worker follows the registry on its own
        if self.workers is not None:
            self._tasks.append(asyncio.create_task(self._follow_reloads()))

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await self.rollout.stop()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.predictions.stop()
        await asyncio.to_thread(self.log.stop, self.settings.shutdown_timeout_s)
        if self.workers is not None:
            await self._shared(self.workers.leave)
        self.metrics.leave()
        gc.unfreeze()  # what the service held may be collected again (an app in a longer-lived process)


def create_worker_app() -> FastAPI:
    """One of SERVING_WORKERS processes' app, from the environment; the worker ends when the service's main process
    does (killed outright too), so that none is left holding the port."""
    die_with_parent()
    return create_app()


def create_app(settings: ServingSettings | None = None, store: ServedModels | None = None) -> FastAPI:
    settings = settings or ServingSettings()
    set_intra_op_threads(settings.intra_op_threads, settings.intra_op_spinning)
    service = Service(settings, store or build_store(settings))

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI):
        restore_signals = _close_on_signals(service.predictions.close)
        await service.start()
        yield
        await service.stop()
        restore_signals()

    app = FastAPIOffline(title="failsafe-ml serving", version="1", lifespan=lifespan,
                         description="Champion models from the MLflow registry on ONNX Runtime. See docs/reference/api.md.")
    app.state.service = service
    app.add_middleware(BodySizeLimit, max_bytes=settings.max_body_bytes)
    app.add_middleware(RequestMetrics, metrics=service.metrics)
    if settings.cors_origins:  # outermost, so that refusals (413, 401) reach the allowed pages too
        app.add_middleware(CORSMiddleware, allow_origins=settings.cors_origins, allow_methods=["GET", "POST"],
                           allow_headers=["Authorization", "Content-Type"])
    _add_error_handlers(app)
    app.include_router(_service_router(service))
    app.include_router(_v1_router(service))
    app.include_router(protocol_router(settings, service.store, service.predictions, service.rollout))
    app.include_router(admin_router(settings.admin_key, service.reload))
    return app


def _add_error_handlers(app: FastAPI) -> None:
    """Every refusal as `{"detail": one line}` with its status (serving.errors)."""

    @app.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, error: RequestValidationError) -> JSONResponse:
        return _invalid_request(request, error)

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


def _invalid_request(request: Request, error: RequestValidationError) -> JSONResponse:
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


def _service_router(service: Service) -> APIRouter:
    """/health, /ready, /metrics and the page: open, without the API key."""
    router = APIRouter()
    store = service.store
    page_template = PAGE.read_text()

    @router.get("/health", tags=["service"])
    async def health() -> dict[str, str]:
        """The process is up (models may still be loading: see /ready)."""
        return {"status": "ok"}

    @router.get("/ready", tags=["service"], response_model=Readiness,
                responses={503: {"model": Readiness, "description": "a model or the store is missing: see `problems`"}})
    async def ready() -> JSONResponse:
        """200 once every family's model is loaded, 503 before (with what is missing)."""
        body = {"ready": store.ready, "models": {f: m.version for f, m in store.models.items()},
                "problems": store.problems, "prediction_log": service.log.state}
        return JSONResponse(body, status_code=200 if store.ready else 503)

    @router.get("/metrics", tags=["service"], response_class=Response,
                responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}}}})
    async def prometheus() -> Response:
        """Prometheus text format."""
        return Response(service.metrics.render(), media_type=CONTENT_TYPE_LATEST)

    @router.get("/", include_in_schema=False)
    async def page() -> HTMLResponse:
        """The page, with each served model's input layout embedded (its example window needs no API key)."""
        layouts = {family: model.details for family, model in store.models.items()}
        embedded = orjson.dumps(layouts).decode().replace("<", "\\u003c")  # no `</script>` inside the script
        return HTMLResponse(page_template.replace(PAGE_LAYOUT_SLOT, PAGE_LAYOUT_SLOT.replace("null", embedded)))

    return router


def _v1_router(service: Service) -> APIRouter:
    """/v1: the models, each family's predict route and own routes, feedback and monitoring, behind the API key."""
    settings = service.settings
    v1 = APIRouter(prefix="/v1", dependencies=api_key_guard(settings.api_key), responses=error_responses(401))

    @v1.get("/models", tags=["models"], response_model=ModelsAnswer)
    async def models() -> dict:
        """Each loaded model: name, version, alias, provider, sha256, test metrics (and its family's details);
        the rollout mode and its challengers."""
        return service.models()

    for family in service.families.values():
        _add_predict_route(v1, service, family)
        champion = functools.partial(service.predictions.model_of, family.name, CHAMPION)
        for router in family.routers(champion):
            v1.include_router(router)
    v1.include_router(feedback_router(service.log, settings.max_items))
    v1.include_router(monitoring_router(service.monitor))
    return v1


def _add_predict_route(v1: APIRouter, service: Service, family: ServedFamily) -> None:
    """POST /v1/<family>/predict: the family's body in, its answers out, through the rollout."""

    async def predict(request: Request) -> Response:
        body = _parse_json(await request.body(), request.headers.get("content-type", ""), family.request)
        items = family.items(body, service.predictions.model_of(family.name))
        rows, model = await within_deadline(request, service.rollout.serve(family, items),
                                            service.settings.request_timeout_s)
        return _answer(model, rows)

    body = {"requestBody": {"required": True, "content": {
        "application/json": {"schema": family.request.model_json_schema()}}}}
    v1.add_api_route(f"/{family.name}/predict", predict, methods=["POST"], tags=["predict"],
                     response_model=family.response, openapi_extra=body, description=family.__doc__,
                     name=f"predict_{family.name}", responses=error_responses(*BODY_ERRORS, 503, 504))
