"""Reading CSV files with errors that name the file and say what is wrong (a malformed or a truncated line)."""

from __future__ import annotations

import csv
import gzip
from pathlib import Path

import pandas as pd

from data.errors import DataValidationError


def read_csv_checked(path: Path, sep: str = ",", header: int | None = 0) -> pd.DataFrame:
    """pd.read_csv that names a malformed line (a row with too many fields) and a truncated last line (fewer
    fields than the header: pandas would fill them with NaN) instead of passing them on."""
    try:
        frame = pd.read_csv(path, sep=sep, header=header)
    except pd.errors.ParserError as exc:
        reason = str(exc).strip().splitlines()[-1].split("C error: ")[-1]  # "Expected 4 fields in line 3, saw 5"
        raise DataValidationError(f"malformed CSV: {reason}", file=path) from exc
    except Exception as exc:  # encoding, compression and I/O errors
        raise DataValidationError(f"cannot read the file: {exc}", file=path) from exc
    if len(frame) and frame.iloc[-1].isna().any():
        fields = _fields(_last_line(path), sep)
        if fields < frame.shape[1]:
            raise DataValidationError(
                f"the last line (row {len(frame) - 1}) has {fields} of {frame.shape[1]} fields: the file looks truncated",
                file=path)
    return frame


def _last_line(path: Path) -> str:
    """The last non-blank line of a text file (.gz read through gzip)."""
    opener = gzip.open if path.suffix.lower() == ".gz" else open
    last = ""
    with opener(path, "rt", newline="") as f:
        for line in f:
            if line.strip():
                last = line
    return last


def _fields(line: str, sep: str) -> int:
    """Number of fields of one CSV line (whitespace-separated when `sep` is the regex for whitespace)."""
    if sep == r"\s+":
        return len(line.split())
    return len(next(csv.reader([line], delimiter=sep), []))
