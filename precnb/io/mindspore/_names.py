"""Kernel names of a MindSpore dump: full scope names, module paths and the parameters kernels read.

MindSpore's tensor-mode dump files carry the kernel's full scope name with ``/`` replaced by
``_`` (``Default_network-NetWithLoss_net-TinyGPT_norm_out-RMSNorm_Mul-op1``). The ``/`` form
(``Default/network-NetWithLoss/net-TinyGPT/norm_out-RMSNorm/Mul-op1``) is recovered from the
rank's graph IR (``graphs/*.ir``, "Fullname with scope" lines) and execution-order CSVs where
they list the kernel; a kernel they do not list gets its module from the longest listed scope
its name starts with, and, without any listing, from the ``attr-Class`` pattern of the name.

A scope component ``attr-Class`` is a cell; the module path is the attributes after the
network cell (the cell whose class is the dump's ``net_name``), joined by ``.``
(``layers.0.attention_norm``); cells above it and non-cell scopes (``Grad_Pow``) are not part
of it. Parameters are read from the IR's ``%paraN_<name>`` declarations, and a kernel input
that is ``%paraN_<name>`` or a ``Load`` of it reads that parameter.

Examples
--------
>>> module_path("Default/network-NetWithLoss/net-TinyGPT/norm_out-RMSNorm/Mul-op1", "TinyGPT")
'norm_out'
>>> module_path("Gradients/Default/network-Net/net-TinyGPT/layers-CellList/0-DecoderLayer/"
...             "ffn_norm-RMSNorm/Grad_Mul/Mul-op3", "TinyGPT")
'layers.0.ffn_norm'
>>> direction_of("Gradients/Default/network-Net/Mul-op0"), direction_of("Default/optimizer-Adam/Adam-op0")
('backward', 'optimizer')
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from precnb.io._fs import open_regular

__all__ = ["NameTable", "direction_of", "module_path", "name_table", "split_underscored"]

_FULLNAME = re.compile(r"#\s*Fullname with scope:\s*\((.+)\)\s*$")
_NODE = re.compile(r"^\s*%(\d+)\([^)]*\)\s*=\s*([A-Za-z_][A-Za-z0-9_]*)\((.*)$")
_PARAM = re.compile(r"^%para\d+_(\S+?):\s*<(.*)$")
_PARAM_SHAPE = re.compile(r"^(?:Ref\[)?Tensor\[[^\]]*\]\]?,\s*\(([0-9, ]*)\)")
_CELL = re.compile(r"^(?P<attr>[^-]+)-(?P<cls>[A-Za-z_][A-Za-z0-9_]*)$")
_ROOTS = ("Gradients/Default", "recompute_Default", "Default", "Gradients", "Expand")
_UNDERSCORED_CELL = re.compile(r"-([A-Z_][A-Za-z0-9]*)_")
_MAX_IR_BYTES = 1 << 31


def _root_and_rest(name: str) -> tuple[str, list[str]]:
    for root in _ROOTS:
        if name == root or name.startswith(root + "/"):
            return root, [p for p in name[len(root) + 1:].split("/") if p]
    head, _, rest = name.partition("/")
    return head, [p for p in rest.split("/") if p]


def direction_of(full_name: str) -> str:
    """``backward`` (Gradients scope), ``optimizer`` (an ``optimizer-*`` cell), ``forward`` or ``""``."""
    root, parts = _root_and_rest(full_name)
    if root.startswith("Gradients"):
        return "backward"
    if any(p.startswith("optimizer-") for p in parts[:-1]):
        return "optimizer"
    return "forward" if root in ("Default", "recompute_Default") else ""


def _cells(parts: Iterable[str]) -> list[tuple[str, str]]:
    out = []
    for p in parts:
        m = _CELL.match(p)
        if not m:
            break
        out.append((m["attr"], m["cls"]))
    return out


def module_path(full_name: str, net_name: str = "", *, is_scope: bool = False) -> str:
    """Module path of a kernel's full name (or of a scope with *is_scope*), relative to the network cell.

    Without a cell of class *net_name* in the name, the path holds every cell attribute.
    """
    _, parts = _root_and_rest(full_name)
    cells = _cells(parts if is_scope else parts[:-1])
    attrs = [a for a, _ in cells]
    classes = [c for _, c in cells]
    if net_name and net_name in classes:
        attrs = attrs[classes.index(net_name) + 1:]
    return ".".join(attrs)


def split_underscored(op_name: str) -> tuple[str, str]:
    """Best-effort ``(scope with '/', op)`` of an ``_``-separated name from its ``attr-Class_`` pattern.

    Examples
    --------
    >>> split_underscored("Default_network-Net_net-TinyGPT_norm_out-RMSNorm_Mul-op1")
    ('Default/network-Net/net-TinyGPT/norm_out-RMSNorm', 'Mul-op1')
    """
    root = next((r for r in _ROOTS if op_name.startswith(r.replace("/", "_") + "_")), "")
    rest = op_name[len(root) + 1:] if root else op_name
    comps, start = [], 0
    for m in _UNDERSCORED_CELL.finditer(rest):
        comps.append(rest[start:m.end() - 1])
        start = m.end()
    scope = "/".join([root, *comps] if root else comps)
    return scope, rest[start:]


@dataclass
class NameTable:
    """What a rank's IR and execution-order files say about its kernels.

    Attributes
    ----------
    full : dict
        ``_``-name -> full scope name, for every kernel the files list.
    scopes : dict
        ``_``-scope -> scope (every proper ``/`` prefix of a listed name).
    reads : dict
        Full name -> {input slot: parameter name}.
    params : dict
        ``_``-parameter name -> (parameter name, shape or None, is a weight).
    order_names : set
        ``_``-names listed by the execution-order CSVs (to compare with the files).
    sources : list
        The files read.
    problems : list
        ``(file, reason)`` for listing files that could not be read.
    """

    full: dict[str, str] = field(default_factory=dict)
    scopes: dict[str, str] = field(default_factory=dict)
    reads: dict[str, dict[int, str]] = field(default_factory=dict)
    params: dict[str, tuple[str, tuple[int, ...] | None, bool]] = field(default_factory=dict)
    order_names: set[str] = field(default_factory=set)
    sources: list[str] = field(default_factory=list)
    problems: list[tuple[str, str]] = field(default_factory=list)

    def add_name(self, name: str) -> None:
        """Register one full scope name and its scopes."""
        self.full.setdefault(name.replace("/", "_"), name)
        parts = name.split("/")
        for k in range(1, len(parts)):
            scope = "/".join(parts[:k])
            self.scopes.setdefault(scope.replace("/", "_"), scope)

    def resolve(self, op_name: str) -> tuple[str | None, str | None]:
        """(exact full name or None, best scope with ``/`` or None) of a file's ``_``-name."""
        exact = self.full.get(op_name)
        if exact is not None:
            return exact, exact.rpartition("/")[0]
        pos = len(op_name)
        while True:
            pos = op_name.rfind("_", 0, pos)
            if pos <= 0:
                break
            scope = self.scopes.get(op_name[:pos])
            if scope is not None:
                return None, scope
        scope, _ = split_underscored(op_name)
        return None, scope or None


def _args(text: str) -> list[str]:
    """Top-level arguments of a call whose opening parenthesis was just consumed.

    >>> _args("%3, (I64(1), I64(2)), Tensor(shape=[1, 2]), %7) {attrs}")
    ['%3', '(I64(1), I64(2))', 'Tensor(shape=[1, 2])', '%7']
    """
    out: list[str] = []
    cur: list[str] = []
    depth = 0
    for ch in text:
        if ch in "([{<":
            depth += 1
        elif ch in ")]}>":
            if depth == 0:
                break
            depth -= 1
        if ch == "," and depth == 0:
            out.append("".join(cur).strip())
            cur = []
        else:
            cur.append(ch)
    out.append("".join(cur).strip())
    return out


def _read_ir(path: Path, table: NameTable) -> None:
    loads: dict[str, str] = {}
    pending: tuple[str, str, list[str]] | None = None
    with open_regular(path, "r", encoding="utf-8", errors="replace") as fh:
        for line in fh:
            if line.startswith("%para"):
                m = _PARAM.match(line)
                if m:
                    name, rest = m[1], m[2]
                    shp = _PARAM_SHAPE.match(rest)
                    shape = tuple(int(d) for d in shp[1].replace(" ", "").split(",") if d) if shp else None
                    weight = "IsWeight: true" in line and "is_parameter" in rest
                    table.params.setdefault(name.replace(".", "_"), (name, shape, weight))
                continue
            s = line.lstrip()
            if s.startswith("%"):
                m = _NODE.match(line)
                pending = None
                if m:
                    pending = (m[1], m[2], _args(m[3]))
                continue
            if s.startswith("# Fullname") and pending is not None:
                f = _FULLNAME.search(s)
                if f:
                    name = f[1]
                    table.add_name(name)
                    node_id, op, args = pending
                    if op == "Load" and args and args[0].startswith("%para"):
                        loads[node_id] = args[0].split("_", 1)[1]
                    reads = {i: (a.split("_", 1)[1] if a.startswith("%para") else loads[a[1:]])
                             for i, a in enumerate(args)
                             if a.startswith("%para") or (a.startswith("%") and a[1:] in loads)}
                    if reads:
                        table.reads[name] = reads
                pending = None


def _read_order_csv(path: Path, table: NameTable) -> None:
    with open_regular(path, "r", encoding="utf-8", errors="replace") as fh:
        header = fh.readline()
        if "FullNameWithScope" not in header:
            return
        for line in fh:
            name = line.strip().strip('"')
            if name:
                table.add_name(name)
                table.order_names.add(name.replace("/", "_"))


def _stamp(folder: Path) -> tuple[tuple[str, int, int], ...]:
    try:
        return tuple(sorted((e.name, e.stat().st_size, e.stat().st_mtime_ns)
                            for e in os.scandir(folder) if e.is_file()))
    except OSError:
        return ()


def name_table(rank_dir: Path) -> NameTable:
    """The :class:`NameTable` of a ``rank_<id>`` folder (cached per process while its files are unchanged)."""
    graphs, order = rank_dir / "graphs", rank_dir / "execution_order"
    return _cached_table(str(rank_dir), _stamp(graphs), _stamp(order))


@lru_cache(maxsize=16)
def _cached_table(rank_dir: str, graphs_stamp: tuple[tuple[str, int, int], ...],
                  order_stamp: tuple[tuple[str, int, int], ...]) -> NameTable:
    table = NameTable()
    root = Path(rank_dir)
    for name, size, _ in graphs_stamp:
        if name.endswith(".ir"):
            path = root / "graphs" / name
            if size > _MAX_IR_BYTES:
                table.problems.append((str(path), f"ignored: graph IR larger than {_MAX_IR_BYTES} bytes"))
                continue
            try:
                _read_ir(path, table)
                table.sources.append(str(path))
            except OSError as exc:
                table.problems.append((str(path), f"cannot read graph IR: {exc.strerror or exc}"))
    for name, _, _ in order_stamp:
        if name.startswith("ms_execution_order_graph_") and name.endswith(".csv"):
            path = root / "execution_order" / name
            try:
                _read_order_csv(path, table)
                table.sources.append(str(path))
            except OSError as exc:
                table.problems.append((str(path), f"cannot read execution order: {exc.strerror or exc}"))
    return table
