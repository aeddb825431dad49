"""A standalone one-op repro script from a tensor-mode dump: :func:`repro_script`.

The script loads the dumped inputs of one API node (``Functional.*``, ``Torch.*``, ``Tensor.*``,
``VF.*``, ``Aten.*``), calls the op with torch (positional and keyword arguments, scalars,
dtypes, ``None`` exactly as dump.json recorded them), compares each output with the dumped one
(cosine, max abs / relative error, relative L2 error as msprobe compare computes them), prints the
metrics and exits 0 when every output reproduces, 1 when one does not, 2 when it could not run
(a file cannot be read, the op fails or is refused, torch is missing) — so the op can be re-run on
another device or torch version (``--device``, ``--data``). It needs torch and numpy, not precnb.

**Only genuine operators are called.** A dumped name is a string from a file anyone could have
written: ``Torch.builtins.exec`` would otherwise be ``torch.builtins.exec``. precnb accepts a node
only when its API is on the allow-list :data:`precnb.repro._oplist.CALLABLE` (what msprobe hooks,
each name resolved under torch and checked to be an operator: ``tools/repro_oplist.py``), and the
script carries the same list: its ``call(OP, ...)`` refuses an ``OP`` not on it and checks that the
resolved object is a torch operator (never a module, a class, a builtin, anything of builtins / os
/ sys / subprocess / importlib) before calling it. The dump contributes data only (literals, file
names); tensors are read safely (``torch.load(weights_only=True)``,
``numpy.load(allow_pickle=False)``), from plain file names inside the data folder.

Nodes that cannot be rebuilt raise :class:`ReproError` naming what is missing: modules (repro an
API inside them), backward records, collectives, torch_npu ops, MindSpore dumps, names not on the
allow-list, and arguments that were not saved (a tensor without ``data_name``, a process group,
an object msprobe wrote as ``{}``).

Examples
--------
>>> op_target("Functional.gelu.0.forward")
('function', 'torch.nn.functional.gelu')
>>> text = repro_script("data_samples/tensor_bug/baseline", "Functional.gelu.0.forward")  # doctest: +SKIP
>>> "OP = 'Functional.gelu'" in text  # doctest: +SKIP
True
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from precnb.repro._args import ReproError, autocast_dtype, call_source, outputs, render_args
from precnb.repro._oplist import CALLABLE, LISTED

__all__ = ["ReproError", "allowed_op", "op_target", "render_args", "repro_script"]

_TARGETS = {
    "Functional": "torch.nn.functional.{}",
    "Torch": "torch.{}",
    "Tensor": "torch.Tensor.{}",
    "VF": "torch._VF.{}",
    "Aten": "torch.ops.aten.{}",
}
_NODE = re.compile(r"^(?P<pre>[A-Za-z]+)\.(?P<api>.+)\.(?P<call>\d+)\.(?P<dir>forward|backward)$")


def allowed_op(prefix: str, api: str) -> bool:
    """Whether ``prefix.api`` is an operator the repro may call (on :data:`CALLABLE`).

    Examples
    --------
    >>> allowed_op("Torch", "matmul"), allowed_op("Torch", "builtins.exec"), allowed_op("Tensor", "__class__")
    (True, False, False)
    """
    return api in CALLABLE.get(prefix, ())


def op_target(node: str) -> tuple[str, str]:
    """How the op of *node* is called: ``("function", "torch.nn.functional.linear")`` or ``("method", "add_")``.

    Raises
    ------
    ReproError
        For modules, backward records, collectives, torch_npu, other prefixes, and any API name
        that is not an operator on the allow-list (:func:`allowed_op`).

    Examples
    --------
    >>> op_target("Functional.linear.0.forward")
    ('function', 'torch.nn.functional.linear')
    >>> op_target("Tensor.masked_fill.0.forward")
    ('method', 'masked_fill')
    """
    m = _NODE.match(node)
    if node.startswith(("Module.", "Cell.")) or ".parameters_grad" in node:
        raise ReproError(f"{node} is a module record: repro one of the API nodes inside it")
    if m is None:
        raise ReproError(f"{node} is not an API node name ({{Prefix}}.{{api}}.{{call}}.forward)")
    if m["dir"] == "backward":
        raise ReproError(f"{node} is a backward record (it needs the autograd graph): repro "
                         f"{node[: -len('backward')]}forward instead")
    pre, api = m["pre"], m["api"]
    if pre in ("Distributed", "MintDistributed") and api in LISTED.get("Distributed", ()):
        raise ReproError(f"{node} is a collective: it needs a process group of all ranks, not one op")
    if pre in ("NPU", "MindSpeed") and api in LISTED.get(pre, ()):
        raise ReproError(f"{node} is a torch_npu op: rebuild it where torch_npu is installed")
    if pre not in _TARGETS:
        raise ReproError(f"{node}: prefix {pre!r} is not a PyTorch API this repro can call "
                         "(Functional, Torch, Tensor, VF, Aten)")
    if not allowed_op(pre, api):
        raise ReproError(f"{node}: {pre}.{api} is not an operator precnb may call (only the torch operators "
                         "msprobe hooks are rebuilt: a dump cannot make the script call anything else)")
    return ("method", api) if pre == "Tensor" else ("function", _TARGETS[pre].format(api))


def _find_node(data: dict[str, Any], node: str) -> str:
    if node in data:
        return node
    stem = re.sub(r"\.(input|output|kwargs|parameters)(\..*)?$", "", node)
    if stem in data:
        return stem
    close = difflib.get_close_matches(node, list(data), n=3)
    raise ReproError(f"no node {node!r} in this dump" + (f"; did you mean {', '.join(close)}?" if close else ""))


def _record(ds: Any, step: int | None, rank: int | None) -> tuple[int, int, Path, dict[str, Any]]:
    """``(step, rank, rank folder, dump.json document)`` of the record asked for."""
    from precnb.io._jsonio import load_json
    from precnb.io.tensors import rank_folders

    folders = rank_folders(ds)
    if not folders:
        raise ReproError("this run does not say where its dump folders are (open it from the dump path)")
    s = int(step) if step is not None else min(k[0] for k in folders)
    ranks = [k[1] for k in folders if k[0] == s]
    r = int(rank) if rank is not None else (min(ranks) if ranks else 0)
    folder = folders.get((s, r))
    if folder is None:
        raise ReproError(f"no dump folder for step {s}, rank {r} (have {sorted(folders)})")
    doc = load_json(folder / "dump.json")
    if not isinstance(doc, dict) or not isinstance(doc.get("data"), dict):
        raise ReproError(f"{folder / 'dump.json'}: no 'data' object")
    if str(doc.get("framework", "")).lower() == "mindspore":
        raise ReproError(f"{folder / 'dump.json'}: a MindSpore dump: this repro reruns PyTorch ops only")
    return s, r, folder, doc


_TENSOR_ARG = re.compile(r"T\('(?:[^'\\]|\\.)*'\)")


def _replica(ds: Any, step: int, rank: int, node: str, call: str, outs: list[tuple[str, str, str]]
             ) -> dict[str, Any]:
    """The same call on replica *rank*: its data folder, input and output files (checked to be the same call)."""
    _, _, folder, doc = _record(ds, step, rank)
    record = doc["data"].get(node)
    if not isinstance(record, dict):
        raise ReproError(f"replica rank {rank} has no record {node} at step {step}")
    args, kwargs, files = render_args(record)
    mine = call_source(args, kwargs)
    if _TENSOR_ARG.sub("T()", mine) != _TENSOR_ARG.sub("T()", call):
        raise ReproError(f"{node}: rank {rank}'s call differs from this rank's in its scalar arguments or structure "
                         f"({mine[:160]} vs {call[:160]}): it differs by design, not a replica to compare with")
    theirs = outputs(record.get("output"))
    if [(i, d) for i, _, d in theirs] != [(i, d) for i, _, d in outs]:
        raise ReproError(f"{node}: rank {rank} saved other outputs ({theirs[:4]}) than this rank ({outs[:4]})")
    return {"data": str(folder / "dump_tensor_data"), "inputs": files, "outputs": theirs}


def repro_script(run: Any, node: str, *, step: int | None = None, rank: int | None = None,
                 replicas: Sequence[int] = ()) -> str:
    """The text of a standalone Python script that reruns one dumped op and checks its outputs.

    Parameters
    ----------
    run : path or xarray.Dataset
        A tensor-mode msprobe dump (any level a reader accepts) or a dataset opened from one.
    node : str
        The API node (``Functional.linear.0.forward``), or one of its tensor labels.
    step, rank : int, optional
        Which record (default: the first step and rank of the run).
    replicas : sequence of int, optional
        Ranks holding a replica of the same call (a replica departure: the other ranks of its TP/DP
        group). The script then also checks that their dumped inputs are bit-identical to this rank's
        and says whose dumped output the recomputation agrees with: the side it disagrees with
        computed the op wrongly (a device fault there), see the script's ``--help``.

    Returns
    -------
    str
        Python source (it compiles; it runs where torch is installed).

    Raises
    ------
    ReproError
        What cannot be rebuilt, naming the node or argument.
    """
    import xarray as xr

    from precnb._version import __version__

    ds = run if isinstance(run, xr.Dataset) else None
    if ds is None:
        from precnb.io.api import open_run

        wanted = None if rank is None else sorted({int(rank), *(int(q) for q in replicas)})
        ds = open_run(run, steps=None if step is None else [step], ranks=wanted, progress=None)
    s, r, folder, doc = _record(ds, step, rank)
    data = doc["data"]
    node = _find_node(data, node)
    how, target = op_target(node)
    record = data[node]
    if not isinstance(record, dict):
        raise ReproError(f"{node}: not a node record")
    args, kwargs, files = render_args(record)
    if not files:
        raise ReproError(f"{node}: no input was saved as a file (dump with task=tensor)")
    outs = outputs(record.get("output"))
    if not outs:
        raise ReproError(f"{node}: no output was saved as a file: nothing to compare with")
    if how == "method" and not (args and args[0].startswith("T(")):
        raise ReproError(f"{node}: a Tensor method needs its tensor as input_args.0")
    op = node.rsplit(".", 2)[0]
    call = call_source(args, kwargs)
    others = [int(q) for q in dict.fromkeys(replicas) if int(q) != r]
    reps = {q: _replica(ds, s, q, node, call, outs) for q in others}
    return _render(node=node, op=op, target=target if how == "function" else f"torch.Tensor.{target}",
                   step=s, rank=r, version=__version__, dump_json=str(folder / "dump.json"),
                   data_dir=str(folder / "dump_tensor_data"), call=call, outputs=outs,
                   inputs=files, autocast=autocast_dtype(record, outs), replicas=reps)


_HEADER = '''#!/usr/bin/env python3
"""Repro of {node} (step {step}, rank {rank}), generated by precnb {version}.

The record is SOURCE's (below). Loads the op's dumped inputs, reruns it with torch and compares
its outputs with the dumped ones (msprobe compare's cosine, max abs / relative error, and the
relative L2 error). Exit status: 0 every output reproduces, 1 one does not, 2 the script could
not run (the op is refused or fails, a file cannot be read, torch is missing).

    python this_script.py [--data DIR] [--device cpu|cuda|npu:0] [--rtol R] [--json]

With replicas (REPLICAS below: the other ranks of a replica departure) it also checks that their
dumped inputs are bit-identical to this rank's and compares the recomputation with every replica's
dumped output: the ranks it disagrees with computed the op wrongly (on identical inputs: a device
fault there, or a non-deterministic kernel). Exit status then: 0 the recomputation agrees with some
replicas and not the others (the wrong side is named), 1 undecided (it agrees with all or none, or
the inputs differ), 2 the script could not run. --replica-data RANK=DIR moves a replica's files.

The op is called only through call(OP, ...), which refuses an OP that is not on the allow-list
below (the torch operators msprobe hooks) or does not resolve to a genuine torch operator.
Tensors are read safely: torch.load(weights_only=True), numpy.load(allow_pickle=False).
"""

'''


def _allowed_source(op: str) -> str:
    prefix = op.split(".", 1)[0]
    names = sorted(CALLABLE[prefix])
    lines, line = [], ""
    for name in names:
        if len(line) + len(name) + 1 > 108:
            lines.append(line)
            line = ""
        line = f"{line} {name}" if line else name
    lines.append(line)
    body = "\n".join(lines)
    return f'ALLOWED = frozenset(f"{prefix}.{{name}}" for name in """\n{body}\n""".split())'


def _render(*, node: str, op: str, target: str, step: int, rank: int, version: str, dump_json: str, data_dir: str,
            call: str, outputs: list[tuple[str, str, str]], inputs: list[str], autocast: str | None,
            replicas: dict[int, dict[str, Any]]) -> str:
    body = (Path(__file__).with_name("_script.py")).read_text(encoding="utf-8")
    _, _, rest = body.partition("# <body>\n")
    code, _, tail = rest.partition("# <record>\n")
    _, _, tail = tail.partition("# </record>\n")
    if not code or not tail:  # pragma: no cover - the package is broken
        raise ReproError("precnb's repro script template is incomplete (reinstall precnb)")
    record = "\n".join([
        "# <record>: the dumped record, data only (call() checks OP against ALLOWED before anything runs)",
        f"NODE = {node!r}",
        f"OP = {op!r}  # {target}",
        f"SOURCE = {dump_json!r}",
        f"DATA = Path({data_dir!r})",
        f"INPUTS = {inputs!r}",
        f"OUTPUTS = {outputs!r}  # (index in the result, dumped file, dumped dtype)",
        f"AUTOCAST = {autocast!r}  # the op ran under torch.autocast with this dtype (fp32 inputs, low-precision "
        "output)",
        f"RANK = {int(rank)!r}",
        "# replicas of the same call (rank -> its data folder, input files in INPUTS' order, outputs as OUTPUTS)",
        f"REPLICAS = {replicas!r}",
        _allowed_source(op),
        "",
        "",
        "def run_op():",
        '    """The dumped call: its arguments exactly as dump.json recorded them."""',
        f"    return {call}",
        "# </record>",
        "",
    ])
    header = _HEADER.format(node=node, step=int(step), rank=int(rank), version=version)
    return header + code + record + tail
