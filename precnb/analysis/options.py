"""A diagnosis's own options: a frozen dataclass whose fields say their default, help text and CLI flag.

A diagnosis declares them (:attr:`precnb.analysis.registry.Diagnosis.options`); :class:`precnb.pipeline.Options`
routes every keyword it does not hold itself (loading and pairing) to the diagnoses that declare it, the
diagnosis's generated subcommand has a flag for each (:mod:`precnb.cli.generated`), and the diagnosis reads them
as ``ctx.options[kind]``.

Examples
--------
>>> option_owners()["limit"]    # one option of several diagnoses: a keyword reaches each
['replica_mismatch', 'loss_spike', 'anomaly']
"""

from __future__ import annotations

from dataclasses import Field, field, fields
from typing import Any

from precnb.analysis.registry import diagnoses

__all__ = ["option", "option_fields", "option_owners", "suspects_limit"]


def option(default: Any = None, *, help: str, flag: str | None = None, compare: bool = True,
           **argparse_kw: Any) -> Any:
    """A field of a diagnosis's options dataclass (:attr:`Diagnosis.options`).

    Parameters
    ----------
    default
        Its value when not given.
    help : str
        What it does, in words (the CLI flag's help).
    flag : str, optional
        Its CLI flag on the diagnosis's generated subcommand (default ``--<name with dashes>``).
    compare : bool
        False for data or a path (a dataset, a table): never compared by value, described as a source.
    **argparse_kw
        Passed to ``argparse`` for the flag (``type``, ``metavar``, ``action``, ``nargs``, ``choices``); ``type`` is
        made a validating one by the CLI: ``int`` and ``float`` (finite), or by name ``"positive"`` (a finite
        number >= 0), ``"count"`` (an integer >= 0), ``"folder"`` (an existing folder)
        (:data:`precnb.cli.generated.TYPES`).

    Examples
    --------
    >>> from dataclasses import dataclass, fields
    >>> @dataclass(frozen=True)
    ... class MyOptions:
    ...     threshold: float = option(3.0, help="how far is too far", type=float)
    >>> fields(MyOptions)[0].metadata["help"]
    'how far is too far'
    """
    return field(default=default, compare=compare, metadata={"help": help, "flag": flag, "argparse": argparse_kw})


def suspects_limit() -> Any:
    """The ``limit`` option (``--limit``) of a diagnosis whose finding lists further suspects (50 by default).

    The anomaly search, the replica check and the loss-spike diagnosis each declare it; ``limit=`` given to
    :class:`precnb.pipeline.Options` reaches all three.
    """
    return option(50, help="how many further suspects to list", type="count")


def option_fields() -> dict[str, Field[Any]]:
    """Every diagnosis option by name (the first diagnosis, by priority, that declares a name gives its field)."""
    out: dict[str, Field[Any]] = {}
    for d in diagnoses():
        for f in fields(d.options) if d.options is not None else ():
            out.setdefault(f.name, f)
    return out


def option_owners() -> dict[str, list[str]]:
    """Every diagnosis option by name: the kinds of the diagnoses that declare it (a keyword goes to each)."""
    out: dict[str, list[str]] = {}
    for d in diagnoses():
        for f in fields(d.options) if d.options is not None else ():
            out.setdefault(f.name, []).append(d.kind)
    return out
