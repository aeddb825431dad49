"""Exceptions raised by precnb.

All errors that concern user input derive from :class:`PrecnbError`, so the CLI can turn
them into a one-line message and exit code 1 without a traceback.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["DumpFormatError", "InsufficientMemoryError", "NotADumpError", "OutputExistsError", "OutputRefusedError",
           "PrecnbError", "UnsafeFileError"]


class PrecnbError(Exception):
    """Base class for errors about user input (unreadable or unrecognised data)."""


class DumpFormatError(PrecnbError):
    """A file exists but cannot be read as the format it claims to be.

    Parameters
    ----------
    path : str or Path
        The offending file.
    message : str
        What is wrong, including the position where known.
    """

    def __init__(self, path: str | Path, message: str) -> None:
        self.path = str(path)
        self.message = message
        super().__init__(f"{self.path}: {message}")


class NotADumpError(PrecnbError):
    """A path holds nothing precnb can read."""


class UnsafeFileError(PrecnbError):
    """A tensor file would need unpickling of arbitrary objects and was refused."""


class OutputRefusedError(PrecnbError):
    """precnb refused to write an output (it would replace or land in something it did not create).

    Parameters
    ----------
    path : str or Path
        The output asked for.
    why : str
        The reason, one line.
    """

    def __init__(self, path: str | Path, why: str) -> None:
        self.path = str(path)
        self.why = why
        super().__init__(f"refusing to write {self.path}: {why}")


class OutputExistsError(OutputRefusedError, FileExistsError):
    """The output exists (and ``overwrite`` was not given): also a :class:`FileExistsError`."""


class InsufficientMemoryError(PrecnbError, MemoryError):
    """A load would need more memory than is available (raised before parsing, naming what to load less of)."""
