"""The reader registry: every input format is one :class:`Reader`.

:func:`precnb.open_run`, format detection (:func:`precnb.detect_format`), the command line's
``--format`` choices, :func:`precnb.available_steps`, :func:`precnb.to_zarr`'s streaming and the
xarray engines (``xr.open_dataset(path, engine="precnb_msprobe")``) all read this registry.

Built-in readers are named here with the module that defines them, so listing the names
imports no reader. Third-party readers are found through the ``precnb.readers`` entry-point
group: a package declares, in its ``pyproject.toml``::

    [project.entry-points."precnb.readers"]
    myformat = "mypkg.precnb_reader:READER"

where ``READER`` is a :class:`Reader` (or a function returning one). A plug-in that cannot be
imported, is not a reader, reuses a built-in name or whose test fails is skipped with a warning;
it never stops precnb from reading anything else. :func:`register` adds a reader at run time.
:data:`REGISTRY` is one instance of the generic :class:`precnb._plugins.PluginRegistry`.

Examples
--------
>>> reader_names()[:7]
('msprobe', 'monitor', 'kernel', 'kernel_tensors', 'compare', 'config_check', 'zarr')
>>> get_reader("msprobe").can_open("/nonexistent")
False
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from precnb._plugins import PluginRegistry

__all__ = ["BUILTIN", "ENTRY_POINT_GROUP", "REGISTRY", "Reader", "get_reader", "reader_names", "readers", "refresh",
           "register", "unregister"]

ENTRY_POINT_GROUP = "precnb.readers"

#: built-in readers in listing order (``--format`` choices, messages): name → "module:attribute"
BUILTIN: dict[str, str] = {
    "msprobe": "precnb.io.msprobe:READER",
    "monitor": "precnb.io.monitor:READER",
    "kernel": "precnb.io.kernel:READER",
    "kernel_tensors": "precnb.io.ms_kernel_tensors:READER",
    "compare": "precnb.io.compare_csv:READER",
    "config_check": "precnb.io.config_check:READER",
    "zarr": "precnb.io.store:READER",
}


@dataclass(frozen=True)
class Reader:
    """One input format.

    Parameters
    ----------
    name : str
        The format's name (``--format NAME``, ``open_run(path, format=NAME)``, xarray engine
        ``precnb_NAME``).
    can_open : callable
        ``can_open(path) -> bool``: whether *path* is of this format. Cheap (reads at most a
        file's head), never raises.
    open : callable
        ``open(path, *, steps, ranks, errors, client, progress, workers, lazy, **_) ->
        xarray.Dataset``: the canonical dataset (:mod:`precnb.schema`). Readers ignore options
        they have no use for (accept ``**_``).
    description : str
        What the format is, for messages (``"an msprobe dump"``).
    available_steps : callable, optional
        ``available_steps(path, ranks) -> list[int]``: the steps, without parsing any file;
        omitted when the steps are only known by reading the files.
    stream : callable, optional
        ``stream(path, *, steps, ranks, errors, client, progress, workers)`` yielding
        ``("ranks", ranks)``, then ``("step", step, arrays, tensor_coords)`` per step, then
        ``("attrs", attrs)``: lets :func:`precnb.to_zarr` write a run one step at a time.
    detect_priority : int
        Detection tries readers in increasing priority (built-ins 0-50, plug-ins 100 by default).
    lazy : bool
        Whether ``open(..., lazy=True)`` returns a dask-backed dataset itself (else the result
        is chunked one step at a time).
    node_records : callable, optional
        ``node_records(path, step, rank, nodes) -> {node: record}``: the raw records of a few
        named nodes at one (step, rank), as the file holds them (the scalar arguments the
        dataset does not carry); omitted when the format has no such records.
    """

    name: str
    can_open: Callable[[Path], bool]
    open: Callable[..., Any]
    description: str = ""
    available_steps: Callable[..., list[int] | None] | None = None
    stream: Callable[..., Iterator[tuple[Any, ...]]] | None = None
    detect_priority: int = 100
    lazy: bool = False
    node_records: Callable[..., dict[str, Any]] | None = None

    def detects(self, path: Path) -> bool:
        """``can_open(path)``, False (with a warning) when the test itself fails."""
        try:
            return bool(self.can_open(path))
        except Exception as exc:  # a plug-in's bug must not stop detection
            warnings.warn(f"precnb reader {self.name!r}: its format test failed on {path}: "
                          f"{type(exc).__name__}: {exc}; skipped", RuntimeWarning, stacklevel=3)
            return False


def _as_reader(obj: Any, name: str) -> Reader:
    if not isinstance(obj, Reader) and callable(obj) and not hasattr(obj, "can_open"):
        obj = obj()
    if not isinstance(obj, Reader):
        raise TypeError(f"not a precnb.io.readers.Reader but {type(obj).__name__}")
    if obj.name != name:
        raise TypeError(f"declares the name {obj.name!r}")
    return obj


#: the readers: an instance of the generic registry (:mod:`precnb._plugins`)
REGISTRY: PluginRegistry[Reader] = PluginRegistry(ENTRY_POINT_GROUP, kind="reader", builtins=BUILTIN,
                                                  convert=_as_reader, builtin_word="format")


def reader_names() -> tuple[str, ...]:
    """Names of every reader: built-ins, then registered, then plug-ins (not imported to list them)."""
    return REGISTRY.names()


def get_reader(name: str) -> Reader:
    """The reader called *name*.

    Raises
    ------
    ValueError
        When no reader has that name (the message lists them).
    """
    try:
        return REGISTRY.get(name)
    except KeyError:
        raise ValueError(f"unknown format {name!r}; expected one of {', '.join(reader_names())}") from None


def readers() -> list[Reader]:
    """Every reader that loads, in detection order (broken plug-ins left out, with a warning)."""
    return sorted((r for _, r in REGISTRY.items()), key=lambda r: r.detect_priority)


def register(reader: Reader) -> Reader:
    """Add *reader* for this process (e.g. in a notebook, or a test); returns it.

    Raises
    ------
    ValueError
        When the name is a built-in one.
    """
    return REGISTRY.register(reader.name, reader, replace=True)


def unregister(name: str) -> None:
    """Remove a reader added with :func:`register`."""
    REGISTRY.unregister(name)


def refresh() -> None:
    """Forget the plug-ins found so far (after installing one in a running kernel, say)."""
    REGISTRY.refresh()


def describe(names: Sequence[str] | None = None) -> str:
    """``"an msprobe dump, monitor output, ... or precnb zarr store"`` for messages."""
    descs = []
    for name in names or reader_names():
        try:
            desc = get_reader(name).description  # "": described with another reader (kernel_tensors)
        except ValueError:
            continue
        if desc:
            descs.append(desc)
    return descs[0] if len(descs) == 1 else f"{', '.join(descs[:-1])} or {descs[-1]}"
