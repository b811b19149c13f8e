"""The two prediction paths behind the HTTP routes, for any router to call: sensor windows or SMILES in, one
answer per item out, through the fair micro-batchers (serving.batching) and the featurisation pool. The
champion and the challenger (serving.rollout) each have their own batchers and model threads, so a challenger
call never queues a champion call."""

from __future__ import annotations

import asyncio
import functools
import math
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from dataclasses import dataclass

import numpy as np

from contract.registry import CHALLENGER, CHAMPION
from models.predictors import UnitReference
from serving.batching import Batcher
from serving.domain import assess, unusable
from serving.featurizing import Featurizer, Molecule, molecule_bytes
from serving.loading import LoadedModel
from serving.metrics import ServiceMetrics
from serving.settings import ServingSettings
from serving.store import ModelStore
from serving.units import FLEET, UnitReferences


class NotReady(Exception):
    """No model of this family is loaded (yet), or it changed under a queued request."""


def _number(value: float) -> float | None:
    return value if math.isfinite(value) else None


@dataclass(frozen=True)
class SensorItems:
    """One request's windows (n, T, C), each one's unit reference (None: the fleet's) and the model version the
    references were fitted for; sliced by the batcher like the windows alone."""

    windows: np.ndarray
    references: Sequence[UnitReference | None]
    version: str

    def __len__(self) -> int:
        return len(self.windows)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return SensorItems(self.windows[index], self.references[index], self.version)
        return self.windows[index]


class Predictions:
    """Owns the batchers and the featurisation pool; `start` and `stop` belong to the app's lifespan."""

    def __init__(self, store: ModelStore, settings: ServingSettings, metrics: ServiceMetrics, units: UnitReferences):
        self.store, self.inline_items, self.units = store, settings.inline_max_items, units
        self.min_similarity = settings.monitor_min_similarity
        batch = dict(max_items=settings.batch_max_items, max_bytes=settings.batch_max_bytes, share=settings.batch_share)
        self.batchers = {}
        for role in (CHAMPION, CHALLENGER):
            self.batchers["sensor", role] = Batcher(
                functools.partial(self._run_sensor, role), **batch, size_of=lambda window: window.nbytes,
                on_batch=metrics.batch_items.labels("sensor").observe)
            self.batchers["molecule", role] = Batcher(
                functools.partial(self._run_molecule, role), **batch, size_of=molecule_bytes,
                on_batch=metrics.batch_items.labels("molecule").observe)
        self.featurizer = Featurizer(settings.featurize_workers, settings.featurize_batch_items,
                                     settings.featurize_batch_chars, settings.featurize_turn_chars,
                                     settings.max_heavy_atoms,
                                     settings.feature_cache_mb * 2**20, settings.featurize_niceness,
                                     on_batch=metrics.batch_items.labels("featurize").observe)
        # one thread per family and role: a model call never waits for the other family's or the challenger's
        self._threads = {(family, role): ThreadPoolExecutor(1, thread_name_prefix=f"onnxruntime-{family}-{role}")
                         for family in ("sensor", "molecule") for role in (CHAMPION, CHALLENGER)}

    def model_of(self, family: str, role: str = CHAMPION) -> LoadedModel:
        """The model of `family` answering as `role` (`champion` or `challenger`); NotReady when none is loaded."""
        model = self.store.get(family) if role == CHAMPION else self.store.challenger(family)
        if model is None:
            if role == CHAMPION:
                raise NotReady(f"no {family} model is loaded yet: {self.store.problems.get(family, 'loading')}")
            raise NotReady(f"no {family} challenger is loaded: {self.store.problems.get(f'{family}.{role}', 'none')}")
        return model

    async def predict_windows(self, windows: np.ndarray, role: str = CHAMPION,
                              units: Sequence[str | None] | None = None) -> tuple[list[dict], LoadedModel]:
        """Windows (n, T, C) float32, NaN for missing readings, and each one's unit (or None) -> per window
        `failure_probability`, `alert`, `uncertainty` (with a novelty score also `novelty_score`, `alert_probability`
        and `alert_source`; with a model that takes unit references `reference`: whose normal the window was seen
        against), and the model (of `role`) that answered."""
        model = self.model_of("sensor", role)
        references = kinds = None
        if model.predictor.takes_references and units is not None and any(u is not None for u in units):
            references, kinds = await asyncio.to_thread(self.units.references, units, model)  # reads the store
        elif model.predictor.takes_references:  # no unit named: none of its own for any window
            kinds = [FLEET] * len(windows)
        answers, model = await self.batchers["sensor", role].submit(
            SensorItems(windows, references or [None] * len(windows), model.version))
        rows = [{"failure_probability": p, "alert": a, "uncertainty": u} for p, a, u, *_ in answers]
        if model.predictor.has_novelty:
            for row, (*_, n, c, source) in zip(rows, answers):
                row.update(novelty_score=n, alert_probability=c, alert_source=source)
        if kinds is not None:
            for row, kind in zip(rows, kinds):
                row["reference"] = kind
        return rows, model

    async def predict_smiles(self, smiles: Sequence[str], role: str = CHAMPION) -> tuple[list[dict], LoadedModel]:
        """SMILES -> per SMILES its `canonical_smiles`, `value` (regression) or `probability`, `uncertainty` and
        `modality` (`graph_only`: its SMILES is too long for the tokenizer; `smiles_only`: its graph cannot be built),
        and its applicability domain when the model has a training reference and the molecule its graph
        (serving.domain); or its `error`."""
        model = self.model_of("molecule", role)
        featurized = await self.featurizer.featurize(smiles)
        molecules = [f for f in featurized if not isinstance(f, str)]
        answers, model = await self.batchers["molecule", role].submit(molecules) if molecules else ([], model)
        key = "value" if model.predictor.task == "regression" else "probability"
        rows, answered = [], iter(answers)
        for item, molecule in zip(smiles, featurized):
            if isinstance(molecule, str):
                rows.append({"smiles": item, "error": molecule})
            else:
                value, uncertainty, modality, error, domain = next(answered)
                if error is not None:
                    rows.append({"smiles": item, "error": error})
                    continue
                row = {"smiles": item, "canonical_smiles": molecule.graph.smiles, key: _number(value),
                       "uncertainty": _number(uncertainty), "modality": modality, **domain}
                rows.append({k: v for k, v in row.items() if v is not None})
        return rows, model

    async def _run_sensor(self, role: str, parts: list[SensorItems]) -> tuple[list[list[tuple]], LoadedModel]:
        if sum(len(part) for part in parts) <= self.inline_items:  # cheaper than a thread hop, for either role
            return self._sensor_call(role, parts)
        return await asyncio.get_running_loop().run_in_executor(self._threads["sensor", role], self._sensor_call,
                                                                role, parts)

    def _sensor_call(self, role: str, parts: list[SensorItems]) -> tuple[list[list[tuple]], LoadedModel]:
        model = self.model_of("sensor", role)
        if any(part.version != model.version for part in parts):  # references fitted for another version
            raise NotReady("the sensor model changed while the request waited; retry")
        try:
            out = model.predictor.predict(np.concatenate([part.windows for part in parts]).transpose(0, 2, 1),
                                          [r for part in parts for r in part.references])
        except ValueError as error:  # the model was swapped for one with another input layout
            raise NotReady(f"the sensor model changed while the request waited; retry ({error})") from None
        columns = [out["probability"].tolist(), out["alert"].tolist(), out["uncertainty"].tolist()]
        if "novelty" in out:
            columns += [out["novelty"].tolist(), out["combined"].tolist(), out["source"].tolist()]
        return _split(list(zip(*columns)), parts), model

    async def _run_molecule(self, role: str, parts: list[list]) -> tuple[list[list[tuple]], LoadedModel]:
        return await asyncio.get_running_loop().run_in_executor(self._threads["molecule", role], self._molecule_call,
                                                                role, parts)

    def _molecule_call(self, role: str, parts: list[list[Molecule]]) -> tuple[list[list[tuple]], LoadedModel]:
        model = self.model_of("molecule", role)
        molecules = [m for part in parts for m in part]
        out = model.predictor.predict_graphs([m.graph for m in molecules])
        domains = [{}] * len(molecules)
        placed = [i for i, m in enumerate(molecules) if m.fingerprint is not None]  # a SMILES view alone has no domain
        if placed and unusable(model.reference) is None:
            found = assess(model.reference, np.stack([molecules[i].fingerprint for i in placed]),
                           np.stack([molecules[i].graph.descriptors for i in placed]), self.min_similarity)
            for i, domain in zip(placed, found):
                domains[i] = domain
        rows = list(zip(out["prediction"].tolist(), out["uncertainty"].tolist(), out["modality"].tolist(),
                        out["error"], domains))
        return _split(rows, parts), model

    async def start(self) -> None:
        await self.featurizer.start()

    def close(self) -> None:
        """Refuse new work and answer the waiting requests 'shutting down' (what is in flight finishes)."""
        for batcher in self.batchers.values():
            batcher.close()
        self.featurizer.close()

    async def stop(self) -> None:
        """Close, wait for the model calls in flight, end the featurisation workers and the model threads."""
        self.close()
        await self.featurizer.stop()
        for batcher in self.batchers.values():
            await batcher.drain()
        for threads in self._threads.values():
            threads.shutdown(wait=True)


def _split(rows: list, parts: Sequence[Sequence]) -> list[list]:
    out, start = [], 0
    for part in parts:
        out.append(rows[start:start + len(part)])
        start += len(part)
    return out
