"""The atom-level SMILES tokenizer: grammar, round trips, vocabulary, length limit, serialisation."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from data.molecules.featurize import batch_inputs, encode_tokens, featurize_smiles
from data.molecules.standardize import canonical_smiles
from data.molecules.tokenizer import (
    CLS_ID,
    PAD_ID,
    SEP_ID,
    SPECIAL_TOKENS,
    UNK_ID,
    SmilesTokenError,
    SmilesTokenizer,
    pad_tokens,
    tokenize,
)


@pytest.mark.parametrize("smiles, tokens", [
    ("CCO", ["C", "C", "O"]),
    ("ClCBr", ["Cl", "C", "Br"]),
    ("c1cc[nH]c1", ["c", "1", "c", "c", "[nH]", "c", "1"]),
    ("C[N+](C)(C)C", ["C", "[N+]", "(", "C", ")", "(", "C", ")", "C"]),
    ("F/C=C/F", ["F", "/", "C", "=", "C", "/", "F"]),
    ("C#N", ["C", "#", "N"]),
    ("C%12CC%12", ["C", "%12", "C", "C", "%12"]),
    ("[C@@H](O)(N)S", ["[C@@H]", "(", "O", ")", "(", "N", ")", "S"]),
    ("[Na+].[Cl-]", ["[Na+]", ".", "[Cl-]"]),
    ("Sc1ccccc1", ["S", "c", "1", "c", "c", "c", "c", "c", "1"]),
])
def test_tokens_of_hand_checked_smiles(smiles, tokens):
    assert tokenize(smiles) == tokens


def test_every_esol_smiles_round_trips(shared_data):
    raw = pd.read_csv(shared_data / "esol" / "delaney-processed.csv")["smiles"].str.strip()
    assert len(raw) == 1128
    for smiles in raw:
        assert "".join(tokenize(smiles)) == smiles
        canonical = canonical_smiles(smiles)
        assert "".join(tokenize(canonical)) == canonical
    tokenizer = SmilesTokenizer.build(raw, max_length=256)
    for smiles in raw:
        ids = tokenizer.encode(smiles)
        assert ids[0] == CLS_ID and ids[-1] == SEP_ID and UNK_ID not in ids
        assert tokenizer.decode(ids) == smiles


def test_characters_outside_smiles_are_an_error_naming_them():
    with pytest.raises(SmilesTokenError, match="unexpected 'x' at position 2"):
        tokenize("CCxC")
    with pytest.raises(SmilesTokenError, match="unexpected ' '"):
        tokenize("CC O")


def test_vocabulary_specials_first_and_unknown_tokens():
    tokenizer = SmilesTokenizer.build(["CCO", "CCN", "CC(C)C"], max_length=16)
    assert tokenizer.vocabulary[: len(SPECIAL_TOKENS)] == SPECIAL_TOKENS and PAD_ID == 0
    assert tokenizer.vocabulary[len(SPECIAL_TOKENS)] == "C"  # most frequent first
    ids = tokenizer.encode("CClO")  # Cl never seen in training
    assert ids.tolist() == [CLS_ID, tokenizer.ids["C"], UNK_ID, tokenizer.ids["O"], SEP_ID]
    assert tokenizer.decode(ids) == "C[UNK]O"


def test_over_long_smiles_is_an_error_that_says_so():
    tokenizer = SmilesTokenizer.build(["CCO"], max_length=8)
    assert len(tokenizer.encode("CCCCCC")) == 8  # 6 tokens + [CLS] + [SEP] fit exactly
    with pytest.raises(SmilesTokenError, match=r"has 7 tokens; the tokenizer takes at most 6 \(max_length 8"):
        tokenizer.encode("CCCCCCC")


def test_serialisation_round_trip_and_version_check():
    tokenizer = SmilesTokenizer.build(["CCO", "c1ccccc1Cl"], max_length=32)
    again = SmilesTokenizer.from_dict(tokenizer.to_dict())
    assert again.vocabulary == tokenizer.vocabulary and again.max_length == 32
    np.testing.assert_array_equal(again.encode("ClCCO"), tokenizer.encode("ClCCO"))
    with pytest.raises(ValueError, match="version"):
        SmilesTokenizer.from_dict({**tokenizer.to_dict(), "version": "0"})


def test_padding_and_over_long_molecules_fall_back_to_the_graph():
    tokenizer = SmilesTokenizer.build(["CCO", "CCCCCCCCCC"], max_length=8)
    graphs = [featurize_smiles(s) for s in ("CCO", "CCCCCCCCCC", "C")]
    tokens = encode_tokens(graphs, tokenizer)
    assert tokens[1] is None and len(tokens[0]) == 5 and len(tokens[2]) == 3
    padded = pad_tokens(tokens)
    assert padded.shape == (3, 5) and (padded[1] == PAD_ID).all() and padded[2, 3:].tolist() == [PAD_ID, PAD_ID]
    arrays = batch_inputs(graphs, tokens)
    np.testing.assert_array_equal(arrays["tokens"], padded)
    assert arrays["atom_mask"].shape == (3, 10) and arrays["atom_mask"].sum(axis=1).tolist() == [3, 10, 1]
