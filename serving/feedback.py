"""POST /v1/feedback: outcomes observed for earlier predictions, stored in the prediction store's `outcomes`.

An item names its prediction by `prediction_id` (with `observed`: 0 or 1 for a classifier, a number for a
regression model) or, for sensor windows sent with `units` and `times`, by `unit` and `time` (with `label` 0 or
1, applied to every prediction of that unit at that time). One outcome per prediction: the same one sent again
is kept once, a different one replaces it and the answer says so. An unknown prediction is reported in its
item, not as an error; a label a classifier cannot have is a 422 naming the item, and nothing is stored.

A prediction made in the last FLUSH_TIMEOUT_S may still wait for the store, in this worker's queue or another's:
feedback flushes its own and waits up to FLUSH_TIMEOUT_S from the prediction's time (its id says when) for the
others. While the store cannot be written (the log retries it), feedback answers 503: retry later.
"""

from __future__ import annotations

import asyncio
import time
from typing import Annotated, Literal

from fastapi import APIRouter, HTTPException
from pydantic import BaseModel, ConfigDict, Field, model_validator
from sqlalchemy.exc import SQLAlchemyError

from contract.prediction_store import find_predictions, find_unit_times, record_outcomes, task_of
from serving.errors import BODY_ERRORS, error_responses
from serving.inputs import BadInput, check_count
from serving.prediction_log import PredictionLog, made_at_ms
from serving.schemas import Time, Unit

FLUSH_TIMEOUT_S = 2.0  # how long feedback waits for predictions still queued for the store
POLL_S = 0.05  # how often it looks for predictions queued by other workers

Observed = Annotated[float, Field(strict=True, allow_inf_nan=False)]


class Outcome(BaseModel):
    """Either `prediction_id` and `observed`, or `unit`, `time` and `label`."""

    model_config = ConfigDict(extra="forbid")
    prediction_id: str | None = Field(None, min_length=1, max_length=64, description="from a prediction's answer")
    observed: Observed | None = Field(None, description="0 or 1 for a classifier, the measured value for regression")
    unit: Unit | None = Field(None, description="a sensor unit, as sent in `units`")
    time: Time | None = Field(None, description="the window's time, as sent in `times`")
    label: Observed | None = Field(None, description="0 or 1: whether the unit failed (as in training labels)")

    @model_validator(mode="after")
    def one_way_to_name_a_prediction(self) -> "Outcome":
        by_id = (self.prediction_id, self.observed)
        by_unit = (self.unit, self.time, self.label)
        if not (all(v is not None for v in by_id) and all(v is None for v in by_unit)
                or all(v is not None for v in by_unit) and all(v is None for v in by_id)):
            raise ValueError("give either `prediction_id` and `observed`, or `unit`, `time` and `label`")
        if self.label is not None and self.label not in (0, 1):
            raise ValueError(f"`label` is {self.label:g}; a sensor label is 0 or 1")
        return self


class FeedbackRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    outcomes: list[Outcome] = Field(min_length=1, description="at most SERVING_MAX_ITEMS items")


class OutcomeAnswer(BaseModel):
    status: Literal["accepted", "replaced", "unknown"] = Field(
        description="accepted: stored (or already stored as sent); replaced: it replaced a different outcome; "
                    "unknown: no such prediction (never made, not logged, or deleted by retention)")
    prediction_ids: list[str] = Field([], description="the predictions the outcome was stored for")
    previous: dict[str, float] | None = Field(None, description="replaced: the outcome each prediction had before")
    detail: str | None = Field(None, description="unknown: why")


class FeedbackResponse(BaseModel):
    accepted: int = Field(description="items stored as new or as already stored")
    replaced: int = Field(description="items that replaced a different earlier outcome")
    unknown: int = Field(description="items naming no known prediction")
    items: list[OutcomeAnswer] = Field(description="one per item, in order")


def _targets(outcomes: list[Outcome], engine) -> tuple[list[list[str]], dict[str, dict]]:
    """The prediction ids each item names (empty: unknown), and {id: {family, output}} of all of them."""
    by_unit = find_unit_times(engine, [(o.unit, o.time) for o in outcomes if o.unit is not None])
    named = [[o.prediction_id] if o.prediction_id is not None else by_unit.get((o.unit, o.time), [])
             for o in outcomes]
    found = find_predictions(engine, {key for ids in named for key in ids})
    return [[key for key in ids if key in found] for ids in named], found


def apply_feedback(engine, outcomes: list[Outcome]) -> FeedbackResponse:
    """Check every item against the predictions it names, then store all outcomes in one transaction. BadInput
    (nothing stored) when a classifier's outcome is not 0 or 1, or two items give one prediction different ones."""
    targets, found = _targets(outcomes, engine)
    observed: dict[str, tuple[str, float]] = {}
    given_by: dict[str, int] = {}
    for i, (outcome, ids) in enumerate(zip(outcomes, targets)):
        value = outcome.observed if outcome.prediction_id is not None else outcome.label
        field = "observed" if outcome.prediction_id is not None else "label"
        for key in ids:
            family, output = found[key]["family"], found[key]["output"]
            if task_of(family, output) == "classification" and value not in (0, 1):
                raise BadInput(f"outcomes[{i}].{field} is {value:g}, but prediction {key} is a classifier's "
                               f"({family}): send 0 or 1")
            if key in observed and observed[key][1] != value:
                raise BadInput(f"outcomes[{i}] gives prediction {key} the outcome {value:g}, but outcomes[{given_by[key]}] "
                               f"gave it {observed[key][1]:g}: send one outcome per prediction")
            observed[key], given_by[key] = (family, float(value)), i
    previous = record_outcomes(engine, observed)
    items = []
    for outcome, ids in zip(outcomes, targets):
        if not ids:
            what = (f"no prediction with id {outcome.prediction_id!r}" if outcome.prediction_id is not None
                    else f"no prediction for unit {outcome.unit!r} at time {outcome.time:.15g}")
            items.append(OutcomeAnswer(status="unknown", detail=f"{what} (never made, not logged, or older than "
                                                                 f"the retention limits)"))
            continue
        changed = {key: previous[key] for key in ids if previous[key] is not None and previous[key] != observed[key][1]}
        items.append(OutcomeAnswer(status="replaced" if changed else "accepted", prediction_ids=ids,
                                   previous=changed or None))
    count = {status: sum(item.status == status for item in items) for status in ("accepted", "replaced", "unknown")}
    return FeedbackResponse(**count, items=items)


async def _wait_for_recent(engine, ids: list[str]) -> None:
    """Until each of `ids` made in the last FLUSH_TIMEOUT_S (by any worker: its id says when) is in the store, or
    FLUSH_TIMEOUT_S from its time has passed; never longer than FLUSH_TIMEOUT_S."""
    now_ms = time.time() * 1000
    deadline_ms = {key: made + FLUSH_TIMEOUT_S * 1000 for key in ids
                   if (made := made_at_ms(key)) is not None and now_ms - FLUSH_TIMEOUT_S * 1000 < made <= now_ms}
    while deadline_ms:
        found = await asyncio.to_thread(find_predictions, engine, set(deadline_ms))
        now_ms = time.time() * 1000
        deadline_ms = {key: until for key, until in deadline_ms.items() if key not in found and until > now_ms}
        if deadline_ms:
            await asyncio.sleep(POLL_S)


def feedback_router(prediction_log: PredictionLog, max_items: int) -> APIRouter:
    """The /feedback route (mounted under /v1, behind its API key)."""
    router = APIRouter()

    @router.post("/feedback", tags=["feedback"], response_model=FeedbackResponse, response_model_exclude_none=True,
                 responses=error_responses(401, 503, *BODY_ERRORS))
    async def feedback(body: FeedbackRequest) -> FeedbackResponse:
        """Outcomes of earlier predictions, by `prediction_id` or by sensor `unit` and `time`; counts of accepted,
        replaced and unknown items, and per item what happened."""
        check_count(len(body.outcomes), max_items, "outcomes")
        writer = prediction_log.writer
        if writer is None:
            raise HTTPException(404, "the prediction log is off (SERVING_PREDICTION_LOG=false): no feedback is taken")
        if writer.failing is not None:
            raise HTTPException(503, f"the prediction log cannot write to the store now ({writer.failing}): recent "
                                     "predictions are not there yet; retry later", headers={"Retry-After": "5"})
        try:
            await asyncio.to_thread(writer.flush, FLUSH_TIMEOUT_S)  # predictions answered just now are findable
            await asyncio.to_thread(writer.ensure_tables)
            await _wait_for_recent(writer.engine, [o.prediction_id for o in body.outcomes if o.prediction_id])
            return await asyncio.to_thread(apply_feedback, writer.engine, body.outcomes)
        except (SQLAlchemyError, OSError) as error:
            first = (str(error).strip().splitlines() or [type(error).__name__])[0][:300]
            raise HTTPException(503, f"the prediction store cannot be used now: {first}",
                                headers={"Retry-After": "5"}) from None

    return router
