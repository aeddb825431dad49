"""Run facts a dump holds outside its tensor statistics: ``requires_grad`` and optimizer arguments.

The pre-flight checks (:mod:`precnb.analysis.preflight`) need two things the statistics do not
carry: whether each parameter requires a gradient (the module records' ``parameters`` leaves
hold ``requires_grad``) and the scalar arguments of the optimizer's ops (``lr``, ``beta1``,
``weight_decay`` of ``Torch._fused_adamw_``; the ``value`` of ``Tensor.addcdiv_``, ...). The
msprobe parser hands every node record to :meth:`FileFacts.node` as it walks it (one pass over
the records; :func:`file_facts` does the same for a whole ``data`` object); the assembler folds
the files' facts into two JSON attributes with :class:`FactsAccumulator` (see :mod:`precnb.schema`).

Examples
--------
>>> data = {"Torch._fused_adamw_.0.forward": {"input_args": [], "input_kwargs": {
...     "lr": {"type": "float", "value": 0.01}, "maximize": {"type": "bool", "value": False}}}}
>>> facts = file_facts(data, {"Torch._fused_adamw_.0.forward": "optimizer"})
>>> facts["scalar_args"]
{'Torch._fused_adamw_': {'lr': [0.01], 'maximize': [False]}}
>>> sorted(facts)  # and the checksum of each call's scalar arguments (rank-dependent ops)
['scalar_args', 'scalar_sigs']
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from precnb.io._cext import craw
from precnb.io._record_facts import (
    UNDEFINED_PREFIXES,
    p2p_peers,
    reduce_op,
    scalar_signature,
    undefined_leaves,
)
from precnb.io._record_facts import plain as _plain

__all__ = ["OPTIMIZER_NAME", "UNDEFINED_PREFIXES", "FactsAccumulator", "FileFacts", "api_of", "file_facts",
           "is_optimizer_node", "p2p_peers", "reduce_op", "scalar_signature", "undefined_leaves"]

#: API names that are optimizer updates wherever they are called (fused and foreach kernels)
_OPTIMIZER_MARKERS = ("_fused_adam", "_fused_sgd", "_fused_adagrad", "addcdiv_", "_foreach_lerp_")
_MARKERS = re.compile("|".join(re.escape(m) for m in _OPTIMIZER_MARKERS))
#: what a node name holds when it may be an optimizer op outside the ``optimizer`` scope (a quick pre-filter)
OPTIMIZER_NAME = _MARKERS
_API = re.compile(r"^(?P<api>.+?)\.(?:\d+\.(?:forward|backward)|(?:forward|backward)(?:\.\d+)?)$")
_MAX_VALUES = 64  # distinct values kept per (api, argument, step)
_MAX_DEPTH = 8
_POSITIONS = tuple(str(i) for i in range(64))
_ABSENT = object()
_MAX_SIG_EXCEPTIONS = 100_000  # (step, rank) entries kept per node whose scalar arguments vary


def api_of(node: str) -> str:
    """The API name of a node record (``Tensor.addcdiv_.3.forward`` → ``Tensor.addcdiv_``).

    Examples
    --------
    >>> api_of("Torch._fused_adamw_.0.forward"), api_of("Module.fc.Linear.forward.0")
    ('Torch._fused_adamw_', 'Module.fc.Linear')
    """
    if node.isascii() and "\n" not in node:  # what the pattern gives, with string methods
        for direction in (".forward", ".backward"):
            if node.endswith(direction):
                head = node[:-len(direction)]
                api, sep, call = head.rpartition(".")
                if sep and api and call.isdigit():  # {api}.{call}.{direction}: the shortest api wins
                    return api
                if head:  # {api}.{direction}
                    return head
    m = _API.match(node)
    return m.group("api") if m else node


def is_optimizer_node(node: str, parent: str) -> bool:
    """Whether *node* is an optimizer op: recorded under the ``optimizer`` scope, or a fused/foreach update.

    Examples
    --------
    >>> is_optimizer_node("Tensor.mul_.7.forward", "optimizer"), is_optimizer_node("Tensor.mul_.7.forward", "")
    (True, False)
    >>> is_optimizer_node("Tensor.addcdiv_.0.forward", "")
    True
    """
    if not node.endswith(".forward") and ".forward." not in node:
        return False
    if parent == "optimizer" or parent.startswith("optimizer."):
        return True
    if _MARKERS.search(node) is None:  # the API name is part of the node name
        return False
    api = api_of(node)
    return any(m in api for m in _OPTIMIZER_MARKERS)


def _scalars(value: Any, path: str, out: dict[str, list[Any]], depth: int, *, kwarg: bool) -> None:
    """Append the scalar arguments below *value* to ``out[path]`` (repeats included: the caller keeps distinct ones)."""
    if depth > _MAX_DEPTH:
        return
    if isinstance(value, dict):
        kind = value.get("type")
        if isinstance(kind, str):
            if "value" in value and "shape" not in value:
                v = _plain(kind, value["value"])
            elif kwarg and value.get("shape") == [] and "Max" in value:  # a 0-d tensor keyword (lr=tensor)
                v = _plain("float", value.get("Max"))
            else:
                return
            if v is not None:
                out.setdefault(path, []).append(v)
            return
        for k, x in value.items():
            _scalars(x, f"{path}.{k}", out, depth + 1, kwarg=kwarg)
    elif isinstance(value, list):
        if depth >= _MAX_DEPTH:
            return
        for x in value:  # the elements of one list argument share its path
            if x.__class__ is dict and "shape" in x and x.get("type").__class__ is str \
                    and not (kwarg and x["shape"] == [] and "Max" in x):
                continue  # a tensor (the params of a foreach/fused op): no scalar, as the call below would find
            _scalars(x, path, out, depth + 1, kwarg=kwarg)


def _arg_scalars(value: Any, path: str, out: dict[str, list[Any]]) -> None:
    _scalars(value, path, out, 1, kwarg=False)


def _kwarg_scalars(value: Any, path: str, out: dict[str, list[Any]]) -> None:
    _scalars(value, path, out, 1, kwarg=True)


def _c_scan() -> Any:
    """:meth:`FileFacts.optimizer`'s argument scan in C (``precnb/io/_craw_facts.c``), or None.

    None when the extension is not built or ``PRECNB_PURE_PARSER`` is set (the Python scan is the reference).
    """
    c = craw()
    return None if c is None else c.optimizer_args


def _add(values: list[Any], v: Any) -> None:
    if len(values) < _MAX_VALUES and not any(type(v) is type(x) and v == x for x in values):
        values.append(v)


class FileFacts:
    """The facts of one file, gathered node record by node record (what :func:`file_facts` returns).

    The parser calls :meth:`node` on every record as it walks it, so the records are read once.

    Examples
    --------
    >>> ff = FileFacts()
    >>> ff.node("Module.fc.Linear.forward.0", {"parameters": {"weight": {"requires_grad": False}}}, "")
    >>> ff.node("Tensor.addcdiv_.0.forward", {"input_kwargs": {"value": {"type": "float", "value": -0.1}}}, "")
    >>> ff.result()  # doctest: +NORMALIZE_WHITESPACE
    {'requires_grad': {'Module.fc.Linear.forward.0.parameters.weight': False},
     'scalar_args': {'Tensor.addcdiv_': {'value': [-0.1]}}}
    """

    __slots__ = ("_known", "_scan", "_seen", "grads", "peers", "reduce_ops", "scalars", "signatures", "sigs",
                 "undefined")

    def __init__(self, *, signatures: bool = True) -> None:
        self.signatures = signatures  # False: no scalar_signature (a step read from one file: nothing to compare)
        self.grads: dict[str, bool] = {}
        self.scalars: dict[str, dict[str, list[Any]]] = {}
        self.undefined: dict[str, str] = {}
        self.sigs: dict[str, int] = {}  # API forward node -> scalar_signature (only nodes that have scalars)
        self.reduce_ops: dict[str, str] = {}  # collective -> its reduce op, when not a sum (``RedOpType.MAX``)
        self.peers: set[int] = set()  # the ranks this file's point-to-point calls send to / receive from
        self._seen: dict[tuple[str, str], set[tuple[type, Any]]] = {}
        self._known: set[tuple[str, str, type, Any]] = set()  # (api, path, type, value) of every value kept
        self._scan = _c_scan()  # optimizer()'s argument scan in C, when built

    def node(self, node: str, record: Mapping[str, Any], parent: str) -> None:
        """Fold in one node record (*parent*: its parent in construct.json, ``""`` when unknown)."""
        params = record.get("parameters")
        if params.__class__ is dict:
            grads = self.grads
            for pname, leaf in params.items():
                if leaf.__class__ is dict:
                    rg = leaf.get("requires_grad")
                    if rg.__class__ is bool:
                        grads[f"{node}.parameters.{pname}"] = rg
        if (parent.startswith("optimizer") or ("_fused_" in node or "addcdiv_" in node or "_foreach_lerp_" in node)
                ) and is_optimizer_node(node, parent):  # substrings of every marker: cheaper than the pattern
            self.optimizer(node, record)
        if node.startswith(UNDEFINED_PREFIXES):
            self.undefined.update(undefined_leaves(node, record))

    def batch(self, todo: list[tuple[int, str, dict[str, Any], str]]) -> None:
        """:meth:`node` (flag 1) and :meth:`api` (flag 2) of ``(flags, node, record, parent)`` entries, in order."""
        c = craw()
        if c is not None and self._scan is not None:  # the same, the optimizer records read in C
            c.facts_batch(todo, self.node, self.api, self._known, self._merge, _POSITIONS, _plain, _arg_scalars,
                          _kwarg_scalars, api_of, _OPTIMIZER_MARKERS, UNDEFINED_PREFIXES)
            return
        for flags, node, record, parent in todo:
            if flags & 1:
                self.node(node, record, parent)  # parameters' requires_grad, optimizer arguments, unread buffers
            if flags & 2:
                self.api(node, record)  # its scalar arguments' checksum (rank-dependent ops)

    def api(self, node: str, record: Mapping[str, Any]) -> None:
        """Note an API forward record's :func:`scalar_signature` (the parser calls it for those records)."""
        sig = scalar_signature(record) if self.signatures else 0
        if sig:
            self.sigs[node] = sig
        if node.startswith(("Distributed.", "MintDistributed.")):
            op = reduce_op(record)
            if op and not op.upper().endswith("SUM"):
                self.reduce_ops[node] = op
            self.peers.update(p2p_peers(node, record))

    def optimizer(self, node: str, record: Mapping[str, Any]) -> None:
        """The scalar arguments of an optimizer op's record (the common ``{type, value}`` ones read in line)."""
        found: dict[str, list[Any]] = {}
        if self._scan is not None and record.__class__ is dict:  # the same scan, in C (tests/test_parse_paths.py)
            api = self._scan(node, record, found, _POSITIONS, _plain, _arg_scalars, _kwarg_scalars, api_of,
                             self._known)
            if api is not None:  # (None: nothing found, or every value kept already: what _merge would see)
                self._merge(api, found)
            return
        args, kwargs = record.get("input_args"), record.get("input_kwargs")
        if isinstance(args, list):
            for i, x in enumerate(args):
                if x.__class__ is dict:
                    kind = x.get("type")
                    if kind.__class__ is str:  # a scalar, or a tensor (nothing for a positional argument)
                        if "value" in x and "shape" not in x:
                            v = x["value"]
                            if not ((v.__class__ is float and v - v == 0) or v.__class__ is int):
                                v = _plain(kind, v)  # a finite float or an int is its own plain value
                            if v is not None:
                                found.setdefault(_POSITIONS[i] if i < 64 else str(i), []).append(v)
                        continue
                _scalars(x, str(i), found, 1, kwarg=False)
        if isinstance(kwargs, dict):
            for k, x in kwargs.items():
                _scalars(x, str(k), found, 1, kwarg=True)
        if found:
            self._merge(api_of(node), found)

    def _merge(self, api: str, found: Mapping[str, list[Any]]) -> None:
        """Keep the first :data:`_MAX_VALUES` distinct values per argument, in file order (what :func:`_add` keeps)."""
        known = self._known
        if all((api, path, v.__class__, v) in known for path, vals in found.items() for v in vals):
            return  # every value kept already (the usual optimizer call: the same lr, betas, eps)
        into = self.scalars.setdefault(api, {})
        for path, vals in found.items():
            have = into.get(path)
            if have is None:
                have = into[path] = []
                seen = self._seen[(api, path)] = set()
            else:
                seen = self._seen[(api, path)]
            for v in vals:
                if len(have) >= _MAX_VALUES:
                    break
                key = (v.__class__, v)  # type and value: 1, 1.0 and True are distinct; 0.0 and -0.0 are not
                if key not in seen:
                    seen.add(key)
                    have.append(v)
                    known.add((api, path, *key))

    def result(self) -> dict[str, Any]:
        """``{"requires_grad": ..., "scalar_args": ...}`` with only the keys that hold something."""
        out: dict[str, Any] = {}
        if self.grads:
            out["requires_grad"] = self.grads
        if self.scalars:
            out["scalar_args"] = self.scalars
        if self.undefined:
            out["undefined"] = self.undefined
        if self.sigs:
            out["scalar_sigs"] = self.sigs
        if self.reduce_ops:
            out["reduce_ops"] = self.reduce_ops
        if self.peers:
            out["p2p_peers"] = sorted(self.peers)
        return out


def file_facts(data: Mapping[str, Any], parents: Mapping[str, str]) -> dict[str, Any]:
    """The facts of one dump.json ``data`` object (empty dict when it holds none).

    Parameters
    ----------
    data : mapping
        Node name → record, as parsed.
    parents : mapping
        Node → parent module from construct.json (``""`` / missing when unknown).

    Returns
    -------
    dict
        ``requires_grad``: ``{tensor label: bool}`` of the parameters of module records
        (``Module.fc.Linear.forward.0.parameters.weight``); ``scalar_args``: ``{api: {argument:
        [distinct values]}}`` of the optimizer's ops, keyword arguments by name and positional
        ones by index (a list argument's elements share its index).
    """
    ff = FileFacts()
    for node, record in data.items():
        if isinstance(record, dict):
            parent = parents.get(node, "") or ""
            ff.node(node, record, parent if isinstance(parent, str) else "")
            if not node.startswith(("Module.", "Cell.")) and node.endswith(".forward"):
                ff.api(node, record)
    return ff.result()


class FactsAccumulator:
    """Fold the facts of many (step, rank) files into the ``requires_grad`` / ``scalar_args`` attributes.

    Examples
    --------
    >>> acc = FactsAccumulator()
    >>> acc.add({"requires_grad": {"w": True}, "scalar_args": {"opt": {"lr": [0.1]}}}, step=0)
    >>> acc.add({"requires_grad": {"w": False}, "scalar_args": {"opt": {"lr": [0.1]}}}, step=1)
    >>> acc.attrs()
    {'requires_grad': '{"w": false}', 'scalar_args': '{"opt": {"lr": {"0": [0.1], "1": [0.1]}}}'}
    """

    def __init__(self) -> None:
        self.requires_grad: dict[str, bool] = {}
        self.scalar_args: dict[str, dict[str, dict[int, list[Any]]]] = {}
        self.undefined: dict[str, tuple[str, set[tuple[int, int]]]] = {}
        # step -> node -> the first signature seen at that step (one table per step, not per node: a large
        # dump.json holds hundreds of thousands of API calls), and (node, step) -> {rank: another one} for the
        # calls whose signature differs between ranks (rank-dependent calls)
        self._first_sig: dict[int, dict[str, Any]] = {}
        self._sig_at: dict[tuple[str, int], dict[int, Any]] = {}
        self.reduce_ops: dict[str, dict[str, set[int]]] = {}  # collective -> its non-sum reduce op -> ranks
        self.peers: dict[int, set[int]] = {}  # rank -> the ranks its point-to-point calls exchange with

    def add(self, facts: Mapping[str, Any] | None, *, step: int, rank: int = -1) -> None:
        """Fold one file's :func:`file_facts` (a parameter is frozen when any file says so)."""
        if not facts:
            return
        for label, why in (facts.get("undefined") or {}).items():
            self.undefined.setdefault(label, (str(why), set()))[1].add((int(step), int(rank)))
        if facts.get("p2p_peers"):
            self.peers.setdefault(int(rank), set()).update(int(p) for p in facts["p2p_peers"])
        for node, op in (facts.get("reduce_ops") or {}).items():
            self.reduce_ops.setdefault(node, {}).setdefault(str(op), set()).add(int(rank))
        sigs = facts.get("scalar_sigs")
        if sigs:
            st, rk = int(step), int(rank)
            first = self._first_sig.get(st)
            if first is None:
                self._first_sig[st] = dict(sigs)
            else:
                at, get = self._sig_at, first.get
                for node, sig in sigs.items():
                    seen = get(node, _ABSENT)
                    if seen is _ABSENT:
                        first[node] = sig
                    elif seen != sig:
                        ranks = at.setdefault((node, st), {})
                        if len(ranks) < _MAX_SIG_EXCEPTIONS:
                            ranks[rk] = sig
        for label, rg in (facts.get("requires_grad") or {}).items():
            self.requires_grad[label] = self.requires_grad.get(label, True) and bool(rg)
        for api, args in (facts.get("scalar_args") or {}).items():
            by_path = self.scalar_args.setdefault(api, {})
            for path, vals in args.items():
                have = by_path.setdefault(path, {}).setdefault(int(step), [])
                for v in vals:
                    _add(have, v)

    def attrs(self) -> dict[str, str]:
        """The dataset attributes (JSON text), only those that hold something."""
        out: dict[str, str] = {}
        if self.requires_grad:
            out["requires_grad"] = json.dumps(self.requires_grad)
        if self.scalar_args:
            table = {api: {path: {str(s): vals for s, vals in sorted(steps.items())}
                           for path, steps in args.items()} for api, args in self.scalar_args.items()}
            out["scalar_args"] = json.dumps(table, allow_nan=False)
        if self.undefined:
            from precnb.schema import encode_undefined

            out["undefined"] = encode_undefined(self.undefined)
        if self.peers:
            out["p2p_peers"] = json.dumps({str(r): sorted(p) for r, p in sorted(self.peers.items())})
        if self.reduce_ops:
            out["reduce_ops"] = json.dumps({n: {op: sorted(r) for op, r in sorted(ops.items())}
                                            for n, ops in sorted(self.reduce_ops.items())})
        varying: dict[str, dict[str, Any]] = {}
        for node, st in sorted(self._sig_at):
            at = self._sig_at[(node, st)]
            varying.setdefault(node, {})[str(st)] = {"default": self._first_sig[st][node],
                                                     "at": {str(r): v for r, v in sorted(at.items())}}
        if varying:  # node -> step -> the signature of most ranks and the ranks that differ
            out["scalar_signatures"] = json.dumps(varying)
        return out
