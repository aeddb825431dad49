"""Dtypes across frameworks: one spelling, one kind, and the one table of equivalent dtypes.

PyTorch writes ``torch.bfloat16``, MindSpore ``BFloat16``, numpy ``float32``; :func:`canonical_dtype`
gives one spelling. Two runs may also store the same values in different dtypes: a bool mask in
PyTorch is ``UInt8`` in MindSpore, an index tensor ``int64`` in one and ``int32`` in the other.
:data:`EQUIVALENT` is the table of those: a dtype difference inside one of its classes keeps the
values (the statistics are compared as usual and decide), so it is a *note* on the pair, never a
divergence by itself. Between float widths (fp32 vs bf16) the values change: :func:`dtype_relation`
says ``"precision"`` and the precision-aware rules (:mod:`precnb.analysis.compare.precision`) apply. Every
dtype comparison of the readers and the analyses goes through this module.

Examples
--------
>>> canonical_dtype("torch.float32"), canonical_dtype("Float32"), canonical_dtype("mindspore.BFloat16")
('float32', 'float32', 'bfloat16')
>>> dtype_relation("torch.bool", "UInt8"), dtype_relation("torch.int64", "Int32")
('equivalent', 'equivalent')
>>> dtype_relation("torch.float32", "BFloat16"), dtype_relation("torch.float32", "Int64")
('precision', 'different')
>>> equivalence("torch.bool", "UInt8")
'a bool mask stored as uint8 holds the same 0/1 values'
"""

from __future__ import annotations

from functools import lru_cache
from typing import Final, Literal

__all__ = ["EQUIVALENT", "Relation", "canonical_dtype", "dtype_kind", "dtype_relation", "dtype_size", "equivalence",
           "is_index", "same_values", "weak_identity"]

_ALIASES: Final = {
    "float": "float32", "half": "float16", "double": "float64", "bf16": "bfloat16", "fp16": "float16",
    "fp32": "float32", "fp64": "float64", "long": "int64", "int": "int32", "short": "int16", "bool_": "bool",
    "complex": "complex64", "cfloat": "complex64", "cdouble": "complex128",
}
_INTS: Final = frozenset({"int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"})

#: classes of dtypes that hold the same values: (members, why); a difference inside one is a note, not a finding
EQUIVALENT: Final[tuple[tuple[frozenset[str], str], ...]] = (
    (frozenset({"bool", "uint8"}), "a bool mask stored as uint8 holds the same 0/1 values"),
    (_INTS, "integer widths differ (index tensors are int64 in PyTorch, int32 in MindSpore); the values are exact"),
)
_SIZES: Final = {"float64": 8, "int64": 8, "uint64": 8, "complex64": 8, "complex128": 16, "float32": 4, "int32": 4,
                 "uint32": 4, "float16": 2, "bfloat16": 2, "int16": 2, "uint16": 2, "int8": 1, "uint8": 1, "bool": 1,
                 "float8_e4m3fn": 1, "float8_e5m2": 1, "hifloat8": 1}

Relation = Literal["same", "equivalent", "precision", "different", "unknown"]


@lru_cache(maxsize=4096)
def canonical_dtype(dtype: str) -> str:
    """One spelling of a dtype across frameworks (``torch.float32``, ``Float32``, ``float32`` → ``float32``).

    Examples
    --------
    >>> canonical_dtype("Int64"), canonical_dtype("torch.bool"), canonical_dtype(""), canonical_dtype("torch.half")
    ('int64', 'bool', '', 'float16')
    """
    d = str(dtype or "").strip()
    for pre in ("torch.", "mindspore.", "numpy.", "np.", "ms."):
        if d.lower().startswith(pre):
            d = d[len(pre):]
    d = d.lower().replace(" ", "")
    if d.startswith("<class'") and d.endswith("'>"):
        d = d[7:-2]
    return _ALIASES.get(d, d)


@lru_cache(maxsize=4096)
def dtype_kind(dtype: str) -> str:
    """``"float"``, ``"int"``, ``"bool"``, ``"complex"`` or ``""`` (unknown).

    Examples
    --------
    >>> dtype_kind("BFloat16"), dtype_kind("torch.uint8"), dtype_kind("Bool"), dtype_kind("")
    ('float', 'int', 'bool', '')
    """
    d = canonical_dtype(dtype)
    if d.startswith("complex"):
        return "complex"
    if d.startswith(("float", "bfloat", "hifloat")):
        return "float"
    if d == "bool":
        return "bool"
    return "int" if d in _INTS else ""


def is_index(dtype: str) -> bool:
    """An integer or boolean tensor: indices, counts, masks (msprobe records their Max and Min alone).

    >>> is_index("torch.int64"), is_index("Bool"), is_index("torch.long"), is_index("torch.float32")
    (True, True, True, False)
    """
    return dtype_kind(str(dtype)) in ("int", "bool")


def weak_identity(dtype: str, has_mean: bool) -> bool:
    """Whether equal statistics of two copies say little about their being the same values.

    msprobe records an integer or boolean tensor's Max and Min alone: two masks or index tensors of other values
    share them (a boolean mask: 0 and 1). Equal copies prove identity only with a Mean beside them. The one rule
    the shard merge (counts over each rank's part, indices passed on) and the replica check (an op's integer
    inputs) follow.

    >>> weak_identity("torch.bool", has_mean=False), weak_identity("torch.int64", has_mean=True)
    (True, False)
    >>> weak_identity("torch.float32", has_mean=False)
    False
    """
    return is_index(dtype) and not has_mean


@lru_cache(maxsize=4096)
def equivalence(a: str, b: str) -> str | None:
    """Why two different dtypes hold the same values (the :data:`EQUIVALENT` class), or None.

    Examples
    --------
    >>> equivalence("torch.int64", "Int32")[:20], equivalence("torch.float32", "BFloat16")
    ('integer widths diffe', None)
    """
    ca, cb = canonical_dtype(a), canonical_dtype(b)
    for members, why in EQUIVALENT:
        if ca in members and cb in members:
            return why
    return None


@lru_cache(maxsize=4096)
def dtype_relation(a: str, b: str) -> Relation:
    """How two dtypes relate: same, equivalent, precision, different or unknown.

    ``same`` once canonical; ``equivalent`` inside a class of :data:`EQUIVALENT`; ``precision``
    between two float widths; ``unknown`` when either is empty; else ``different``.

    Examples
    --------
    >>> dtype_relation("BFloat16", "torch.bfloat16"), dtype_relation("", "torch.float32")
    ('same', 'unknown')
    """
    ca, cb = canonical_dtype(a), canonical_dtype(b)
    if not ca or not cb:
        return "unknown"
    if ca == cb:
        return "same"
    if equivalence(ca, cb) is not None:
        return "equivalent"
    if dtype_kind(ca) == dtype_kind(cb) == "float":
        return "precision"
    return "different"


def same_values(a: str, b: str) -> bool:
    """True when a difference between *a* and *b* cannot change values (the same dtype, or equivalent).

    Examples
    --------
    >>> same_values("Bool", "torch.bool"), same_values("torch.bool", "UInt8"), same_values("Float32", "Float16")
    (True, True, False)
    """
    return dtype_relation(a, b) in ("same", "equivalent")


def dtype_size(dtype: str) -> int:
    """Bytes per element of a torch / MindSpore / numpy dtype name (4 when unknown).

    Examples
    --------
    >>> dtype_size("torch.bfloat16"), dtype_size("Float32"), dtype_size("UInt8"), dtype_size("?")
    (2, 4, 1, 4)
    """
    return _SIZES.get(canonical_dtype(dtype), 4)
