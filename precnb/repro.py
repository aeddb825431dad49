"""A standalone one-op repro script from a tensor-mode dump: :func:`repro_script`.

The script loads the dumped inputs of one API node (``Functional.*``, ``Torch.*``, ``Tensor.*``,
``VF.*``, ``Aten.*``), calls the op with torch (positional and keyword arguments, scalars,
dtypes, ``None`` exactly as dump.json recorded them), compares each output with the dumped one
(cosine, max abs / relative error, relative L2 error as msprobe compare computes them), prints the
metrics and exits 0 when every output reproduces, 1 when one does not, 2 when a file cannot be
read — so the op can be re-run on another device or torch version (``--device``, ``--data``).
The script reads the tensors safely (``torch.load(weights_only=True)``,
``numpy.load(allow_pickle=False)``); it needs torch and numpy, not precnb.

Nodes that cannot be rebuilt raise :class:`ReproError` naming what is missing: modules (repro an
API inside them), backward records, collectives, torch_npu ops, and arguments that were not
saved (a tensor without ``data_name``, a process group, an object msprobe wrote as ``{}``).

Examples
--------
>>> text = repro_script("data_samples/tensor_bug/baseline", "Functional.gelu.0.forward")  # doctest: +SKIP
>>> "torch.nn.functional.gelu" in text  # doctest: +SKIP
True
"""

from __future__ import annotations

import difflib
import math
import re
from typing import Any

from precnb.errors import PrecnbError

__all__ = ["ReproError", "op_target", "render_args", "repro_script"]

_PREFIXES = {
    "Functional": "torch.nn.functional.{}",
    "Torch": "torch.{}",
    "VF": "torch._VF.{}",
    "Aten": "torch.ops.aten.{}",
}
_SCALARS = {"int", "float", "bool", "str", "complex", "float16", "float32", "float64", "int8", "int16",
            "int32", "int64", "uint8", "bool_"}
_SAFE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class ReproError(PrecnbError):
    """The node cannot be rebuilt as a standalone op call (the message says what is missing)."""


def op_target(node: str) -> tuple[str, str]:
    """How the op of *node* is called: ``("function", "torch.nn.functional.linear")`` or ``("method", "add_")``.

    Raises
    ------
    ReproError
        For modules, backward records, collectives, torch_npu and other prefixes.

    Examples
    --------
    >>> op_target("Functional.linear.0.forward")
    ('function', 'torch.nn.functional.linear')
    >>> op_target("Tensor.masked_fill.0.forward")
    ('method', 'masked_fill')
    """
    m = re.match(r"^(?P<pre>[A-Za-z]+)\.(?P<api>.+)\.(?P<call>\d+)\.(?P<dir>forward|backward)$", node)
    if node.startswith(("Module.", "Cell.")) or ".parameters_grad" in node:
        raise ReproError(f"{node} is a module record: repro one of the API nodes inside it")
    if m is None:
        raise ReproError(f"{node} is not an API node name ({{Prefix}}.{{api}}.{{call}}.forward)")
    if m["dir"] == "backward":
        raise ReproError(f"{node} is a backward record (it needs the autograd graph): repro "
                         f"{node[: -len('backward')]}forward instead")
    pre, api = m["pre"], m["api"]
    if not all(_SAFE_NAME.match(part) for part in api.split(".")):
        raise ReproError(f"{node}: API name {api!r} is not a Python identifier")
    if pre == "Tensor":
        if "." in api:
            raise ReproError(f"{node}: {api!r} is not a Tensor method name")
        return "method", api
    if pre in _PREFIXES:
        return "function", _PREFIXES[pre].format(api)
    if pre in ("Distributed", "MintDistributed"):
        raise ReproError(f"{node} is a collective: it needs a process group of all ranks, not one op")
    if pre == "NPU":
        raise ReproError(f"{node} is a torch_npu op: rebuild it where torch_npu is installed")
    raise ReproError(f"{node}: prefix {pre!r} is not a PyTorch API this repro can call "
                     "(Functional, Torch, Tensor, VF, Aten)")


def _float_expr(v: Any) -> str:
    x = float(v)
    if math.isnan(x):
        return 'float("nan")'
    if math.isinf(x):
        return 'float("inf")' if x > 0 else 'float("-inf")'
    return repr(x)


def _leaf_expr(leaf: Any, where: str, files: list[str]) -> str:
    """Python source for one dump.json leaf (tensor files are appended to *files*)."""
    if leaf is None:
        return "None"
    if isinstance(leaf, list):
        inner = [_leaf_expr(x, f"{where}.{i}", files) for i, x in enumerate(leaf)]
        return "[" + ", ".join(inner) + "]"
    if not isinstance(leaf, dict):
        raise ReproError(f"{where}: unexpected value {str(leaf)[:60]!r} in dump.json")
    kind = leaf.get("type")
    if not isinstance(kind, str):
        if not leaf:
            raise ReproError(f"{where}: msprobe recorded an object it could not serialise ({{}}); "
                             "it cannot be rebuilt")
        parts = [f"{k!r}: {_leaf_expr(v, f'{where}.{k}', files)}" for k, v in leaf.items()]
        return "{" + ", ".join(parts) + "}"
    if "Tensor" in kind or "Parameter" in kind or kind.endswith("ndarray"):
        name = leaf.get("data_name")
        if not isinstance(name, str) or not name or name == "-1":
            raise ReproError(f"{where}: a {kind} without a saved file (dump with task=tensor to rebuild it)")
        files.append(name)
        return f"T({name!r})"
    value = leaf.get("value")
    if kind in ("float", "float16", "float32", "float64"):
        return _float_expr(value)
    if kind in _SCALARS:
        if isinstance(value, bool | int | str) or value is None:
            return repr(value)
        if isinstance(value, float):
            return _float_expr(value)
        raise ReproError(f"{where}: scalar of type {kind} with value {str(value)[:40]!r}")
    if kind == "slice" and isinstance(value, list) and len(value) == 3:
        return "slice(" + ", ".join("None" if x is None else repr(int(x)) for x in value) + ")"
    if kind == "ellipsis":
        return "Ellipsis"
    if kind == "torch.Size" and isinstance(value, list):
        return "torch.Size(" + repr([int(x) for x in value]) + ")"
    if kind in ("torch.dtype", "mindspore.dtype") and isinstance(value, str) and value.startswith("torch."):
        attr = value[len("torch."):]
        if _SAFE_NAME.match(attr):
            return f"torch.{attr}"
    if kind == "torch.device":
        return "DEVICE"
    if kind == "torch.memory_format" and isinstance(leaf.get("format"), str) and _SAFE_NAME.match(leaf["format"]):
        return f"torch.{leaf['format']}"
    raise ReproError(f"{where}: a {kind} argument cannot be rebuilt in a standalone script")


def render_args(record: dict[str, Any]) -> tuple[list[str], dict[str, str], list[str]]:
    """``(positional sources, keyword sources, tensor files)`` of one forward API record.

    Examples
    --------
    >>> render_args({"input_args": [{"type": "torch.Tensor", "data_name": "x.pt"}, {"type": "int", "value": 2}],
    ...              "input_kwargs": {"keepdim": {"type": "bool", "value": True}}})
    (["T('x.pt')", '2'], {'keepdim': 'True'}, ['x.pt'])
    """
    files: list[str] = []
    args = [_leaf_expr(a, f"input_args.{i}", files) for i, a in enumerate(record.get("input_args") or [])]
    kwargs: dict[str, str] = {}
    for k, v in (record.get("input_kwargs") or {}).items():
        if not _SAFE_NAME.match(str(k)):
            raise ReproError(f"input_kwargs.{k}: not a keyword argument name")
        kwargs[str(k)] = _leaf_expr(v, f"input_kwargs.{k}", files)
    return args, kwargs, files


def _outputs(value: Any, path: str = "") -> list[tuple[str, str, str]]:
    """``(index path, data_name, dtype)`` of every saved output tensor."""
    out: list[tuple[str, str, str]] = []
    if isinstance(value, list):
        for i, x in enumerate(value):
            out += _outputs(x, f"{path}.{i}" if path else str(i))
    elif isinstance(value, dict):
        name = value.get("data_name")
        if isinstance(value.get("type"), str) and isinstance(name, str) and name and name != "-1":
            out.append((path, name, str(value.get("dtype", ""))))
        elif not isinstance(value.get("type"), str):
            for k, x in value.items():
                out += _outputs(x, f"{path}.{k}" if path else str(k))
    return out


def _find_node(data: dict[str, Any], node: str) -> str:
    if node in data:
        return node
    stem = re.sub(r"\.(input|output|kwargs|parameters)(\..*)?$", "", node)
    if stem in data:
        return stem
    close = difflib.get_close_matches(node, list(data), n=3)
    raise ReproError(f"no node {node!r} in this dump" + (f"; did you mean {', '.join(close)}?" if close else ""))


def repro_script(run: Any, node: str, *, step: int | None = None, rank: int | None = None) -> str:
    """The text of a standalone Python script that reruns one dumped op and checks its outputs.

    Parameters
    ----------
    run : path or xarray.Dataset
        A tensor-mode msprobe dump (any level a reader accepts) or a dataset opened from one.
    node : str
        The API node (``Functional.linear.0.forward``), or one of its tensor labels.
    step, rank : int, optional
        Which record (default: the first step and rank of the run).

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
    from precnb.io._jsonio import load_json
    from precnb.io.tensors import rank_folders

    ds = run if isinstance(run, xr.Dataset) else None
    if ds is None:
        from precnb.io.api import open_run

        ds = open_run(run, steps=None if step is None else [step], ranks=None if rank is None else [rank],
                      progress=None)
    folders = rank_folders(ds)
    if not folders:
        raise ReproError("this run does not say where its dump folders are (open it from the dump path)")
    s = int(step) if step is not None else min(k[0] for k in folders)
    r = int(rank) if rank is not None else min(k[1] for k in folders if k[0] == s)
    folder = folders.get((s, r))
    if folder is None:
        raise ReproError(f"no dump folder for step {s}, rank {r} (have {sorted(folders)})")
    dump_json = folder / "dump.json"
    doc = load_json(dump_json)
    data = doc.get("data") if isinstance(doc, dict) else None
    if not isinstance(data, dict):
        raise ReproError(f"{dump_json}: no 'data' object")
    node = _find_node(data, node)
    how, target = op_target(node)
    record = data[node]
    if not isinstance(record, dict):
        raise ReproError(f"{node}: not a node record")
    args, kwargs, files = render_args(record)
    if not files:
        raise ReproError(f"{node}: no input was saved as a file (dump with task=tensor)")
    outputs = _outputs(record.get("output"))
    if not outputs:
        raise ReproError(f"{node}: no output was saved as a file: nothing to compare with")
    autocast = _autocast_dtype(record, outputs)
    if how == "method":
        if not args or not args[0].startswith("T("):
            raise ReproError(f"{node}: a Tensor method needs its tensor as input_args.0")
        call = f"{args[0]}.{target}({', '.join([*args[1:], *(f'{k}={v}' for k, v in kwargs.items())])})"
    else:
        call = f"{target}({', '.join([*args, *(f'{k}={v}' for k, v in kwargs.items())])})"
    return _TEMPLATE.format(
        node=node, step=s, rank=r, version=__version__, dump_json=str(dump_json),
        data_dir=str(folder / "dump_tensor_data"), call=call, outputs=repr(outputs), inputs=repr(files),
        autocast=repr(autocast),
    )


def _input_dtypes(value: Any) -> set[str]:
    out: set[str] = set()
    if isinstance(value, list):
        for x in value:
            out |= _input_dtypes(x)
    elif isinstance(value, dict):
        if isinstance(value.get("type"), str):
            if isinstance(value.get("dtype"), str):
                out.add(value["dtype"])
        else:
            for x in value.values():
                out |= _input_dtypes(x)
    return out


def _autocast_dtype(record: dict[str, Any], outputs: list[tuple[str, str, str]]) -> str | None:
    """``"bfloat16"`` / ``"float16"`` when the op evidently ran under autocast.

    That is: every float output has that dtype and no input does (an fp32 linear whose output is
    bf16 was autocast), so the script reruns it under ``torch.autocast`` too.
    """
    low = {d for _, _, d in outputs if d in ("torch.bfloat16", "torch.float16")}
    floats = {d for _, _, d in outputs if "float" in d}
    if len(low) != 1 or floats != low:
        return None
    (dtype,) = low
    inputs = _input_dtypes([record.get("input_args"), record.get("input_kwargs")])
    if dtype in inputs or not any("float" in d for d in inputs):
        return None
    return dtype.replace("torch.", "")


_TEMPLATE = '''#!/usr/bin/env python3
"""Repro of {node} (step {step}, rank {rank}), generated by precnb {version}.

The record is SOURCE's (below). Loads the op's dumped inputs, reruns it with torch and compares
its outputs with the dumped ones (msprobe compare's cosine, max abs / relative error, and the
relative L2 error). Exit status: 0 every output reproduces, 1 one does not, 2 a file cannot be
read or the op fails.

    python this_script.py [--data DIR] [--device cpu|cuda|npu:0] [--rtol R]

Tensors are read safely: torch.load(weights_only=True), numpy.load(allow_pickle=False).
"""

import argparse
import contextlib
import sys
from pathlib import Path

import numpy as np
import torch

NODE = {node!r}
SOURCE = {dump_json!r}
DATA = Path({data_dir!r})
INPUTS = {inputs}
OUTPUTS = {outputs}  # (index in the result, dumped file, dumped dtype)
AUTOCAST = {autocast}  # the op ran under torch.autocast with this dtype (fp32 inputs, low-precision output)
RTOL = {{"bfloat16": 2.0 ** -8, "float16": 2.0 ** -11, "float32": 2.0 ** -14, "float64": 2.0 ** -40}}


def load(name):
    path = ARGS.data / name
    if path.suffix == ".npy":
        return torch.from_numpy(np.load(path, allow_pickle=False))
    return torch.load(path, weights_only=True, map_location="cpu")


def T(name):  # noqa: N802 - an input tensor, on the chosen device
    return load(name).to(DEVICE)


def pick(result, index):
    if index == "0" and isinstance(result, torch.Tensor):
        return result
    for part in index.split("."):
        result = result[int(part)] if isinstance(result, (list, tuple)) else result[part]
    return result


def as_numpy(t):
    t = t.detach().cpu()
    if t.dtype == torch.bfloat16 or "float8" in str(t.dtype):
        t = t.float()
    return t.numpy()


def metrics(out, ref):
    """msprobe compare's metrics (float64), plus the relative L2 error."""
    n, b = np.squeeze(as_numpy(out)), np.squeeze(as_numpy(ref))
    if n.shape != b.shape:
        return {{"status": f"shape {{list(n.shape)}} vs dumped {{list(b.shape)}}"}}
    n64, b64 = n.astype(np.float64).reshape(-1), b.astype(np.float64).reshape(-1)
    bad_n, bad_b = ~np.isfinite(n64), ~np.isfinite(b64)
    if not (np.array_equal(bad_n, bad_b) and np.array_equal(n64[bad_n], b64[bad_b], equal_nan=True)):
        return {{"status": "NaN/inf at different positions or signs"}}
    n64, b64 = np.where(bad_n, 0.0, n64), np.where(bad_b, 0.0, b64)
    d = n64 - b64
    ref_norm = float(np.linalg.norm(b64))
    out = {{"status": "ok", "bitwise_equal": bool(n.dtype == b.dtype and n.tobytes() == b.tobytes()),
           "max_abs_err": float(np.max(np.abs(d))) if d.size else 0.0,
           "rel_l2_err": float(np.linalg.norm(d)) / ref_norm if ref_norm else (0.0 if not d.any() else float("inf"))}}
    bb = np.where(b64 == 0, np.finfo(np.float64).eps, b64)
    rel = np.abs((np.where(b64 == 0, n64 + np.finfo(np.float64).eps, n64) - bb) / bb)
    out["max_rel_err"] = float(np.max(rel)) if rel.size else 0.0
    if n64.size > 1:
        na, nb = np.linalg.norm(n64), np.linalg.norm(b64)
        out["cosine"] = 1.0 if na == nb == 0 else (float(np.dot(n64, b64) / (na * nb)) if na and nb else float("nan"))
        out["one_thousandth_err_ratio"] = float(np.mean(rel < 0.001))
    return out


def main():
    global ARGS, DEVICE
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", type=Path, default=DATA, help="folder of the dumped tensor files (default: %(default)s)")
    p.add_argument("--device", default="cpu", help="device to run the op on (default: cpu)")
    p.add_argument("--rtol", type=float, help="relative L2 error allowed (default: by dtype, fp32 2^-14)")
    p.add_argument("--autocast", default=AUTOCAST, help="autocast dtype, or 'none' (default: %(default)s)")
    ARGS = p.parse_args()
    DEVICE = torch.device(ARGS.device)
    auto = None if str(ARGS.autocast).lower() == "none" else ARGS.autocast
    region = torch.autocast(DEVICE.type, dtype=getattr(torch, auto)) if auto else contextlib.nullcontext()
    try:
        with torch.no_grad(), region:
            result = {call}
    except (OSError, RuntimeError, ValueError, TypeError) as exc:
        print(f"{{NODE}}: could not rerun the op: {{type(exc).__name__}}: {{exc}}", file=sys.stderr)
        return 2
    ok = True
    print(f"{{NODE}} on {{DEVICE}}, torch {{torch.__version__}}" + (f", under autocast {{auto}}" if auto else ""))
    for index, name, dtype in OUTPUTS:
        try:
            ref = load(name)
            got = pick(result, index)
        except (OSError, RuntimeError, KeyError, IndexError, TypeError) as exc:
            print(f"  output {{index}}: cannot compare: {{exc}}", file=sys.stderr)
            return 2
        m = metrics(got, ref)
        rtol = ARGS.rtol if ARGS.rtol is not None else RTOL.get(dtype.replace("torch.", ""), 0.0)
        good = m["status"] == "ok" and m["rel_l2_err"] <= rtol
        ok = ok and good
        shown = "  ".join(f"{{k}}={{v:.6g}}" if isinstance(v, float) else f"{{k}}={{v}}" for k, v in m.items())
        print(f"  output {{index}} ({{name}}): {{shown}}  -> {{'reproduced' if good else 'NOT reproduced'}}"
              f" (rel_l2_err <= {{rtol:.3g}})")
    print("REPRODUCED" if ok else "NOT REPRODUCED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
'''
