"""The Open Inference Protocol (KServe v2, Triton's HTTP/REST) over the same models, limits, deadlines and API key
as /v1: health, server and model metadata, and inference on named tensors sent as JSON or as binary data (Triton's
binary tensor data extension). docs/reference/api.md lists the tensors and the choices made for missing readings and
failed molecules."""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Callable
from importlib.metadata import version as package_version
from typing import Any

import numpy as np
import orjson
from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import JSONResponse, Response
from fastapi.routing import APIRoute
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from serving.auth import api_key_guard
from serving.deadline import within_deadline
from serving.errors import MEANING, NotReady
from serving.family import ServedFamily
from serving.inputs import BadInput, check_count, is_unicode
from serving.loading import LoadedModel
from serving.predict import Predictions
from serving.rollout import Rollout
from serving.settings import ServingSettings
from serving.served_models import ServedModels

HEADER_LENGTH = "Inference-Header-Content-Length"
MAX_ERRORS_SHOWN = 3


class ProtocolError(Exception):
    """A request this protocol refuses: `status` and the one-line message sent as `{"error": message}`."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


class ProtocolErrorBody(BaseModel):
    """Every error answer under /v2, as the protocol has it."""

    error: str = Field(description="what is wrong, in one line")


def protocol_errors(*statuses: int) -> dict[int | str, dict]:
    """`responses=` of a /v2 route that can answer `statuses` with a ProtocolErrorBody."""
    return {status: {"model": ProtocolErrorBody, "description": MEANING[status]} for status in sorted(statuses)}


class _Parameters(BaseModel):
    model_config = ConfigDict(extra="allow")


class InputParameters(_Parameters):
    binary_data_size: int | None = Field(None, ge=0)


class OutputParameters(_Parameters):
    binary_data: bool | None = None


class RequestParameters(_Parameters):
    binary_data_output: bool = False


class RequestInput(BaseModel):
    name: str
    shape: list[int]
    datatype: str
    parameters: InputParameters = InputParameters()
    data: Any = None


class RequestOutput(BaseModel):
    name: str
    parameters: OutputParameters = OutputParameters()


class InferenceRequest(BaseModel):
    id: str | None = None
    parameters: RequestParameters = RequestParameters()
    inputs: list[RequestInput] = Field(min_length=1)
    outputs: list[RequestOutput] | None = None


def _error(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status, headers=headers)


class ProtocolRoute(APIRoute):
    """Answers every refusal in the protocol's `{"error": message}` form: a bad tensor 400; what the app answers
    itself (401 without the API key, 503 not ready, 504 past the deadline...) keeps the app's status and headers."""

    def get_route_handler(self) -> Callable:
        handle = super().get_route_handler()

        async def answer(request: Request) -> Response:
            try:
                return await handle(request)
            except ProtocolError as error:
                return _error(error.status, str(error))
            except BadInput as error:
                return _error(400, str(error))
            except Exception as error:
                app_handler = _app_handler(request.app, error)
                if app_handler is None:
                    raise
                response = await app_handler(request, error)
                headers = {k: v for k, v in response.headers.items() if k not in ("content-length", "content-type")}
                return _error(response.status_code, orjson.loads(response.body)["detail"], headers)

        return answer


def _app_handler(app: FastAPI, error: Exception) -> Callable | None:
    return next((app.exception_handlers[kind] for kind in type(error).__mro__ if kind in app.exception_handlers), None)


class ProtocolRoutes:
    """The /v2 handlers over the service's models, rollout and limits."""

    def __init__(self, settings: ServingSettings, store: ServedModels, predictions: Predictions, rollout: Rollout):
        self.settings, self.store, self.predictions, self.rollout = settings, store, predictions, rollout
        self.logged = rollout.log.enabled

    def served(self, name: str, version: str | None) -> tuple[ServedFamily, LoadedModel]:
        """The family and model named `name` (registry name or family), at `version` when one is named."""
        families = {**{registered: family for family, registered in self.store.names.items()},
                    **{family: family for family in self.store.names}}
        if name not in families:
            raise ProtocolError(404, f"unknown model {name!r}; this server has {', '.join(sorted(families))}")
        model = self.predictions.model_of(families[name])
        if version is not None and version != model.version:
            raise ProtocolError(404, f"model {name!r} version {version!r} is not served; version {model.version} is")
        return self.predictions.families[families[name]], model

    async def ready(self) -> dict:
        """200 once every model is loaded, else 503 saying what is missing."""
        if not self.store.ready:
            problems = {**{family: "loading" for family in self.store.names if family not in self.store.models},
                        **self.store.problems}
            raise ProtocolError(503, f"not ready: {'; '.join(f'{k}: {v}' for k, v in problems.items())}")
        return {"ready": True}

    async def model_metadata(self, request: Request, name: str, version: str | None) -> dict:
        """Name, served version, platform, and the input and output tensors (-1: any number of items)."""
        return _metadata(*self.served(name, version), self.logged)

    async def model_ready(self, request: Request, name: str, version: str | None) -> dict:
        """200 when the model is loaded (and is the version asked for), else 503 (404 for another version)."""
        return {"name": self.served(name, version)[1].name, "ready": True}

    async def infer(self, request: Request, name: str, version: str | None) -> Response:
        """Named tensors in, named tensors out: JSON, or binary after the JSON (Inference-Header-Content-Length)."""
        family, model = self.served(name, version)
        inference, binary = _read_request(await request.body(), request.headers)
        wanted = _wanted_outputs(inference, _output_types(family, model, self.logged))
        values = _input_values(family, model, inference, binary, self.settings.max_items)
        rows, answered = await within_deadline(
            request, self.rollout.serve(family, family.tensor_items(values, model), pinned=version is not None),
            self.settings.request_timeout_s)
        outputs = family.output_arrays(rows, answered)
        if self.logged:
            outputs["prediction_id"] = np.array([r.get("prediction_id", "") for r in rows], object)
        if version is not None and answered.version != version:
            raise NotReady(f"{answered.name} changed to version {answered.version} while the request waited; retry")
        return _answer(answered, inference.id, wanted, outputs)


def protocol_router(settings: ServingSettings, store: ServedModels, predictions: Predictions,
                    rollout: Rollout) -> APIRouter:
    """/v2/...: health and server metadata open like /health; model metadata, readiness and inference behind
    the API key like /v1. A model is named by its registry name or by its family (e.g. `sensor`).
    Inference goes through the rollout, the prediction log and the monitoring like /v1 (a request naming a
    version is answered by the champion of that version, never by a canary); with the log on, each item's
    `prediction_id` is an output (BYTES, empty for an item that got an `error`)."""
    routes = ProtocolRoutes(settings, store, predictions, rollout)
    router = APIRouter(prefix="/v2", route_class=ProtocolRoute, tags=["open inference protocol"])
    guarded = api_key_guard(settings.api_key)

    @router.get("/health/live")
    async def live() -> dict:
        """200 while the process is up."""
        return {"live": True}

    router.add_api_route("/health/ready", routes.ready, methods=["GET"], responses=protocol_errors(503))

    @router.get("")
    async def server_metadata() -> dict:
        return {"name": "failsafe-ml", "version": package_version("failsafe-ml"), "extensions": ["binary_tensor_data"]}

    lookup = protocol_errors(401, 404, 422, 503)
    for base, route in (("/models/{name}", _any_version), ("/models/{name}/versions/{version}", _named_version)):
        router.add_api_route(base, route(routes.model_metadata), methods=["GET"], dependencies=guarded,
                             responses=lookup)
        router.add_api_route(f"{base}/ready", route(routes.model_ready), methods=["GET"], dependencies=guarded,
                             responses=lookup)
        router.add_api_route(f"{base}/infer", route(routes.infer), methods=["POST"], dependencies=guarded,
                             response_class=Response, responses=protocol_errors(400, 401, 404, 413, 422, 503, 504))
    return router


def _any_version(handler: Callable) -> Callable:
    """`handler` as a route of /models/{name}: the served version."""
    async def route(request: Request, name: str):
        return await handler(request, name, None)

    route.__name__, route.__doc__ = handler.__name__, handler.__doc__
    return route


def _named_version(handler: Callable) -> Callable:
    """`handler` as a route of /models/{name}/versions/{version}: that version only."""
    async def route(request: Request, name: str, version: str):
        return await handler(request, name, version)

    route.__name__, route.__doc__ = f"{handler.__name__}_of_version", handler.__doc__
    return route


def _output_types(family: ServedFamily, model: LoadedModel, logged: bool) -> dict[str, str]:
    types = family.output_types(model)
    return {**types, "prediction_id": "BYTES"} if logged else types


def _metadata(family: ServedFamily, model: LoadedModel, logged: bool) -> dict:
    datatype, shape, _ = family.tensor_spec(model)
    outputs = [{"name": name, "datatype": datatype, "shape": [-1]}
               for name, datatype in _output_types(family, model, logged).items()]
    return {"name": model.name, "versions": [model.version], "platform": "onnxruntime",
            "inputs": [{"name": family.tensor_name, "datatype": datatype, "shape": [-1, *shape]}],
            "outputs": outputs}


def _input_values(family: ServedFamily, model: LoadedModel, inference: InferenceRequest, binary: bytes,
                  max_items: int) -> np.ndarray | list[str]:
    """The family's one input tensor, decoded: FP32 as a float32 array (n, ...), BYTES as n strings."""
    datatype, shape, meaning = family.tensor_spec(model)
    tensor = _only_input(inference, family.tensor_name, datatype, binary)
    if datatype == "BYTES":
        if not (len(tensor.shape) in (1, 2) and tensor.shape[0] >= 1 and tensor.shape[1:] in ([], [1])):
            raise ProtocolError(400, f"input {tensor.name!r} has shape {tensor.shape}; this model needs [n] or [n, 1]")
        check_count(tensor.shape[0], max_items, family.items_name)
        return _texts(tensor, binary)
    if len(tensor.shape) != 1 + len(shape) or tensor.shape[0] < 1 or tensor.shape[1:] != shape:
        needed = ", ".join(["n", *map(str, shape)])
        raise ProtocolError(400, f"input {tensor.name!r} has shape {tensor.shape}; this model needs [{needed}]: "
                                 f"{meaning}")
    check_count(tensor.shape[0], max_items, family.items_name)
    return _floats(tensor, binary)


def _read_request(body: bytes, headers) -> tuple[InferenceRequest, bytes]:
    """The JSON inference request and the binary tensor data after it (empty when there is none)."""
    encoding = headers.get("content-encoding", "identity")
    if encoding != "identity":
        raise ProtocolError(400, f"Content-Encoding {encoding} is not supported: send the body uncompressed")
    declared = headers.get(HEADER_LENGTH)
    length = len(body)
    if declared is not None:
        if not (declared.isascii() and declared.isdigit()) or int(declared) > len(body):
            raise ProtocolError(400, f"{HEADER_LENGTH} {declared!r} is not a length within the {len(body)}-byte body")
        length = int(declared)
    try:
        parsed = json.loads(body[:length])  # Python's parser: NaN, as tritonclient writes it, is a missing reading
    except (ValueError, RecursionError) as error:
        raise ProtocolError(400, f"the inference request is not valid JSON: {error}") from None
    try:
        return InferenceRequest.model_validate(parsed), body[length:]
    except ValidationError as error:
        problems = [f"{'.'.join(str(p) for p in e['loc']) or 'request'}: {e['msg']}"
                    for e in error.errors()[:MAX_ERRORS_SHOWN]]
        raise ProtocolError(400, f"not an inference request: {'; '.join(problems)}") from None


def _wanted_outputs(inference: InferenceRequest, types: dict[str, str]) -> list[tuple[str, str, bool]]:
    """(name, datatype, as binary) of each output to send: those asked for, else all."""
    default = inference.parameters.binary_data_output
    asked = inference.outputs or [RequestOutput(name=name) for name in types]
    unknown = [o.name for o in asked if o.name not in types]
    if unknown:
        raise ProtocolError(400, f"unknown output {unknown[0]!r}; this model has {', '.join(types)}")
    return [(o.name, types[o.name], default if o.parameters.binary_data is None else o.parameters.binary_data)
            for o in asked]


def _only_input(inference: InferenceRequest, name: str, datatype: str, binary: bytes) -> RequestInput:
    names = [tensor.name for tensor in inference.inputs]
    if names != [name]:
        raise ProtocolError(400, f"this model takes one input, {name!r} ({datatype}); "
                                 f"got {', '.join(map(repr, names))}")
    tensor = inference.inputs[0]
    if tensor.datatype != datatype:
        raise ProtocolError(400, f"input {name!r} must be {datatype}, not {tensor.datatype}")
    size = tensor.parameters.binary_data_size
    if size is None and binary:
        raise ProtocolError(400, f"{len(binary)} bytes follow the JSON but input {name!r} has no binary_data_size")
    if size is None and tensor.data is None:
        raise ProtocolError(400, f"input {name!r} has neither `data` nor the parameter binary_data_size")
    if size is not None and size != len(binary):
        raise ProtocolError(400, f"input {name!r} declares binary_data_size {size} but {len(binary)} bytes follow "
                                 f"the JSON")
    return tensor


def _floats(tensor: RequestInput, binary: bytes) -> np.ndarray:
    """An FP32 tensor of a checked shape as float32, NaN for a missing value (NaN in binary, null or NaN in JSON)."""
    shape, count = tensor.shape, math.prod(tensor.shape)
    if tensor.parameters.binary_data_size is not None:
        if len(binary) != 4 * count:
            raise ProtocolError(400, f"input {tensor.name!r} of shape {shape} needs {4 * count} bytes of FP32, "
                                     f"got {len(binary)}")
        return np.frombuffer(binary, "<f4").reshape(shape)
    values = _flat(tensor.data, len(shape), lambda v: v is None or type(v) in (int, float),
                   "numbers (null or NaN for a missing reading)")
    if len(values) != count:
        raise ProtocolError(400, f"input {tensor.name!r} has {len(values)} values; shape {shape} needs {count}")
    try:
        with np.errstate(over="ignore"):
            return np.array(values, np.float32).reshape(shape)  # None -> NaN
    except OverflowError:  # an integer beyond any float
        raise ProtocolError(400, f"input {tensor.name!r} holds an integer beyond float32") from None


def _texts(tensor: RequestInput, binary: bytes) -> list[str]:
    """A BYTES tensor of shape [n] or [n, 1] as n strings (UTF-8)."""
    count = tensor.shape[0]
    if tensor.parameters.binary_data_size is not None:
        items = [_utf8(item, tensor.name, i) for i, item in enumerate(_bytes_elements(binary, count))]
    else:
        items = _flat(tensor.data, len(tensor.shape), lambda v: type(v) is str, "strings")
    if len(items) != count:
        raise ProtocolError(400, f"input {tensor.name!r} has {len(items)} elements; shape {tensor.shape} needs {count}")
    for index, item in enumerate(items):
        if not is_unicode(item):
            raise ProtocolError(400, f"{tensor.name}[{index}] is not valid Unicode text (a lone surrogate)")
    return items


def _flat(data: Any, depth: int, valid: Callable[[Any], bool], what: str) -> list:
    """JSON tensor data, flat or nested at most `depth` deep, as one row-major list of checked elements."""
    out: list = []

    def walk(items: Any, level: int) -> None:
        if not isinstance(items, list) or level > depth:
            raise ProtocolError(400, f"tensor data must be a list nested at most {depth} deep")
        for item in items:
            if isinstance(item, list):
                walk(item, level + 1)
            elif valid(item):
                out.append(item)
            else:
                raise ProtocolError(400, f"tensor data holds {item!r}; this input's elements must be {what}")

    walk(data, 1)
    return out


def _bytes_elements(raw: bytes, most: int) -> list[bytes]:
    """Binary BYTES data: each element a 4-byte little-endian length and that many bytes."""
    items, offset = [], 0
    while offset < len(raw):
        if offset + 4 > len(raw) or len(items) == most:
            raise ProtocolError(400, f"the BYTES data does not hold exactly {most} length-prefixed elements")
        (length,) = struct.unpack_from("<I", raw, offset)
        offset += 4
        if offset + length > len(raw):
            raise ProtocolError(400, f"BYTES element {len(items)} claims {length} bytes; "
                                     f"only {len(raw) - offset} follow")
        items.append(raw[offset:offset + length])
        offset += length
    return items


def _utf8(item: bytes, name: str, index: int) -> str:
    try:
        return item.decode()
    except UnicodeDecodeError:
        raise ProtocolError(400, f"{name}[{index}] is not UTF-8 text") from None


def _binary(array: np.ndarray, datatype: str) -> bytes:
    if datatype == "BYTES":
        return b"".join(struct.pack("<I", len(e)) + e for e in (s.encode() for s in array.tolist()))
    return np.ascontiguousarray(array, "<f4" if datatype == "FP32" else bool).tobytes()


def _answer(model: LoadedModel, request_id: str | None, wanted: list[tuple[str, str, bool]],
            outputs: dict[str, np.ndarray]) -> Response:
    """The inference response: JSON (NaN written as null), with the binary outputs after it."""
    described, chunks = [], []
    for name, datatype, as_binary in wanted:
        output = {"name": name, "datatype": datatype, "shape": list(outputs[name].shape)}
        if as_binary:
            chunks.append(_binary(outputs[name], datatype))
            output["parameters"] = {"binary_data_size": len(chunks[-1])}
        else:
            output["data"] = outputs[name].tolist()
        described.append(output)
    body = {"model_name": model.name, "model_version": model.version, "outputs": described}
    if request_id is not None:
        body["id"] = request_id
    header = orjson.dumps(body)
    if not chunks:
        return Response(header, media_type="application/json")
    return Response(header + b"".join(chunks), media_type="application/octet-stream",
                    headers={HEADER_LENGTH: str(len(header))})
