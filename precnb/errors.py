"""Exceptions raised by precnb.

All errors that concern user input derive from :class:`PrecnbError`, so the CLI can turn
them into a one-line message and exit code 1 without a traceback.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["DumpFormatError", "NotADumpError", "PrecnbError", "UnsafeFileError"]


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
