"""Reader for MindSpore kernel dumps in tensor layout (one ``.npy`` per kernel input/output).

Layout (MindSpore's e2e / kbyk dump with ``saved_data: "tensor"``, the only mode on CPU)::

    <root>/rank_<id>/<net_name>/<graph_id>/<iteration>/
        <op_type>.<op_name>.<task_id>.<stream_id>.<timestamp>.<input|output>.<slot>.<format>[.<dtype>].npy
        Parameter.<name>.<task_id>.<stream_id>.<timestamp>.output.0.<format>[.<dtype>].npy
        mapping.csv            (stored name -> original name, for hashed long names)
    <root>/rank_<id>/{graphs/*.ir, execution_order/*.csv, .dump_metadata/}

*path* may be the root, a ``rank_<id>`` folder, a net, graph or iteration folder. Each
(iteration, rank) becomes one (step, rank) record: ``step`` is the iteration folder's number,
``rank`` the ``rank_<id>`` number (0 when absent); the graphs of one iteration are merged.

Values: ``max``, ``min``, ``mean`` and ``norm`` (``sqrt(sum(x*x))``) are computed from the file in
float64 from the stored dtype (``x = a.astype(float64)``; NaN and ±inf kept as numpy gives them),
with ``nan_count``, ``pos_inf_count``, ``neg_inf_count`` and ``zero_count``; an empty tensor has
null statistics. Files above :data:`CHUNK` elements are reduced in chunks (same max/min/counts;
sums may differ from one numpy call in the last bits). ``numel``, ``shape`` come from the array,
``dtype`` from the file name (numpy's name when the name has none). Files are read with
``allow_pickle=False``: an object array, a truncated or otherwise broken file is skipped and named
in the load report; the other files still load.

Order: ``seq`` is the order of the files' timestamps within (step, rank) (ties by name, input
before output, slot). On CPU the execution-order CSV does not match the files (names without
files, files it does not list), so it is only used for names; ``attrs["kernel_order"]`` says so,
and the load report warns where the CSV and the files disagree.

Names: tensor labels are ``"<kernel>.<input|output>.<slot>"`` (``.1``, ``.2``, ... for repeats in
timestamp order) and ``node`` is ``<kernel>``, the full ``/``-separated scope name where the
rank's graph IR or execution-order CSV lists it, else the file's ``_``-name; ``module`` is the
path of cells below the network cell (:mod:`precnb.io.mindspore._names`); ``api`` the op type;
``direction`` forward / backward / optimizer from the scope. ``Parameter.<name>`` files are
``role="parameter"`` (their value after the iteration's optimizer step), optimizer states
``"state"``; a kernel input that reads a parameter (per the IR, same shape) has
``role="parameter"`` and ``attrs["kernel_parameters"]`` maps its label to the parameter name.

Examples
--------
>>> is_ms_kernel_tensors("/nonexistent")
False
>>> parse_file_name("Mul.Default_net-Net_Mul-op1.0.0.17961.input.1.DefaultFormat.Float32.npy")["slot"]
1
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal

import xarray as xr

from precnb.errors import DumpFormatError, NotADumpError
from precnb.io._assemble import FileRecords, LoadReport, RecordBuilder, assemble, select_items
from precnb.io.executor import parse_files
from precnb.io.mindspore._files import CHUNK, EXTRA_STATS, load_npy, mapping, parse_file_name, tensor_stats
from precnb.io.mindspore._names import NameTable, direction_of, module_path, name_table
from precnb.io.mindspore._tensor_discover import KernelTensorItem, discover, is_ms_kernel_tensors
from precnb.io.readers import Reader

__all__ = ["CHUNK", "KernelTensorItem", "discover", "is_ms_kernel_tensors", "open_ms_kernel_tensors",
           "parse_file_name", "read_item", "tensor_stats"]

_KNOWN_OTHER = {"mapping.csv", "statistic.csv"}
ORDER_NOTE = ("seq is the order of the dump files' timestamps; MindSpore's execution-order CSV does not "
              "match the files on CPU (names without files, files it does not list)")


_STATE = re.compile(r"^(adam_m|adam_v|moment1|moment2|moments|accum|exp_avg|exp_avg_sq|mean_square|"
                    r"mean_grad|beta1_power|beta2_power)\.")


def param_role(name: str, is_weight: bool = True) -> str:
    """``parameter`` (a model weight), ``state`` (optimizer state or hyper-parameter) or ``input``.

    >>> param_role("net.norm_out.weight"), param_role("adam_m.net.norm_out.weight"), param_role("global_step")
    ('parameter', 'state', 'state')
    """
    if not is_weight:
        return "input"
    return "state" if _STATE.match(name) or "." not in name else "parameter"


def _parameter_coords(file_name: str, table: NameTable, net: str, root_attrs: list[str]) -> tuple[str, str, str, str]:
    """(node, module, role, direction) of a ``Parameter.<name>`` file."""
    known = table.params.get(file_name)
    if known is None:
        return f"Parameter.{file_name}", "", "parameter", ""
    name, _, weight = known
    role = param_role(name, weight)
    if role == "input":
        return f"Parameter.{name}", "", "input", "forward"
    m = _STATE.match(name)
    rest = name[m.end():] if m else name
    for k in range(len(root_attrs) + 1):
        prefix = ".".join(root_attrs[k:])
        if prefix and rest.startswith(prefix + "."):
            rest = rest[len(prefix) + 1:]
            break
    module = rest.rpartition(".")[0]
    if role == "state":  # optimizer states and hyper-parameters (global_step, learning_rate)
        return f"Parameter.{name}", module, "state", "optimizer"
    return f"Parameter.{name}", module, "parameter", ""


def _under_net(scope: str, net: str) -> bool:
    """Whether a ``/`` scope passes through a cell of class *net*."""
    return any(p.partition("-")[2] == net for p in scope.split("/"))


def _root_attrs(table: NameTable, net: str) -> list[str]:
    """Attributes of the cells from the top down to the network cell (``["network", "net"]``)."""
    for scope in table.scopes.values():
        parts = scope.split("/")
        classes = [p.partition("-")[2] for p in parts]
        if net and net in classes:
            return [p.partition("-")[0] for p in parts[1:classes.index(net) + 1] if "-" in p]
    return []


def read_item(item: KernelTensorItem) -> FileRecords:
    """Read the tensor files of one (step, rank) into columnar records (statistics from the arrays).

    A broken file is listed in ``meta["skipped"]`` and the others are still read; when no file
    can be read the first error is raised.
    """
    table = name_table(item.rank_dir) if item.rank_dir is not None else NameTable()
    root = _root_attrs(table, item.net_name)
    entries: list[tuple[tuple[Any, ...], Path, dict[str, Any]]] = []
    skipped: list[tuple[str, str]] = list(table.problems)
    for g, folder in enumerate(item.folders):
        renamed = mapping(folder)
        try:
            names = sorted(os.listdir(folder))
        except OSError as exc:
            skipped.append((str(folder), f"cannot list folder: {exc.strerror or exc}"))
            continue
        for fname in names:
            info = parse_file_name(renamed.get(fname, fname))
            if info is None:
                if fname not in _KNOWN_OTHER:
                    skipped.append((str(folder / fname), "ignored: not a kernel tensor file name"))
                continue
            order = (info["ts"], g, info["op_name"], info["io"] != "input", info["slot"])
            entries.append((order, folder / fname, info))
    entries.sort(key=lambda e: e[0])
    b = RecordBuilder(item.step, item.rank, extra_stats=EXTRA_STATS)
    counts: dict[str, int] = {}
    params: dict[str, str] = {}
    first_error: DumpFormatError | None = None
    kernels: set[str] = set()
    for _, path, info in entries:
        try:
            arr = load_npy(path)
            stats = tensor_stats(arr)
        except DumpFormatError as exc:
            first_error = first_error or exc
            skipped.append((str(path), exc.message))
            continue
        except (ValueError, TypeError) as exc:  # e.g. a structured dtype
            skipped.append((str(path), f"cannot compute statistics: {exc}"))
            continue
        dtype = info["dtype"] or arr.dtype.name
        if info["op_type"] == "Parameter":
            node, module, role, direction = _parameter_coords(info["op_name"], table, item.net_name, root)
            label = f"{node}.{info['io']}.{info['slot']}"
        else:
            kernels.add(info["op_name"])
            exact, scope = table.resolve(info["op_name"])
            node = exact or info["op_name"]
            # with the network cell in the dump, kernels outside it (loss wrapper, optimizer) have no module
            inside = scope is not None and (not root or _under_net(scope, item.net_name))
            module = module_path(scope, item.net_name, is_scope=True) if scope and inside else ""
            direction, role = direction_of(exact or scope or ""), info["io"]
            label = f"{node}.{info['io']}.{info['slot']}"
            read = table.reads.get(exact, {}).get(info["slot"]) if exact and role == "input" else None
            known = table.params.get(read.replace(".", "_")) if read else None
            if read and known is not None and known[1] == tuple(arr.shape) and param_role(read, known[2]) != "input":
                role = param_role(read, known[2])
                if role == "parameter":
                    params[label] = read
        k = counts.get(label, 0)
        counts[label] = k + 1
        if k:
            if label in params:
                params[f"{label}.{k}"] = params[label]
            label = f"{label}.{k}"
        b.add(label, stats, shape=list(arr.shape), node=node, module=module, api=info["op_type"], kind="kernel",
              direction=direction, role=role, dtype=dtype)
    if first_error is not None and not b.labels:
        raise first_error
    listed = table.order_names
    mismatch = (len(listed - kernels), len(kernels - listed)) if listed and kernels else (0, 0)
    return b.build(meta={"framework": "mindspore", "task": "tensor", "path": item.path, "skipped": skipped,
                         "order_mismatch": mismatch, "kernel_parameters": params, "names_from": table.sources})


def open_ms_kernel_tensors(
    path: str | Path,
    *,
    steps: Sequence[int] | None = None,
    ranks: Sequence[int] | None = None,
    errors: Literal["report", "raise"] = "report",
    progress: bool | None = None,
    client: Any = None,
    workers: int | str | None = None,
) -> xr.Dataset:
    """Open a MindSpore tensor-layout kernel dump as a canonical dataset.

    Parameters
    ----------
    path : str or Path
        The dump root, a ``rank_<id>`` folder, or a net, graph or iteration folder.
    steps, ranks : sequence of int, optional
        Load only these iterations / ranks.
    errors : {"report", "raise"}
        ``"report"`` skips unreadable files (``precnb.load_report(ds)``); ``"raise"`` stops at the first.
    progress : bool, optional
    client : dask.distributed.Client, optional
        Parse on this cluster, one task per (step, rank).
    workers : int, "auto" or None
        Local worker processes when there is no client.

    Returns
    -------
    xarray.Dataset
        ``source_format == "kernel_tensors"``, ``kind == "kernel"``; attrs ``kernel_order``,
        ``kernel_parameters``, ``rank_dirs``, ``load_report``.

    Raises
    ------
    NotADumpError
        When nothing could be read.

    Examples
    --------
    >>> ds = open_ms_kernel_tensors("dump/rank_0")  # doctest: +SKIP
    """
    report = LoadReport()
    items = select_items(discover(path, report), steps, ranks)
    if not items:
        raise NotADumpError(f"{path}: no iteration folder matches the selection")
    parse: Callable[[KernelTensorItem], FileRecords] = read_item
    recs = parse_files(items, parse, describe=lambda i: i.path, report=report, errors=errors, client=client,
                       progress=progress, workers=workers)
    params: dict[str, str] = {}
    sources: list[str] = []
    mismatched: dict[int, list[tuple[int, tuple[int, int]]]] = {}
    for rec in recs:
        seen = {p for p, _ in report.skipped}
        report.skipped.extend(s for s in rec.meta.get("skipped", ()) if s[0] not in seen)
        if any(rec.meta.get("order_mismatch", (0, 0))):
            mismatched.setdefault(rec.rank, []).append((rec.step, rec.meta["order_mismatch"]))
        for k, v in rec.meta.get("kernel_parameters", {}).items():
            params.setdefault(k, v)
        sources += [s for s in rec.meta.get("names_from", ()) if s not in sources]
    for rank, found in sorted(mismatched.items()):
        step, (missing, extra) = found[0]
        report.warnings.append(f"rank {rank}: the execution-order CSV lists {missing} kernel(s) without dump files "
                               f"and misses {extra} dumped kernel(s) (step {step}; {len(found)} step(s) alike): "
                               "kernels are ordered by dump-file timestamp")
    if not recs:
        reasons = "; ".join(f"{p}: {r}" for p, r in report.skipped[:3])
        raise NotADumpError(f"{path}: no kernel dump file could be read ({reasons})")
    if errors == "raise" and report.failures:
        p, r = report.failures[0]
        raise DumpFormatError(p, r)
    return assemble(recs, source_format="kernel_tensors", steps=[i.step for i in items], ranks=[i.rank for i in items],
                    attrs={"source": str(path), "kernel_order": ORDER_NOTE, "kernel_names_from": json.dumps(sources),
                           "kernel_parameters": json.dumps(params),
                           "rank_dirs": json.dumps({f"{i.step},{i.rank}": i.path for i in items}),
                           "load_report": json.dumps(report.to_dict())})


def _open(path: Path, **options: Any) -> xr.Dataset:
    keep = ("errors", "client", "progress", "steps", "ranks", "workers")
    return open_ms_kernel_tensors(path, **{k: options[k] for k in keep if k in options})


READER = Reader(name="kernel_tensors", can_open=is_ms_kernel_tensors, open=_open, detect_priority=35)
