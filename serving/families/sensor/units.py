"""Sensor units' references: the healthy windows a user gives for each unit, kept in the service's store (the
prediction store's database: shared by the worker processes, kept across restarts), and each unit's reference fitted
from them for the served model version (models/predictors.py: its channel levels for the relative channels, its
novelty reference, models/sensor/departure.py).

At most SERVING_MAX_UNITS units; a worker re-reads a unit's windows at most every SERVING_UNITS_REFRESH_S, so a
reference put through one worker reaches the others within that time. A window of a unit without a reference (none
given, or given for other channels or another window length) is seen without a level (relative channels masked) and
scored for novelty against the training fleet's normal, and its answer says so (`reference: fleet`).
"""

from __future__ import annotations

import asyncio
import datetime
import hashlib
import logging
import threading
import time
from collections.abc import Callable, Sequence

import numpy as np
from fastapi import APIRouter, HTTPException, Path, Response
from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy import JSON, Column, DateTime, Integer, LargeBinary, MetaData, String, Table, delete, func, insert, \
    select
from sqlalchemy.engine import Engine
from sqlalchemy.exc import SQLAlchemyError

from contract.prediction_store import create_despite_others, utc_now
from models.predictors import UnitReference
from serving.errors import BODY_ERRORS, error_responses
from serving.families.sensor.inputs import sensor_windows
from serving.inputs import check_count
from serving.loading import LoadedModel
from serving.schemas import Window

OWN, FLEET = "unit", "fleet"  # the reference a window was scored against
log = logging.getLogger("serving")

metadata = MetaData()
unit_references = Table(
    "unit_references", metadata,
    Column("unit", String(256), primary_key=True),
    Column("channels", JSON, nullable=False),
    Column("steps", Integer, nullable=False),
    Column("count", Integer, nullable=False),
    Column("windows", LargeBinary, nullable=False),  # float32 (count, steps, channels), C order, NaN where missing
    Column("digest", String(64), nullable=False),  # sha256 of `windows`
    Column("updated_at", DateTime(timezone=True), nullable=False),
)


class TooManyUnits(Exception):
    """The store holds SERVING_MAX_UNITS units already; a new one needs another removed first."""


def _info(row) -> dict:
    updated = row.updated_at if row.updated_at.tzinfo else row.updated_at.replace(tzinfo=datetime.timezone.utc)
    return {"unit": row.unit, "windows": row.count, "channels": row.channels, "steps": row.steps,
            "updated_at": updated}


class UnitReferences:
    """The units' healthy windows in `engine`'s store, and their references per model version (blocking: call it
    from a thread)."""

    def __init__(self, engine: Engine, max_units: int, refresh_s: float):
        self.engine, self.max_units, self.refresh_s = engine, max_units, refresh_s
        self._lock = threading.Lock()
        self._tables_ready = False
        self._read: dict[str, tuple[float, tuple | None]] = {}  # unit -> (when read, its row's fields or None)
        self._fitted: dict[tuple[str, str, str, str], UnitReference] = {}  # (unit, digest, name, version) -> reference

    def _tables(self) -> None:
        if not self._tables_ready:
            create_despite_others(lambda: metadata.create_all(self.engine))
            self._tables_ready = True

    def put(self, unit: str, windows: np.ndarray, channels: list[str]) -> dict:
        """Store (or replace) `unit`'s healthy windows (n, T, C) float32; TooManyUnits for a new unit past the limit."""
        self._tables()
        data = np.ascontiguousarray(windows, dtype=np.float32)
        row = {"unit": unit, "channels": list(channels), "steps": int(data.shape[1]), "count": int(data.shape[0]),
               "windows": data.tobytes(), "digest": hashlib.sha256(data.tobytes()).hexdigest(),
               "updated_at": utc_now()}
        with self.engine.begin() as connection:
            exists = connection.execute(select(unit_references.c.unit).where(unit_references.c.unit == unit)).first()
            if exists is None:
                count = connection.execute(select(func.count()).select_from(unit_references)).scalar_one()
                if count >= self.max_units:
                    raise TooManyUnits(f"the service holds references of {count} units, its limit "
                                       f"(SERVING_MAX_UNITS={self.max_units}): DELETE one first")
            connection.execute(delete(unit_references).where(unit_references.c.unit == unit))
            connection.execute(insert(unit_references).values(**row))
        with self._lock:
            self._read[unit] = (time.monotonic(), (row["digest"], row["channels"], row["steps"], data))
        return {key: row[key] for key in ("unit", "channels", "steps")} | {"windows": row["count"],
                                                                           "updated_at": row["updated_at"]}

    def info(self, unit: str) -> dict | None:
        self._tables()
        columns = [c for c in unit_references.c if c.name != "windows"]
        with self.engine.connect() as connection:
            row = connection.execute(select(*columns).where(unit_references.c.unit == unit)).first()
        return None if row is None else _info(row)

    def delete(self, unit: str) -> bool:
        self._tables()
        with self.engine.begin() as connection:
            removed = connection.execute(delete(unit_references).where(unit_references.c.unit == unit)).rowcount
        with self._lock:
            self._read[unit] = (time.monotonic(), None)
        return bool(removed)

    def _rows(self, units: set[str]) -> dict[str, tuple | None]:
        """Each unit's (digest, channels, steps, windows (n, T, C)), or None; read again when older than refresh_s."""
        now = time.monotonic()
        with self._lock:
            fresh = {u: self._read[u][1] for u in units if u in self._read and now - self._read[u][0] < self.refresh_s}
        stale = units - set(fresh)
        if stale:
            try:
                self._tables()
                with self.engine.connect() as connection:
                    found = connection.execute(select(unit_references).where(
                        unit_references.c.unit.in_(sorted(stale))))
                    read = {row.unit: (row.digest, row.channels, row.steps,
                                       np.frombuffer(row.windows, np.float32).reshape(row.count, row.steps,
                                                                                      len(row.channels)))
                            for row in found}
            except (SQLAlchemyError, OSError) as error:  # answered against the fleet's normal, tried again next call
                log.warning("unit references cannot be read (%s): windows scored against the fleet's normal",
                            (str(error).strip().splitlines() or [type(error).__name__])[0][:300])
                return {**fresh, **{unit: None for unit in stale}}
            with self._lock:
                for unit in stale:
                    self._read[unit] = (now, read.get(unit))
                    fresh[unit] = read.get(unit)
        return fresh

    def references(self, units: Sequence[str | None], model: LoadedModel
                   ) -> tuple[list[UnitReference | None], list[str]]:
        """Per window: its unit's reference for `model` (None: none of its own) and which it is; `model`
        takes references (its predictor's `takes_references`)."""
        rows = self._rows({u for u in units if u is not None})
        fitted: dict[str, UnitReference | None] = {}
        for unit, row in rows.items():
            if row is None:
                fitted[unit] = None
                continue
            digest, channels, steps, windows = row
            if channels != model.card.channels or steps != model.card.window:
                fitted[unit] = None  # given for another input layout: not comparable
                continue
            key = (unit, digest, model.name, model.version)
            with self._lock:
                reference = self._fitted.get(key)
            if reference is None:
                reference = model.predictor.reference(windows.transpose(0, 2, 1))
                with self._lock:
                    self._fitted = {k: v for k, v in self._fitted.items() if k[0] != unit} | {key: reference}
            fitted[unit] = reference
        chosen = [None if unit is None else fitted[unit] for unit in units]
        return chosen, [FLEET if r is None else OWN for r in chosen]


class UnitReferenceRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    windows: list[Window] = Field(min_length=1, description="the unit's healthy windows, each as in /v1/sensor/predict "
                                  "(the model's `window` steps of its channels); at most SERVING_MAX_ITEMS")


class UnitReferenceInfo(BaseModel):
    unit: str
    windows: int = Field(description="healthy windows kept for the unit")
    channels: list[str]
    steps: int = Field(description="time steps per window")
    updated_at: datetime.datetime


async def _in_store(call: Callable, *args):
    """`call(*args)` in a thread; a store that cannot be used now is a 503 with Retry-After."""
    try:
        return await asyncio.to_thread(call, *args)
    except (SQLAlchemyError, OSError) as error:
        first = (str(error).strip().splitlines() or [type(error).__name__])[0][:300]
        raise HTTPException(503, f"the store of unit references cannot be used now: {first}",
                            headers={"Retry-After": "5"}) from None


def units_router(units: UnitReferences, model_of: Callable[[], LoadedModel], max_items: int) -> APIRouter:
    """/sensor/units/{unit}/reference: put, read and remove a unit's healthy windows (mounted under /v1)."""
    router = APIRouter(prefix="/sensor/units/{unit}/reference", tags=["units"])
    path_unit = Path(min_length=1, max_length=256, description="the unit (machine) id, as in `units` of predict")

    @router.put("", response_model=UnitReferenceInfo, responses=error_responses(409, 503, *BODY_ERRORS))
    async def put_reference(body: UnitReferenceRequest, unit: str = path_unit) -> dict:
        """Keep these healthy windows as the unit's normal (replacing what it had): its windows are then seen against
        them (the relative channels' levels, the novelty score's reference). 409 when the served model takes no unit
        references (neither relative channels nor a novelty score), or SERVING_MAX_UNITS units are kept already."""
        check_count(len(body.windows), max_items, "windows")
        model = model_of()
        if not model.predictor.takes_references:
            raise HTTPException(409, f"the served sensor model ({model.name} version {model.version}) has neither "
                                     "relative channels nor a novelty score: it takes no unit references")
        windows = sensor_windows(body.windows, model.card.channels, model.card.window)
        try:
            return await _in_store(units.put, unit, windows, model.card.channels)
        except TooManyUnits as error:
            raise HTTPException(409, str(error)) from None

    @router.get("", response_model=UnitReferenceInfo, responses=error_responses(404, 422, 503))
    async def get_reference(unit: str = path_unit) -> dict:
        """What is kept for the unit (404: nothing; its windows are scored against the fleet's normal)."""
        info = await _in_store(units.info, unit)
        if info is None:
            raise HTTPException(404, f"no reference for unit {unit!r}: its windows are scored against the fleet's "
                                     "normal")
        return info

    @router.delete("", status_code=204, responses=error_responses(404, 422, 503))
    async def delete_reference(unit: str = path_unit) -> Response:
        """Forget the unit's healthy windows."""
        if not await _in_store(units.delete, unit):
            raise HTTPException(404, f"no reference for unit {unit!r}")
        return Response(status_code=204)

    return router
