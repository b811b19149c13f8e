"""2D drawings of molecules as SVG, by RDKit, in worker processes: RDKit holds the GIL while it draws, so a
drawing in the service's own process (even in a thread) would hold up every other request."""

from __future__ import annotations

import asyncio
import multiprocessing
import signal
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool

from rdkit.Chem.Draw import rdMolDraw2D

from data.molecules.standardize import InvalidSmilesError, parse_smiles
from serving.errors import RetryLater
from serving.inputs import BadInput


class DepictionBroken(RetryLater):
    """The drawing process died (it is replaced); the request should be retried."""


def _ignore_interrupts() -> None:
    """Ctrl-C reaches the whole process group: the worker leaves it to the service, which shuts it down."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def molecule_svg(smiles: str, max_heavy_atoms: int, width: int = 320, height: int = 240) -> tuple[str | None, str]:
    """(the SVG, "") or (None, why the SMILES cannot be drawn); a molecule over `max_heavy_atoms` is refused
    before any drawing, so one drawing takes a bounded time."""
    try:
        mol = parse_smiles(smiles, max_heavy_atoms=max_heavy_atoms)
    except InvalidSmilesError as error:
        return None, str(error)
    drawer = rdMolDraw2D.MolDraw2DSVG(width, height)
    rdMolDraw2D.PrepareAndDrawMolecule(drawer, mol)
    drawer.FinishDrawing()
    return drawer.GetDrawingText(), ""


class Depicter:
    """Draws on `workers` processes (forkserver: safe next to ONNX Runtime's threads), at most `workers` at a
    time; later requests wait in line, and one whose caller is cancelled (deadline, disconnect) leaves the line.
    The processes start with the first drawing."""

    def __init__(self, workers: int, max_heavy_atoms: int):
        self.workers, self.max_heavy_atoms = workers, max_heavy_atoms
        self._pool: ProcessPoolExecutor | None = None

    def _new_pool(self) -> ProcessPoolExecutor:
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload(["serving.families.molecule.depict"])
        return ProcessPoolExecutor(self.workers, mp_context=context, initializer=_ignore_interrupts)

    async def svg(self, smiles: str) -> str:
        """The drawing; BadInput when the SMILES does not parse or is too large, DepictionBroken when the
        drawing process died."""
        if self._pool is None:
            self._pool = self._new_pool()
        pool = self._pool
        try:
            svg, problem = await asyncio.get_running_loop().run_in_executor(
                pool, molecule_svg, smiles, self.max_heavy_atoms)
        except BrokenProcessPool:
            if self._pool is pool:
                self._pool = self._new_pool()
            raise DepictionBroken("the drawing process died; retry the request") from None
        if svg is None:
            raise BadInput(problem)
        return svg

    async def stop(self) -> None:
        """End the drawing processes (drawings not started are cancelled)."""
        if self._pool is not None:
            pool, self._pool = self._pool, None
            await asyncio.to_thread(pool.shutdown, wait=True, cancel_futures=True)
