"""The molecular property model as the service serves it: SMILES in, per SMILES a value (regression) or
probability (classification) with its uncertainty, the views it was answered from and its applicability domain
out. SMILES become graphs in worker processes (serving/families/molecule/featurizing.py)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from fastapi import APIRouter, Query, Request, Response

from models.predictors import MoleculePredictor
from serving.deadline import within_deadline
from serving.errors import error_responses
from serving.families.molecule.depict import Depicter
from serving.families.molecule.domain import assess, unusable
from serving.families.molecule.featurizing import Featurizer, Molecule, molecule_bytes
from serving.families.molecule.monitoring import domain_report
from serving.families.molecule.schemas import MoleculeRequest, MoleculeResponse
from serving.family import Prepared, ServedFamily, register_family
from serving.inputs import BadInput
from serving.loading import LoadedModel
from serving.log_rows import Answered, MoleculesRecord


def _number(value: float) -> float | None:
    return value if math.isfinite(value) else None


def check_smiles(smiles: Sequence[str], max_length: int) -> list[str]:
    """`smiles` when each is at most `max_length` characters (BadInput naming the first that is not)."""
    for i, item in enumerate(smiles):
        if len(item) > max_length:
            raise BadInput(f"smiles[{i}] is {len(item)} characters long; at most {max_length} "
                           f"(SERVING_MAX_SMILES_LENGTH)")
    return list(smiles)


def answer_key(model: LoadedModel) -> str:
    """`value` for a regression model, `probability` for a classifier."""
    return "value" if model.card.task == "regression" else "probability"


@register_family
class MoleculeFamily(ServedFamily):
    """`value` (regression) or `probability` (classification) and `uncertainty` per SMILES, or its `error` (one
    that does not parse, or has more than SERVING_MAX_HEAVY_ATOMS heavy atoms)."""

    name = "molecule"
    predictor = MoleculePredictor
    request, response = MoleculeRequest, MoleculeResponse
    items_name, tensor_name = "SMILES", "smiles"

    def __init__(self, settings, metrics):
        super().__init__(settings, metrics)
        self.featurizer = Featurizer(settings.featurize_workers, settings.featurize_batch_items,
                                     settings.featurize_batch_chars, settings.featurize_turn_chars,
                                     settings.max_heavy_atoms, settings.feature_cache_mb * 2**20,
                                     settings.featurize_niceness,
                                     on_batch=metrics.batch_items.labels("featurize").observe)
        self.depicter = Depicter(settings.depict_workers, settings.max_heavy_atoms)

    def check_smiles(self, smiles: Sequence[str]) -> list[str]:
        return check_smiles(smiles, self.settings.max_smiles_length)

    def items(self, body: MoleculeRequest, model: LoadedModel) -> list[str]:
        self.check_count(len(body.smiles))
        return self.check_smiles(body.smiles)

    def tensor_spec(self, model: LoadedModel) -> tuple[str, list[int], str]:
        return "BYTES", [], "n SMILES"

    def tensor_items(self, values: list[str], model: LoadedModel) -> list[str]:
        return self.check_smiles(values)

    def output_types(self, model: LoadedModel) -> dict[str, str]:
        return {answer_key(model): "FP32", "uncertainty": "FP32", "error": "BYTES"}

    def size_of(self, molecule: Molecule) -> int:
        return molecule_bytes(molecule)

    def failed_answers(self, items: list[str]) -> list[dict]:
        return [{"smiles": s, "canonical_smiles": None} for s in items]

    async def preprocess(self, items: list[str], model: LoadedModel) -> Prepared:
        """The featurised molecules go to the graph; the state is each SMILES' Molecule or why it has none."""
        featurized = await self.featurizer.featurize(items)
        return Prepared([f for f in featurized if not isinstance(f, str)], featurized)

    def predict(self, model: LoadedModel, parts: list[list[Molecule]]) -> list[tuple]:
        """Per molecule (prediction, uncertainty, modality, error, applicability domain)."""
        molecules = [m for part in parts for m in part]
        out = model.predictor.predict_graphs([m.graph for m in molecules])
        domains = [{}] * len(molecules)
        placed = [i for i, m in enumerate(molecules) if m.fingerprint is not None]  # a SMILES view alone has no domain
        if placed and unusable(model.reference) is None:
            found = assess(model.reference, np.stack([molecules[i].fingerprint for i in placed]),
                           np.stack([molecules[i].graph.descriptors for i in placed]),
                           self.settings.monitor_min_similarity)
            for i, domain in zip(placed, found):
                domains[i] = domain
        return list(zip(out["prediction"].tolist(), out["uncertainty"].tolist(), out["modality"].tolist(),
                        out["error"], domains))

    def postprocess(self, items: list[str], prepared: Prepared, outputs: list, model: LoadedModel) -> list[dict]:
        key, rows, answered = answer_key(model), [], iter(outputs)
        for item, molecule in zip(items, prepared.state):
            if isinstance(molecule, str):
                rows.append({"smiles": item, "error": molecule})
                continue
            value, uncertainty, modality, error, domain = next(answered)
            if error is not None:
                rows.append({"smiles": item, "error": error})
                continue
            row = {"smiles": item, "canonical_smiles": molecule.graph.smiles, key: _number(value),
                   "uncertainty": _number(uncertainty), "modality": modality, **domain}
            rows.append({k: v for k, v in row.items() if v is not None})
        return rows

    def log_record(self, items: list[str], answers: list[dict], model: LoadedModel,
                   answered: Answered) -> MoleculesRecord:
        return MoleculesRecord(answered, answers)

    def input_report(self, model: LoadedModel, rows: Sequence[dict]) -> tuple[str, dict | None, str | None]:
        why = unusable(model.reference)
        if why is not None:
            return "domain", None, f"no applicability domain: {why}"
        return "domain", domain_report(rows, self.settings), None

    def routers(self, model_of) -> list[APIRouter]:
        router = APIRouter()

        @router.get("/molecule/depict", tags=["predict"], response_class=Response,
                    responses={200: {"content": {"image/svg+xml": {"schema": {"type": "string"}}}},
                               **error_responses(422, 503, 504)})
        async def depict(request: Request, smiles: str = Query(...)) -> Response:
            """The molecule drawn by RDKit, as SVG (422 for a SMILES that does not parse, or has more than
            SERVING_MAX_HEAVY_ATOMS heavy atoms). Drawn in a separate process, SERVING_DEPICT_WORKERS at a time."""
            self.check_smiles([smiles])
            svg = await within_deadline(request, self.depicter.svg(smiles), self.settings.request_timeout_s)
            return Response(svg, media_type="image/svg+xml")

        return [router]

    async def start(self) -> None:
        await self.featurizer.start()

    def close(self) -> None:
        self.featurizer.close()

    async def stop(self) -> None:
        await self.featurizer.stop()
        await self.depicter.stop()
