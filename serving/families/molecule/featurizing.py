"""Molecule featurisation off the event loop: SMILES -> MolGraph and Morgan fingerprint (for the applicability
domain, serving.families.molecule.domain) in a pool of worker processes, interleaved fairly between requests (serving.batching),
with a byte-bounded cache of recent answers."""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import signal
from collections import OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass

import numpy as np

from threadpoolctl import threadpool_limits

from data.errors import DataValidationError
from data.molecules.featurize import MolGraph, featurize_mol, smiles_view_only
from data.molecules.standardize import parse_smiles, standardize_mol
from models.drift import morgan_fingerprint
from serving.batching import Batcher
from serving.errors import RetryLater


@dataclass(frozen=True)
class Molecule:
    """A featurised SMILES: the model's graph and the packed Morgan bits (FINGERPRINT_BITS / 8,) uint8 of the same
    standardised molecule; or, for one whose graph cannot be built, its SMILES view alone (`graph.has_graph` False)
    and no fingerprint."""

    graph: MolGraph
    fingerprint: np.ndarray | None


Featurized = Molecule | str  # the molecule, or why the SMILES could not be featurised


class FeaturizerBroken(RetryLater):
    """A worker process died (its pool is replaced); the requests it held should be retried."""


def _setup_worker(niceness: int) -> None:
    """Ctrl-C reaches the whole process group: workers leave it to the service, which shuts them down. Each worker
    runs its linear algebra (the structural encodings' eigendecomposition and walk powers) on one BLAS thread, as
    one of `workers` processes sharing the cores, and at a lower priority than the event loops that answer the
    small requests."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    threadpool_limits(1)
    os.nice(niceness)


def featurize_many(smiles: list[str], max_heavy_atoms: int) -> list[Featurized]:
    """Each SMILES' molecule (parsed and standardised as in training: data.molecules.featurize.featurize_smiles;
    where its graph cannot be built, its SMILES view alone: data.molecules.featurize.smiles_view_only), or the
    one-line reason it has neither (runs in a worker process)."""
    return [_featurize_one(item, max_heavy_atoms) for item in smiles]


def _featurize_one(smiles: str, max_heavy_atoms: int) -> Featurized:
    """One SMILES' molecule, its SMILES view alone, or why it has neither. An error RDKit raises on this SMILES
    alone (any exception) is this SMILES' answer, never its batch's."""
    try:
        mol = standardize_mol(parse_smiles(smiles, max_heavy_atoms))
        return Molecule(featurize_mol(mol), morgan_fingerprint(mol))
    except DataValidationError as error:
        reason = str(error)
    except Exception as error:  # noqa: BLE001 - RDKit on arbitrary input: the item fails, not the batch
        reason = f"could not featurise SMILES {smiles[:40]!r}: {type(error).__name__} in RDKit"
    try:
        return Molecule(smiles_view_only(smiles, reason), None)
    except Exception:  # noqa: BLE001 - not SMILES syntax (DataValidationError), or RDKit failing on it
        return reason


def graph_bytes(graph: MolGraph) -> int:
    return sum(a.nbytes for a in (graph.atom_features, graph.edge_index, graph.bond_features, graph.positional,
                                  graph.descriptors))


def molecule_bytes(molecule: Molecule) -> int:
    return graph_bytes(molecule.graph) + (0 if molecule.fingerprint is None else molecule.fingerprint.nbytes)


class FeatureCache:
    """Least recently used SMILES -> Featurized, at most `max_bytes` of graph arrays (0: no cache)."""

    def __init__(self, max_bytes: int):
        self.max_bytes, self.bytes = max_bytes, 0
        self._entries: OrderedDict[str, Featurized] = OrderedDict()

    def get(self, smiles: str) -> Featurized | None:
        value = self._entries.get(smiles)
        if value is not None:
            self._entries.move_to_end(smiles)
        return value

    def put(self, smiles: str, value: Featurized) -> None:
        size = self._size(smiles, value)
        if size > self.max_bytes or smiles in self._entries:
            return
        self._entries[smiles] = value
        self.bytes += size
        while self.bytes > self.max_bytes:
            old, evicted = self._entries.popitem(last=False)
            self.bytes -= self._size(old, evicted)

    @staticmethod
    def _size(smiles: str, value: Featurized) -> int:
        return len(smiles) + (len(value) if isinstance(value, str) else molecule_bytes(value))


class Featurizer:
    """SMILES -> Featurized on `workers` processes (forkserver: safe next to ONNX Runtime's threads).

    Each worker call takes at most `batch_items` SMILES and `batch_chars` characters, one SMILES per waiting
    request in turn, and a request's turn is worth `turn_chars` characters (deficit round robin): a 500-character
    SMILES, which costs tens of drug-like ones, waits a few turns while the short ones of other requests go."""

    def __init__(self, workers: int, batch_items: int, batch_chars: int, turn_chars: int, max_heavy_atoms: int,
                 cache_bytes: int, niceness: int = 0, on_batch: Callable[[int], None] | None = None):
        self.workers, self.max_heavy_atoms, self.niceness = workers, max_heavy_atoms, niceness
        self.cache = FeatureCache(cache_bytes)
        self.batcher = Batcher(self._run, max_items=batch_items, max_bytes=batch_chars, share=1, size_of=len,
                               quantum=turn_chars, concurrency=workers, on_batch=on_batch)
        self._pool: ProcessPoolExecutor | None = None

    def _new_pool(self) -> ProcessPoolExecutor:
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload(["data.molecules.featurize", "models.drift"])
        return ProcessPoolExecutor(self.workers, mp_context=context, initializer=_setup_worker,
                                   initargs=(self.niceness,))

    async def start(self) -> None:
        """Start the workers (each imports RDKit once) before the first request needs them."""
        self._pool = self._new_pool()
        loop = asyncio.get_running_loop()
        await asyncio.gather(*(loop.run_in_executor(self._pool, featurize_many, ["C"], self.max_heavy_atoms)
                               for _ in range(self.workers)))

    async def featurize(self, smiles: Sequence[str]) -> list[Featurized]:
        """One Featurized per SMILES, in order; cached answers are not recomputed."""
        known = [self.cache.get(s) for s in smiles]
        missing = list(dict.fromkeys(s for s, k in zip(smiles, known) if k is None))
        if not missing:
            return known
        answers, _ = await self.batcher.submit(missing)
        found = dict(zip(missing, answers))
        for item, answer in found.items():
            self.cache.put(item, answer)
        return [k if k is not None else found[s] for s, k in zip(smiles, known)]

    async def _run(self, parts: list[Sequence[str]]) -> tuple[list[list[Featurized]], None]:
        flat = [s for part in parts for s in part]
        pool = self._pool
        try:
            out = await asyncio.get_running_loop().run_in_executor(pool, featurize_many, flat, self.max_heavy_atoms)
        except BrokenProcessPool:
            if self._pool is pool:
                self._pool = self._new_pool()
            raise FeaturizerBroken("a featurisation worker process died; retry the request") from None
        results, start = [], 0
        for part in parts:
            results.append(out[start:start + len(part)])
            start += len(part)
        return results, None

    def close(self) -> None:
        """Refuse new work and fail the waiting requests."""
        self.batcher.close()

    async def stop(self) -> None:
        """Close, let the calls in flight finish (one small batch each), and end the worker processes."""
        self.close()
        if self._pool is not None:
            await asyncio.to_thread(self._pool.shutdown, wait=True, cancel_futures=True)
            self._pool = None
