"""The FastAPI app: health and readiness, model info, the two predict endpoints, reload, metrics, the page."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from pathlib import Path

import numpy as np
from fastapi import APIRouter, Depends, FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse, Response
from fastapi_offline import FastAPIOffline
from prometheus_client import CONTENT_TYPE_LATEST

from contract.registry import RegistrySettings
from serving.auth import api_key_check
from serving.batching import MicroBatcher
from serving.depict import molecule_svg
from serving.inputs import BadInput, check_count, check_smiles, sensor_windows
from serving.limits import BodySizeLimit
from serving.loading import LoadedModel
from serving.metrics import RequestMetrics, ServiceMetrics
from serving.schemas import ModelRef, MoleculeRequest, MoleculeResponse, SensorRequest, SensorResponse
from serving.settings import ServingSettings
from serving.store import ModelStore

log = logging.getLogger("serving")
PAGE = Path(__file__).parent / "static" / "index.html"
MAX_ERRORS_SHOWN = 5


class NotReady(Exception):
    """No model of this family is loaded (yet), or it changed under a queued request."""


def _ref(model: LoadedModel) -> ModelRef:
    return ModelRef(name=model.name, version=model.version, alias=model.alias)


def _number(value: float) -> float | None:
    return float(value) if math.isfinite(value) else None


def build_store(settings: ServingSettings) -> ModelStore:
    """The registry, model names and trusted key named by the params file's `tracking` and `<family>.registry`
    sections (MLFLOW_TRACKING_URI and SERVING_VERIFY_KEY win); nothing else of the file is read."""
    registry = RegistrySettings.from_params(settings.params_file)
    verify_key = Path(settings.verify_key) if settings.verify_key else registry.verify_key
    return ModelStore(registry.tracking_uri, registry.model_names, settings.alias, verify_key, settings.prefer_cuda)


def create_app(settings: ServingSettings | None = None, store: ModelStore | None = None) -> FastAPI:
    settings = settings or ServingSettings()
    store = store or build_store(settings)
    metrics = ServiceMetrics()

    def model_of(family: str) -> LoadedModel:
        model = store.get(family)
        if model is None:
            raise NotReady(f"no {family} model is loaded yet: {store.problems.get(family, 'loading')}")
        return model

    def run_sensor(windows: list) -> tuple[list[dict], LoadedModel]:
        model = model_of("sensor")
        try:
            out = model.predictor.predict(np.stack(windows).transpose(0, 2, 1))
        except ValueError as error:  # the model was swapped for one with another input layout
            raise NotReady(f"the sensor model changed while the request waited; retry ({error})") from None
        return [{"failure_probability": float(p), "alert": bool(a), "uncertainty": float(u)}
                for p, a, u in zip(out["probability"], out["alert"], out["uncertainty"])], model

    def run_molecule(smiles: list[str]) -> tuple[list[dict], LoadedModel]:
        model = model_of("molecule")
        out = model.predictor.predict(smiles)
        key = "value" if model.predictor.task == "regression" else "probability"
        return [{"smiles": s, key: _number(p), "uncertainty": _number(u), "error": e}
                for s, p, u, e in zip(smiles, out["prediction"], out["uncertainty"], out["error"])], model

    batchers = {
        family: MicroBatcher(run, settings.batch_max_items, settings.batch_wait_ms / 1000,
                             on_batch=metrics.batch_items.labels(family).observe)
        for family, run in (("sensor", run_sensor), ("molecule", run_molecule))
    }

    async def refresh() -> dict[str, str]:
        changes = await asyncio.to_thread(store.refresh)
        for family, model in store.models.items():
            metrics.model_version.labels(family, model.name).set(float(model.version))
        return changes

    async def poll() -> None:
        while True:
            try:
                await refresh()
            except Exception:  # the registry may be briefly unreachable; try again next round
                log.exception("registry poll failed")
            await asyncio.sleep(settings.poll_seconds)

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI):
        for batcher in batchers.values():
            batcher.start()
        poller = asyncio.create_task(poll())
        yield
        poller.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await poller
        for batcher in batchers.values():
            await batcher.stop()

    app = FastAPIOffline(title="failsafe-ml serving", version="1", lifespan=lifespan,
                         description="Champion models from the MLflow registry on ONNX Runtime. See docs/serving.md.")
    app.state.settings, app.state.store, app.state.metrics = settings, store, metrics
    app.add_middleware(BodySizeLimit, max_bytes=settings.max_body_bytes)
    app.add_middleware(RequestMetrics, metrics=metrics)

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

    @app.exception_handler(NotReady)
    async def not_ready(_: Request, error: NotReady) -> JSONResponse:
        return JSONResponse({"detail": str(error)}, status_code=503, headers={"Retry-After": "5"})

    @app.get("/health", tags=["service"])
    async def health() -> dict:
        """The process is up (models may still be loading: see /ready)."""
        return {"status": "ok"}

    @app.get("/ready", tags=["service"])
    async def ready() -> JSONResponse:
        """200 once both models are loaded, 503 before (with what is missing)."""
        body = {"ready": store.ready, "models": {f: m.version for f, m in store.models.items()},
                "problems": store.problems}
        return JSONResponse(body, status_code=200 if store.ready else 503)

    @app.get("/metrics", tags=["service"])
    async def prometheus() -> Response:
        """Prometheus text format."""
        return Response(metrics.render(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/", include_in_schema=False)
    async def page() -> FileResponse:
        return FileResponse(PAGE, media_type="text/html")

    v1 = APIRouter(prefix="/v1", dependencies=[Depends(api_key_check(settings.api_key))])

    @v1.get("/models", tags=["models"])
    async def models() -> dict:
        """Each loaded model: name, version, alias, provider, sha256, test metrics (and sensor input layout)."""
        return {"models": [m.describe() for m in store.models.values()], "problems": store.problems}

    @v1.post("/sensor/predict", tags=["predict"], response_model=SensorResponse)
    async def predict_sensor(body: SensorRequest) -> SensorResponse:
        """Failure probability, alert flag and uncertainty per window."""
        check_count(len(body.windows), settings.max_items, "windows")
        windows = sensor_windows(body.windows, model_of("sensor").card)
        metrics.request_items.labels("sensor").observe(len(windows))
        results, model = await batchers["sensor"].submit(windows)
        return SensorResponse(model=_ref(model), predictions=results)

    @v1.post("/molecule/predict", tags=["predict"], response_model=MoleculeResponse, response_model_exclude_none=True)
    async def predict_molecule(body: MoleculeRequest) -> MoleculeResponse:
        """`value` (regression) or `probability` (classification) and `uncertainty` per SMILES, or its `error`."""
        check_count(len(body.smiles), settings.max_items, "SMILES")
        check_smiles(body.smiles, settings.max_smiles_length)
        model_of("molecule")
        metrics.request_items.labels("molecule").observe(len(body.smiles))
        results, model = await batchers["molecule"].submit(list(body.smiles))
        return MoleculeResponse(model=_ref(model), predictions=results)

    @v1.get("/molecule/depict", tags=["predict"], response_class=Response,
            responses={200: {"content": {"image/svg+xml": {}}}})
    async def depict(smiles: str = Query(...)) -> Response:
        """The molecule drawn by RDKit, as SVG."""
        check_smiles([smiles], settings.max_smiles_length)
        return Response(molecule_svg(smiles), media_type="image/svg+xml")

    @v1.post("/admin/reload", tags=["service"])
    async def reload() -> dict:
        """Check the registry alias now and load any new version (the service also polls it)."""
        changes = await refresh()
        return {"changes": changes, "models": [m.describe() for m in store.models.values()],
                "problems": store.problems}

    app.include_router(v1)
    return app
