"""What one msprobe record says beyond its statistics: undefined inputs, scalar-argument checksums, p2p peers.

Helpers of :mod:`precnb.io._runfacts` (the run facts the parser collects while it walks the records):

- :func:`undefined_leaves`: tensors an op never reads (``input`` of ``baddbmm``/``addmm``/... with ``beta=0``),
  receive buffers and irecv buffers recorded before the wait;
- :func:`scalar_signature`: a checksum of a call's scalar arguments (rank-dependent arguments);
- :func:`p2p_peers`, :func:`reduce_op`: a point-to-point op's peers, a collective's reduce operation.

Examples
--------
>>> plain("float", float("inf")), plain("str", "NaN")
('inf', 'NaN')
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Mapping
from typing import Any

__all__ = ["BEFORE_WAIT", "BETA_ZERO", "RECV_BUFFER", "UNDEFINED_PREFIXES", "p2p_peers", "plain", "reduce_op",
           "scalar_signature", "undefined_leaves"]

_POSITIONS = tuple(str(i) for i in range(64))
_NONFINITE = {"NaN": "nan", "Infinity": "inf", "-Infinity": "-inf"}

#: ops whose record may hold a tensor the op never reads (see :func:`undefined_leaves`): a quick pre-filter
_BETA_APIS = ("baddbmm", "addbmm", "addmm", "addmv", "addr")
UNDEFINED_PREFIXES = (*(f"{p}.{a}" for p in ("Torch", "Tensor") for a in _BETA_APIS),
                      "Distributed.batch_isend_irecv.", "Distributed.irecv.", "Distributed.recv.")
BETA_ZERO = "ignored by the op: beta=0 (torch ignores input, NaN and inf in it included)"
RECV_BUFFER = "receive buffer: the op overwrites it (its recorded value is whatever the buffer held)"
BEFORE_WAIT = "irecv buffer recorded before the wait: no defined value"


def _is_zero(leaf: Any) -> bool:
    return isinstance(leaf, dict) and "shape" not in leaf and leaf.get("value") in (0, 0.0) \
        and not isinstance(leaf.get("value"), bool)


def undefined_leaves(node: str, record: Mapping[str, Any]) -> dict[str, str]:
    """Tensor labels of *record* that hold no value the op uses, with why (``{}`` for most ops).

    * ``input`` of ``baddbmm`` / ``addbmm`` / ``addmm`` / ``addmv`` / ``addr`` called with ``beta=0``
      (Megatron's attention passes an uninitialised ``torch.empty`` buffer there);
    * the buffer of a receive (``Distributed.recv`` / ``irecv`` input), which the op overwrites;
    * an ``irecv``'s tensor inside ``Distributed.batch_isend_irecv`` (input and output: msprobe records
      both before the wait) and a bare ``Distributed.irecv``'s output.

    Examples
    --------
    >>> rec = {"input_args": [{"type": "torch.Tensor", "shape": [2]}, {"type": "torch.Tensor", "shape": [2]}],
    ...        "input_kwargs": {"beta": {"type": "float", "value": 0.0}}}
    >>> list(undefined_leaves("Torch.baddbmm.3.forward", rec))
    ['Torch.baddbmm.3.forward.input.0']
    >>> ops = [{"class_type": "torch.distributed.P2POp", "tensor": {"type": "torch.Tensor", "shape": [2]},
    ...         "op": "isend"}, {"class_type": "torch.distributed.P2POp", "tensor": {"type": "torch.Tensor"},
    ...         "op": "irecv"}]
    >>> got = undefined_leaves("Distributed.batch_isend_irecv.0.forward", {"input_args": [ops], "output": [ops]})
    >>> sorted(got)  # doctest: +NORMALIZE_WHITESPACE
    ['Distributed.batch_isend_irecv.0.forward.input.0.1.tensor',
     'Distributed.batch_isend_irecv.0.forward.output.0.1.tensor']
    """
    out: dict[str, str] = {}
    if not node.endswith(".forward") or not node.startswith(UNDEFINED_PREFIXES):
        return out
    args, kwargs = record.get("input_args"), record.get("input_kwargs")
    args = args if isinstance(args, list) else []
    kwargs = kwargs if isinstance(kwargs, dict) else {}
    if node.startswith("Distributed.batch_isend_irecv."):
        for side, tag in (("input_args", "input"), ("output", "output")):
            ops = record.get(side)
            ops = ops[0] if isinstance(ops, list) and ops and isinstance(ops[0], list) else []
            for i, op in enumerate(ops):
                if isinstance(op, dict) and op.get("op") == "irecv" and isinstance(op.get("tensor"), dict):
                    out[f"{node}.{tag}.0.{i}.tensor"] = BEFORE_WAIT
        return out
    if node.startswith("Distributed."):
        buffer = "input.tensor" if "tensor" in kwargs else "input.0"
        out[f"{node}.{buffer}"] = RECV_BUFFER
        if node.startswith("Distributed.irecv."):
            out[f"{node}.output.0"] = BEFORE_WAIT
        return out
    beta = kwargs.get("beta")
    if _is_zero(beta):
        out[f"{node}.input.input" if "input" in kwargs else f"{node}.input.0"] = BETA_ZERO
    return out


def _sig_scalar(kind: str, v: Any, path: str, out: list[str]) -> None:
    """Append ``path=value`` of one ``{type, value}`` scalar (bare NaN/Infinity read either way) to *out*."""
    cls = v.__class__
    if cls is int or (cls is float and v - v == 0):  # an int or a finite float: plain() gives it back
        out.append(f"{path}={v!r}")
    elif v is None or cls is bool or cls is float or cls is str:
        out.append(f"{path}={plain(kind, v)!r}")


def _sig_walk(value: Any, path: str, out: list[str], depth: int) -> None:
    if depth > 4:
        return
    if value.__class__ is dict:
        kind = value.get("type")
        if kind.__class__ is str:
            if "value" in value and "shape" not in value:
                _sig_scalar(kind, value["value"], path, out)
            return
        for k, x in value.items():
            if k != "tensor":  # a P2POp's tensor; its op / peer / tag are plain strings and ints, not leaves
                _sig_walk(x, f"{path}.{k}", out, depth + 1)
    elif value.__class__ is list:
        for i, x in enumerate(value):
            _sig_walk(x, f"{path}.{i}", out, depth + 1)


def scalar_signature(record: Mapping[str, Any]) -> int:
    """A checksum of a record's scalar arguments (``{type, value}`` leaves of ``input_args``/``input_kwargs``).

    0 when it has none. The same arguments give the same number in every process (CRC-32 of their text):
    the replica check and shard merging compare it across ranks to tell rank-dependent ops (a TP rank's
    vocabulary offset) from replicated ones.

    Examples
    --------
    >>> a = {"input_args": [{"type": "torch.Tensor", "shape": [2]}, {"type": "int", "value": 32}]}
    >>> b = {"input_args": [{"type": "torch.Tensor", "shape": [2]}, {"type": "int", "value": 0}]}
    >>> scalar_signature(a) == scalar_signature(a), scalar_signature(a) == scalar_signature(b)
    (True, False)
    >>> scalar_signature({"input_args": [{"type": "torch.Tensor", "shape": [2]}]})
    0
    """
    out: list[str] = []
    args, kwargs = record.get("input_args"), record.get("input_kwargs")
    if args.__class__ is list:
        for i, x in enumerate(args):
            if x.__class__ is dict:  # the usual argument, a tensor or a {type, value} scalar, read in line
                kind = x.get("type")
                if kind.__class__ is str:
                    if "value" in x and "shape" not in x:
                        _sig_scalar(kind, x["value"], _POSITIONS[i] if i < 64 else str(i), out)
                    continue
            elif x.__class__ is not list:
                continue  # a bare scalar: no {type, value} below it
            _sig_walk(x, str(i), out, 1)
    if kwargs.__class__ is dict and kwargs:
        for k, x in kwargs.items():
            _sig_walk(x, str(k), out, 1)
    return (zlib.crc32(";".join(out).encode("utf-8", "replace")) or 1) if out else 0


_P2P = ("batch_isend_irecv", "isend", "irecv", "send", "recv")
_PEER_KW = ("peer", "dst", "src", "group_dst", "group_src")


def p2p_peers(node: str, record: Mapping[str, Any]) -> list[int]:
    """The peer ranks of a point-to-point record (``Distributed.batch_isend_irecv``'s P2P ops, ``send`` / ``recv``).

    Examples
    --------
    >>> ops = [{"class_type": "torch.distributed.P2POp", "op": "isend", "peer": 1, "tensor": {}}]
    >>> p2p_peers("Distributed.batch_isend_irecv.0.forward", {"input_args": [ops]})
    [1]
    >>> p2p_peers("Distributed.send.0.forward", {"input_kwargs": {"dst": {"type": "int", "value": 3}}})
    [3]
    """
    api = node.split(".")[1] if node.count(".") >= 2 else ""
    if api not in _P2P:
        return []
    out: list[int] = []
    args, kwargs = record.get("input_args"), record.get("input_kwargs")
    if api == "batch_isend_irecv":
        ops = args[0] if isinstance(args, list) and args and isinstance(args[0], list) else []
        out += [int(op["peer"]) for op in ops if isinstance(op, dict) and isinstance(op.get("peer"), int)]
        return out
    cands = [kwargs.get(k) for k in _PEER_KW] if isinstance(kwargs, dict) else []
    if isinstance(args, list) and len(args) > 1:
        cands.append(args[1])
    for c in cands:
        v = c.get("value") if isinstance(c, dict) else None
        if isinstance(v, int) and not isinstance(v, bool) and v >= 0:
            out.append(v)
            break
    return out


def reduce_op(record: Mapping[str, Any]) -> str | None:
    """The reduce op of a collective's record (``"RedOpType.MAX"``; ``None`` when it records none).

    Examples
    --------
    >>> reduce_op({"input_kwargs": {"op": {"type": "torch.distributed.ReduceOp", "value": "RedOpType.MAX"}}})
    'RedOpType.MAX'
    >>> reduce_op({"input_args": [{"type": "torch.Tensor", "shape": [2]}]}) is None
    True
    """
    kwargs = record.get("input_kwargs")
    cands = [kwargs.get("op")] if kwargs.__class__ is dict else []
    args = record.get("input_args")
    if args.__class__ is list:
        cands += [x for x in args[1:3] if x.__class__ is dict and "ReduceOp" in str(x.get("type", ""))]
    for c in cands:
        if c.__class__ is dict and isinstance(c.get("value"), str):
            return str(c["value"])
    return None


def plain(kind: str, v: Any) -> Any:
    """A JSON scalar of one argument (non-finite floats as ``"nan"``/``"inf"``/``"-inf"``), or None."""
    if isinstance(v, bool) or v is None:
        return v
    if isinstance(v, int):
        return v
    if isinstance(v, float):
        if math.isfinite(v):
            return v
        return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf")
    if isinstance(v, str):
        if v in _NONFINITE and kind != "str":  # a bare NaN / Infinity token of a number
            return _NONFINITE[v]
        return v if len(v) <= 64 else None
    return None
