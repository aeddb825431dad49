"""Python source for the arguments of one dumped API record (literals only), for :mod:`precnb.repro`.

Every value of dump.json becomes a literal, ``T('<file>')`` (a saved tensor), ``DEVICE``, or a
fixed torch constant (a dtype or memory format from a closed list): no name from the dump ever
becomes code. Anything else — including a malformed record (a slice of strings, a size of
floats, a nesting deeper than msprobe writes) — raises :class:`ReproError` naming the argument.

Examples
--------
>>> render_args({"input_args": [{"type": "torch.Tensor", "data_name": "x.pt"}, {"type": "int", "value": 2}],
...              "input_kwargs": {"keepdim": {"type": "bool", "value": True}}})
(["T('x.pt')", '2'], {'keepdim': 'True'}, ['x.pt'])
>>> call_source(["T('x.pt')"], {"lambda": "0.5", "dim": "1"})
"call(OP, T('x.pt'), dim=1, **{'lambda': 0.5})"
"""

from __future__ import annotations

import keyword
import math
import re
from typing import Any

from precnb.errors import PrecnbError

__all__ = ["ReproError", "autocast_dtype", "call_source", "outputs", "render_args"]

_SCALARS = {"int", "float", "bool", "str", "complex", "float16", "float32", "float64", "int8", "int16",
            "int32", "int64", "uint8", "bool_"}
_FLOATS = ("float", "float16", "float32", "float64")
_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# the torch constants an argument may name (a closed list: the dump never names code)
DTYPES = frozenset({
    "float16", "half", "bfloat16", "float32", "float", "float64", "double", "complex32", "chalf", "complex64",
    "cfloat", "complex128", "cdouble", "uint8", "uint16", "uint32", "uint64", "int8", "int16", "short", "int32",
    "int", "int64", "long", "bool", "float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz",
    "float8_e8m0fnu", "float4_e2m1fn_x2", "qint8", "quint8", "qint32", "quint4x2", "quint2x4"})
MEMORY_FORMATS = frozenset({"contiguous_format", "channels_last", "channels_last_3d", "preserve_format"})
MAX_DEPTH = 32  # msprobe nests a few levels (a list of tuples of tensors); deeper is not a record


class ReproError(PrecnbError):
    """The node cannot be rebuilt as a standalone op call (the message says what is missing)."""


def _int(v: Any, where: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int | float) or (isinstance(v, float) and not v.is_integer()):
        raise ReproError(f"{where}: {str(v)[:40]!r} is not an integer")
    return int(v)


def _float_expr(v: Any, where: str) -> str:
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise ReproError(f"{where}: {str(v)[:40]!r} is not a number")
    try:
        x = float(v)
    except OverflowError:
        raise ReproError(f"{where}: {str(v)[:40]!r} does not fit a float") from None
    if math.isnan(x):
        return 'float("nan")'
    if math.isinf(x):
        return 'float("inf")' if x > 0 else 'float("-inf")'
    return repr(x)


def file_name(name: Any, where: str) -> str:
    """A saved tensor's ``data_name``: a plain file name (never a path leaving the data folder)."""
    if not isinstance(name, str) or not name or name == "-1":
        raise ReproError(f"{where}: no saved file")
    if name in (".", "..") or "/" in name or "\\" in name or "\0" in name:
        raise ReproError(f"{where}: data_name {name[:80]!r} is not a file name inside dump_tensor_data")
    return name


def _leaf_expr(leaf: Any, where: str, files: list[str], depth: int = 0) -> str:
    """Python source for one dump.json leaf (tensor files are appended to *files*)."""
    if depth > MAX_DEPTH:
        raise ReproError(f"{where}: nested deeper than {MAX_DEPTH} levels (not a record msprobe writes)")
    if leaf is None:
        return "None"
    if isinstance(leaf, list):
        inner = [_leaf_expr(x, f"{where}.{i}", files, depth + 1) for i, x in enumerate(leaf)]
        return "[" + ", ".join(inner) + "]"
    if not isinstance(leaf, dict):
        raise ReproError(f"{where}: unexpected value {str(leaf)[:60]!r} in dump.json")
    kind = leaf.get("type")
    if not isinstance(kind, str):
        if not leaf:
            raise ReproError(f"{where}: msprobe recorded an object it could not serialise ({{}}); "
                             "it cannot be rebuilt")
        parts = [f"{k!r}: {_leaf_expr(v, f'{where}.{k}', files, depth + 1)}" for k, v in leaf.items()]
        return "{" + ", ".join(parts) + "}"
    if "Tensor" in kind or "Parameter" in kind or kind.endswith("ndarray"):
        name = leaf.get("data_name")
        if not isinstance(name, str) or not name or name == "-1":
            raise ReproError(f"{where}: a {kind} without a saved file (dump with task=tensor to rebuild it)")
        files.append(file_name(name, where))
        return f"T({name!r})"
    value = leaf.get("value")
    if kind in _FLOATS:
        return _float_expr(value, where)
    if kind in _SCALARS:
        if isinstance(value, bool | int | str) or value is None:
            return repr(value)
        if isinstance(value, float):
            return _float_expr(value, where)
        raise ReproError(f"{where}: scalar of type {kind} with value {str(value)[:40]!r}")
    if kind == "slice" and isinstance(value, list) and len(value) == 3:
        return "slice(" + ", ".join("None" if x is None else repr(_int(x, where)) for x in value) + ")"
    if kind == "ellipsis":
        return "Ellipsis"
    if kind == "torch.Size" and isinstance(value, list):
        return "torch.Size(" + repr([_int(x, where) for x in value]) + ")"
    if kind in ("torch.dtype", "mindspore.dtype") and isinstance(value, str) and value.startswith("torch."):
        if value[len("torch."):] in DTYPES:
            return value
        raise ReproError(f"{where}: {value[:40]!r} is not a torch dtype")
    if kind == "torch.device":
        return "DEVICE"
    if kind == "torch.memory_format" and leaf.get("format") in MEMORY_FORMATS:
        return f"torch.{leaf['format']}"
    raise ReproError(f"{where}: a {kind[:60]} argument cannot be rebuilt in a standalone script")


def render_args(record: dict[str, Any]) -> tuple[list[str], dict[str, str], list[str]]:
    """``(positional sources, keyword sources, tensor files)`` of one forward API record.

    Raises
    ------
    ReproError
        An argument that cannot be rebuilt or a malformed record, naming the argument.
    """
    files: list[str] = []
    raw_args = record.get("input_args") or []
    raw_kwargs = record.get("input_kwargs") or {}
    if not isinstance(raw_args, list):
        raise ReproError(f"input_args: a {type(raw_args).__name__}, not a list")
    if not isinstance(raw_kwargs, dict):
        raise ReproError(f"input_kwargs: a {type(raw_kwargs).__name__}, not an object")
    args = [_leaf_expr(a, f"input_args.{i}", files) for i, a in enumerate(raw_args)]
    kwargs: dict[str, str] = {}
    for k, v in raw_kwargs.items():
        if not _IDENT.match(str(k)):
            raise ReproError(f"input_kwargs.{str(k)[:40]}: not a keyword argument name")
        kwargs[str(k)] = _leaf_expr(v, f"input_kwargs.{k}", files)
    return args, kwargs, files


def call_source(args: list[str], kwargs: dict[str, str]) -> str:
    """``call(OP, ...)`` with *args* and *kwargs* (a keyword named like a Python keyword goes in ``**{}``)."""
    plain = [f"{k}={v}" for k, v in kwargs.items() if not keyword.iskeyword(k)]
    odd = [f"{k!r}: {v}" for k, v in kwargs.items() if keyword.iskeyword(k)]
    return "call(" + ", ".join(["OP", *args, *plain, *(["**{" + ", ".join(odd) + "}"] if odd else [])]) + ")"


def outputs(value: Any, path: str = "", depth: int = 0) -> list[tuple[str, str, str]]:
    """``(index path, data_name, dtype)`` of every saved output tensor."""
    out: list[tuple[str, str, str]] = []
    if depth > MAX_DEPTH:
        raise ReproError(f"output{'.' + path if path else ''}: nested deeper than {MAX_DEPTH} levels")
    if isinstance(value, list):
        for i, x in enumerate(value):
            out += outputs(x, f"{path}.{i}" if path else str(i), depth + 1)
    elif isinstance(value, dict):
        name = value.get("data_name")
        if isinstance(value.get("type"), str) and isinstance(name, str) and name and name != "-1":
            out.append((path, file_name(name, f"output.{path}"), str(value.get("dtype", ""))))
        elif not isinstance(value.get("type"), str):
            for k, x in value.items():
                out += outputs(x, f"{path}.{k}" if path else str(k), depth + 1)
    return out


def _input_dtypes(value: Any, depth: int = 0) -> set[str]:
    out: set[str] = set()
    if depth > MAX_DEPTH:
        return out
    if isinstance(value, list):
        for x in value:
            out |= _input_dtypes(x, depth + 1)
    elif isinstance(value, dict):
        if isinstance(value.get("type"), str):
            if isinstance(value.get("dtype"), str):
                out.add(value["dtype"])
        else:
            for x in value.values():
                out |= _input_dtypes(x, depth + 1)
    return out


def autocast_dtype(record: dict[str, Any], outs: list[tuple[str, str, str]]) -> str | None:
    """``"bfloat16"`` / ``"float16"`` when the op evidently ran under autocast.

    That is: every float output has that dtype and some float input has another (an fp32 linear
    whose output is bf16 was autocast, and so was a linear of a bf16 activation and an fp32 weight,
    which fails outside autocast); or every float input has that dtype and every float output is
    float32 (autocast's fp32 ops, e.g. a cross entropy of bf16 logits). The script reruns it under
    ``torch.autocast`` too.
    """
    low_dtypes = ("torch.bfloat16", "torch.float16")
    out_floats = {d for _, _, d in outs if "float" in d}
    in_floats = {d for d in _input_dtypes([record.get("input_args"), record.get("input_kwargs")]) if "float" in d}
    if len(out_floats) == 1 and out_floats <= set(low_dtypes) and in_floats - out_floats:
        (dtype,) = out_floats
    elif out_floats == {"torch.float32"} and len(in_floats) == 1 and in_floats <= set(low_dtypes):
        (dtype,) = in_floats
    else:
        return None
    return dtype.replace("torch.", "")
