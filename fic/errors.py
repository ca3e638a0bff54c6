"""User-facing errors.

A `FicError` is bad input (a file, a record, a config key) rather than a bug: the CLI prints
it on one line and exits with status 2. Everything else is a bug and keeps its traceback.
"""

from __future__ import annotations


class FicError(Exception):
    """Bad input the user can fix. `str()` reads `path: record N: field 'x': what was expected`."""

    def __init__(self, message: str, *, path: str | None = None, record: int | str | None = None,
                 field: str | None = None):
        self.message, self.path, self.record, self.field = message, path, record, field
        super().__init__(self.__str__())

    def __str__(self) -> str:
        where = []
        if self.path is not None:
            where.append(str(self.path))
        if self.record is not None:
            where.append(f"record {self.record}")
        if self.field is not None:
            where.append(f"field '{self.field}'")
        return ": ".join(where + [self.message])
