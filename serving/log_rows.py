"""The prediction log's records, as the service queues them, and the store rows they become (in the writer
process, serving.log_writer). Imports only numpy and the store's contract, so the writer process starts light.

A record pickles compactly (a window batch as its float32 bytes), since every record crosses a pipe to the writer.
"""

from __future__ import annotations

import datetime
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from contract.prediction_store import DOMAIN_FIELDS, PredictionRow, window_summaries

NOT_LOGGED = frozenset(("prediction_id", "smiles", "canonical_smiles", *DOMAIN_FIELDS))  # answer fields, not output
RECORD_GLOBALS = ("_answered", "_windows", "MoleculesRecord")  # the names a pickled record refers to (log_process)


@dataclass(slots=True)
class Answered:
    """What every row of one request shares."""

    family: str
    model_name: str
    model_version: str
    role: str
    request_id: str
    created_at: datetime.datetime
    latency_ms: float | None = None
    failed: bool = False

    def __reduce__(self):  # a datetime with its time zone pickles slowly; a POSIX timestamp is a float
        return _answered, (self.family, self.model_name, self.model_version, self.role, self.request_id,
                           self.created_at.timestamp(), self.latency_ms, self.failed)

    def row(self, prediction_id: str, digest: str, summary: dict, answer: dict, unit=None, time=None) -> PredictionRow:
        output = {key: value for key, value in answer.items() if key not in NOT_LOGGED}
        return {"id": prediction_id, "created_at": self.created_at, "family": self.family,
                "model_name": self.model_name, "model_version": self.model_version, "role": self.role,
                "request_id": self.request_id, "unit": unit, "time": time, "input_digest": digest,
                "input_summary": summary, "output": output, "latency_ms": self.latency_ms, "failed": self.failed}


def _answered(family, model_name, model_version, role, request_id, timestamp, latency_ms, failed) -> Answered:
    created_at = datetime.datetime.fromtimestamp(timestamp, datetime.timezone.utc)
    return Answered(family, model_name, model_version, role, request_id, created_at, latency_ms, failed)


def _windows(answered, data: bytes, shape: tuple, channels, answers, units, times) -> "WindowsRecord":
    return WindowsRecord(answered, np.frombuffer(data, dtype=np.float32).reshape(shape), channels, answers, units,
                         times)


@dataclass(slots=True)
class WindowsRecord:
    """Answered windows (n, T, C) float32 with their answers (carrying `prediction_id`), units and times."""

    answered: Answered
    windows: np.ndarray
    channels: Sequence[str]
    answers: Sequence[dict]
    units: Sequence[str] | None
    times: Sequence[float] | None

    def __len__(self) -> int:
        return len(self.answers)

    def __reduce__(self):
        windows = np.ascontiguousarray(self.windows, dtype=np.float32)
        return _windows, (self.answered, windows.tobytes(), windows.shape, self.channels, self.answers, self.units,
                          self.times)

    def rows(self, summaries: Sequence[dict]) -> list[PredictionRow]:
        """The rows, given each window's summary."""
        windows = self.windows.astype("<f4", copy=False)
        return [self.answered.row(answer["prediction_id"], hashlib.sha256(window.tobytes()).hexdigest(), summary,
                                  answer, None if self.units is None else self.units[i],
                                  None if self.times is None else self.times[i])
                for i, (window, summary, answer) in enumerate(zip(windows, summaries, self.answers))]


@dataclass(slots=True)
class MoleculesRecord:
    """Answered molecules: the answers carrying `prediction_id`, `smiles` (as sent) and `canonical_smiles` (None
    when the call failed)."""

    answered: Answered
    answers: Sequence[dict]

    def __len__(self) -> int:
        return len(self.answers)

    def __reduce__(self):
        return MoleculesRecord, (self.answered, self.answers)

    def rows(self) -> list[PredictionRow]:
        """The rows; the summary holds the canonical SMILES and the applicability domain when answered."""
        return [self.answered.row(answer["prediction_id"], hashlib.sha256(answer["smiles"].encode()).hexdigest(),
                                  {"canonical_smiles": answer["canonical_smiles"],
                                   **{key: answer[key] for key in DOMAIN_FIELDS if key in answer}}
                                  if answer["canonical_smiles"] else {"smiles": answer["smiles"]}, answer)
                for answer in self.answers]


def rows_of(records: Sequence[WindowsRecord | MoleculesRecord]) -> list[PredictionRow]:
    """The rows of a batch of records, in order. The windows of all records with one layout (channels, steps) are
    summarised together: numpy's cost per call would otherwise dominate one-window requests."""
    layouts: dict[tuple, list[WindowsRecord]] = {}
    for record in records:
        if isinstance(record, WindowsRecord):
            layouts.setdefault((tuple(record.channels), record.windows.shape[1:]), []).append(record)
    summaries: dict[int, list[dict]] = {}
    for (channels, _), group in layouts.items():
        together = window_summaries(np.concatenate([record.windows for record in group]), channels)
        start = 0
        for record in group:
            summaries[id(record)], start = together[start:start + len(record)], start + len(record)
    return [row for record in records
            for row in (record.rows(summaries[id(record)]) if isinstance(record, WindowsRecord) else record.rows())]
