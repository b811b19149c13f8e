"""Atom-level SMILES tokenizer (regex, numpy-free), shared by training and serving.

Tokens: bracket atoms (`[nH]`, `[C@@H]`, `[O-]`), two-letter organic-subset elements (`Cl`, `Br`), one-letter
atoms (aliphatic and aromatic), ring-bond digits (`1`, and `%nn` for rings above 9), branches `(` `)`,
bonds `- = # $ : / \\`, dots and `*`. Joining the tokens gives back the SMILES exactly; a SMILES with
characters outside this grammar is an error naming the character.

The vocabulary is built from training SMILES; special tokens come first, [PAD] is 0. `encode` puts [CLS]
first and [SEP] last; a SMILES whose tokens (with those two) exceed `max_length` is an error that says so.
Bump TOKENIZER_VERSION whenever the regex or the special tokens change.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable

import numpy as np

from data.errors import DataValidationError

TOKENIZER_VERSION = "1"
PAD, UNK, CLS, SEP, MASK = "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"
SPECIAL_TOKENS = [PAD, UNK, CLS, SEP, MASK]
PAD_ID, UNK_ID, CLS_ID, SEP_ID, MASK_ID = range(len(SPECIAL_TOKENS))

SMILES_PATTERN = re.compile(
    r"(\[[^\[\]]+\]"          # bracket atom
    r"|Br|Cl"                 # two-letter organic-subset elements
    r"|%\d{2}"                # ring-bond number >= 10
    r"|[BCNOPSFI]|[bcnops]"   # one-letter atoms, aliphatic and aromatic
    r"|\d"                    # ring-bond digit
    r"|[()=#$:/\\.\-+~@?>*])"  # branches, bonds, dot, wildcard and the rest of SMILES' punctuation
)


class SmilesTokenError(DataValidationError):
    """A SMILES that cannot be tokenised, or that is longer than the tokenizer's maximum length."""


def tokenize(smiles: str) -> list[str]:
    """Tokens of `smiles`; "".join(tokens) == smiles. Raises SmilesTokenError for characters outside SMILES."""
    tokens, position = [], 0
    for match in SMILES_PATTERN.finditer(smiles):
        if match.start() != position:
            break
        tokens.append(match.group(0))
        position = match.end()
    if position != len(smiles):
        raise SmilesTokenError(f"cannot tokenise SMILES {smiles!r}: unexpected {smiles[position]!r} at position {position}")
    return tokens


class SmilesTokenizer:
    """Vocabulary (special tokens first) and maximum length (including [CLS] and [SEP])."""

    def __init__(self, vocabulary: list[str], max_length: int):
        if vocabulary[: len(SPECIAL_TOKENS)] != SPECIAL_TOKENS:
            raise ValueError(f"vocabulary must start with {SPECIAL_TOKENS}")
        if max_length < 3:
            raise ValueError("max_length must leave room for [CLS], one token and [SEP]")
        self.vocabulary = list(vocabulary)
        self.max_length = int(max_length)
        self.ids = {token: i for i, token in enumerate(self.vocabulary)}

    @classmethod
    def build(cls, smiles: Iterable[str], max_length: int, min_count: int = 1) -> SmilesTokenizer:
        """Vocabulary of the tokens seen at least `min_count` times in `smiles`, most frequent first (ties: alphabetical)."""
        counts = Counter(token for s in smiles for token in tokenize(s))
        kept = sorted((t for t, c in counts.items() if c >= min_count), key=lambda t: (-counts[t], t))
        return cls([*SPECIAL_TOKENS, *kept], max_length)

    def __len__(self) -> int:
        return len(self.vocabulary)

    def encode(self, smiles: str) -> np.ndarray:
        """int64 ids ([CLS], tokens..., [SEP]); unknown tokens -> [UNK]. Raises SmilesTokenError when too long."""
        tokens = tokenize(smiles)
        if len(tokens) + 2 > self.max_length:
            raise SmilesTokenError(
                f"SMILES {smiles[:40]!r}{'...' if len(smiles) > 40 else ''} has {len(tokens)} tokens; the tokenizer "
                f"takes at most {self.max_length - 2} (max_length {self.max_length} includes [CLS] and [SEP])"
            )
        return np.array([CLS_ID, *(self.ids.get(t, UNK_ID) for t in tokens), SEP_ID], dtype=np.int64)

    def decode(self, ids: Iterable[int]) -> str:
        """SMILES text of `ids`, special tokens left out ([UNK] kept as '[UNK]')."""
        return "".join(self.vocabulary[i] for i in ids if i not in (PAD_ID, CLS_ID, SEP_ID, MASK_ID))

    def to_dict(self) -> dict:
        return {"version": TOKENIZER_VERSION, "vocabulary": self.vocabulary, "max_length": self.max_length}

    @classmethod
    def from_dict(cls, state: dict) -> SmilesTokenizer:
        if state.get("version") != TOKENIZER_VERSION:
            raise ValueError(f"tokenizer version {state.get('version')} is not this code's {TOKENIZER_VERSION}")
        return cls(state["vocabulary"], state["max_length"])


def pad_tokens(sequences: list[np.ndarray | None]) -> np.ndarray:
    """(G, T) int64 of the id sequences padded with [PAD]; None (no SMILES for that molecule) -> all [PAD].
    T is the longest sequence (at least 1)."""
    length = max([1, *(len(s) for s in sequences if s is not None)])
    out = np.full((len(sequences), length), PAD_ID, dtype=np.int64)
    for row, seq in enumerate(sequences):
        if seq is not None:
            out[row, : len(seq)] = seq
    return out
