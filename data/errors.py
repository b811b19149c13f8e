"""The one error type the data layer raises for bad input."""

from __future__ import annotations

from pathlib import Path


class DataValidationError(ValueError):
    """Bad input data: says what is wrong and where (file and column when known).

    >>> str(DataValidationError("not numeric", file="fleet.csv", column="temp"))
    "fleet.csv: column 'temp': not numeric"
    """

    def __init__(self, message: str, *, file: str | Path | None = None, column: str | None = None):
        self.message = message
        self.file = str(file) if file is not None else None
        self.column = column
        where = []
        if self.file:
            where.append(self.file)
        if column:
            where.append(f"column '{column}'")
        super().__init__(": ".join([*where, message]))
