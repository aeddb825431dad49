"""Sample ``kernel_resume``: MindSpore's own kernel dump (tensor mode) of a correct and a bad resume.

A tiny GPT (1 decoder layer) is trained for a few iterations in GRAPH_MODE on CPU and saved to a
checkpoint (no dump); two resumed processes then train 2 more iterations under MindSpore's e2e
dump (``MINDSPORE_DUMP_CONFIG``, ``saved_data: "tensor"``; ``"statistic"`` is refused on CPU).
``correct`` loads the checkpoint; ``bad`` loads it through a stale key map that renames
``net.norm_out.weight``, so with ``strict_load=True`` that weight is not loaded and keeps its zero
initialisation (the seed incident: an RmsNorm weight input is 0 instead of ~0.9). The ground
truth (first kernel input that differs, ordered by dump-file timestamp; the parameter it reads)
is read back from the .npy files and the graph IR with numpy only, not with precnb.io.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from ._ms_run import mindspore_versions, require_mindspore, run_ms

REQUIRES = require_mindspore
CFG = {"vocab": 32, "hidden": 8, "heads": 2, "ffn": 16, "blocks": 1, "seq": 4, "batch": 1}
PRETRAIN_ITERATIONS = 4
ITERATIONS = 2
NET = "TinyGPT"
STALE = {"net.norm_out.weight": "net.final_norm.weight"}
_FILE = re.compile(r"^(?P<op_type>[^.]+)\.(?P<op_name>.+)\.(?P<task>\d+)\.(?P<stream>\d+)\.(?P<ts>\d+)\."
                   r"(?P<io>input|output)\.(?P<slot>\d+)\.(?P<format>[^.]+)\.(?P<dtype>[^.]+)\.npy$")
_FULLNAME = re.compile(r"# Fullname with scope: \((.*)\)$")
_NODE = re.compile(r"^\s*%(\d+)\([^)]*\) = ([A-Za-z_0-9]+)\((.*?)\)(?: \{| primitive_attrs| cnode_attrs|$)")


def _error(message: str) -> Exception:
    from ._scenarios import GroundTruthError

    return GroundTruthError(message)


def _check(cond: bool, message: str) -> None:
    if not cond:
        raise _error(message)


def dump_config(path: Path) -> dict[str, Any]:
    """The e2e dump configuration (as in the shared S14 sample), writing to *path*."""
    return {"common_dump_settings": {"dump_mode": 0, "path": str(path), "net_name": NET, "iteration": "all",
                                     "saved_data": "tensor", "input_output": 0, "kernels": [],
                                     "support_device": [0], "statistic_category": ["max", "min", "l2norm"]},
            "e2e_dump_settings": {"enable": True, "trans_flag": True}}


def kernel_files(folder: Path) -> list[dict[str, Any]]:
    """The .npy files of one iteration folder, parsed from their names, in timestamp order."""
    out = []
    for f in folder.iterdir():
        m = _FILE.match(f.name)
        _check(m is not None, f"unexpected file name {f}")
        assert m is not None
        out.append({**m.groupdict(), "ts": int(m["ts"]), "slot": int(m["slot"]), "file": f.name})
    return sorted(out, key=lambda r: (r["ts"], r["op_name"], r["io"], r["slot"]))


def ir_names(ir: Path) -> tuple[dict[str, str], dict[str, dict[int, str]]]:
    """From the graph IR: ``_``-name -> full scope name, and full name -> {input slot: parameter read}.

    A kernel input reads a parameter when its argument is ``%paraN_<name>`` or a ``Load`` of one.
    """
    full: dict[str, str] = {}
    params: dict[str, dict[int, str]] = {}
    loads: dict[str, str] = {}
    pending: tuple[str, str, list[str]] | None = None
    for line in ir.read_text(encoding="utf-8").splitlines():
        m = _NODE.match(line)
        if m:
            pending = (m[1], m[2], [a.strip() for a in m[3].split(",")])
            continue
        f = _FULLNAME.search(line.strip())
        if f and pending is not None:
            name = f[1]
            full[name.replace("/", "_")] = name
            node_id, op, args = pending
            if op == "Load" and args and args[0].startswith("%para"):
                loads[node_id] = args[0].split("_", 1)[1]
            reads = {}
            for i, a in enumerate(args):
                if a.startswith("%para"):
                    reads[i] = a.split("_", 1)[1]
                elif a.startswith("%") and a[1:] in loads:
                    reads[i] = loads[a[1:]]
            if reads:
                params[name] = reads
            pending = None
    return full, params


def stats(path: Path) -> dict[str, Any]:
    """max/min/mean/norm in float64 of one .npy (numpy, no pickle)."""
    import numpy as np

    a = np.load(path, allow_pickle=False)
    x = a.astype(np.float64).ravel()
    return {"shape": list(a.shape), "dtype": str(a.dtype), "max": float(x.max()), "min": float(x.min()),
            "mean": float(x.mean()), "norm": float(np.sqrt(np.sum(x * x)))}


def _run(ctx: Any, sample: Path) -> dict[str, Any]:
    ckpt = ctx.log_dir / "kernel_resume_pretrained.ckpt"
    base = {"cfg": CFG, "lr": 1e-2, "weight_decay": 0.01}
    pre = run_ms("_ms_kernel_worker.py", {**base, "job": "pretrain", "iterations": PRETRAIN_ITERATIONS,
                                          "ckpt": str(ckpt)}, log_dir=ctx.log_dir, tag="kernel_resume_pretrain")
    runs = {"pretrain": pre}
    for variant in ("correct", "bad"):
        cfg_path = sample / "configs" / f"dump_config_{variant}.json"
        cfg_path.parent.mkdir(parents=True, exist_ok=True)
        cfg_path.write_text(json.dumps(dump_config(sample / variant / "dump"), indent=1) + "\n", encoding="utf-8")
        spec = {**base, "job": "resume", "iterations": ITERATIONS, "ckpt": str(ckpt),
                "stale_name_map": STALE if variant == "bad" else {}}
        runs[variant] = run_ms("_ms_kernel_worker.py", spec, log_dir=ctx.log_dir, tag=f"kernel_resume_{variant}",
                               env={"MINDSPORE_DUMP_CONFIG": str(cfg_path)})
    return runs


def _layout(rank: Path, sample: Path) -> dict[str, Any]:
    removed = []
    for pb in sorted((rank / "graphs").glob("*.pb")):  # the binary graph embeds absolute source paths
        removed.append(str(pb.relative_to(sample)))
        pb.unlink()
    iters = {g.name: {i.name: len(list(i.iterdir())) for i in sorted(g.iterdir())}
             for g in sorted((rank / NET).iterdir())}
    others = sorted(str(p.relative_to(sample)) for p in rank.rglob("*") if p.is_file() and p.suffix != ".npy")
    return {"graphs_iterations_filecounts": iters, "non_npy_files": others, "removed_pb_files": removed}


class _Model:
    def describe(self) -> str:
        return (f"TinyGPT (MindSpore port, MindFormers-style names): vocab {CFG['vocab']}, hidden {CFG['hidden']}, "
                f"{CFG['heads']} heads, ffn {CFG['ffn']}, {CFG['blocks']} decoder layer (composed RMSNorm), seq "
                f"{CFG['seq']}, batch {CFG['batch']}; TrainOneStepCell(NetWithLoss(TinyGPT), "
                "nn.AdamWeightDecay(lr=0.01, weight_decay=0.01)); GRAPH_MODE on CPU")


def gen_kernel_resume(ctx: Any, sample: Path) -> dict:
    """Correct vs bad resume, MindSpore e2e kernel dump in tensor layout, 2 iterations."""
    from ._scenarios import _header

    runs = _run(ctx, sample)
    _check(runs["bad"]["param_not_load"] == ["net.norm_out.weight"], f"bad resume: {runs['bad']['param_not_load']}")
    _check(runs["correct"]["param_not_load"] == [], f"correct resume: {runs['correct']['param_not_load']}")
    ranks = {v: sample / v / "dump" / "rank_0" for v in ("correct", "bad")}
    layout = {v: _layout(r, sample) for v, r in ranks.items()}
    _check(layout["correct"]["graphs_iterations_filecounts"] == layout["bad"]["graphs_iterations_filecounts"],
           f"file counts differ: {layout}")
    graphs = list(layout["correct"]["graphs_iterations_filecounts"])
    _check(len(graphs) == 1 and list(layout["correct"]["graphs_iterations_filecounts"][graphs[0]]) == ["0", "1"],
           f"graphs/iterations {layout['correct']['graphs_iterations_filecounts']}")
    graph = graphs[0]
    full, reads = ir_names(ranks["bad"] / "graphs" / f"ms_output_trace_code_graph_{graph}.ir")
    per_iter = {}
    first: dict[str, Any] | None = None
    import numpy as np

    for it in ("0", "1"):
        fc, fb = (kernel_files(ranks[v] / NET / graph / it) for v in ("correct", "bad"))
        key = lambda r: (r["op_type"], r["op_name"], r["io"], r["slot"])  # noqa: E731
        _check(sorted(map(key, fc)) == sorted(map(key, fb)), f"iteration {it}: the kernels differ")
        # independent kernels may run in another order in the other process: walk the correct run's order
        by_key = {key(r): r for r in fb}
        moved = sum(key(x) != key(y) for x, y in zip(fc, fb, strict=True))
        differs = set()
        for a in fc:
            xa = np.load(ranks["correct"] / NET / graph / it / a["file"], allow_pickle=False)
            xb = np.load(ranks["bad"] / NET / graph / it / by_key[key(a)]["file"], allow_pickle=False)
            if xa.shape != xb.shape or not np.array_equal(xa, xb, equal_nan=True):
                differs.add(key(a))
        firsts = [next((i, r) for i, r in enumerate(order) if key(r) in differs) for order in (fc, fb)]
        _check(bool(differs) and key(firsts[0][1]) == key(firsts[1][1]),
               f"iteration {it}: first difference in the correct run's order {firsts[0][1]['file']}, "
               f"in the bad run's order {firsts[1][1]['file']}")
        (k, a), (later_diff_first_in_bad, b) = firsts
        name = full.get(a["op_name"], a["op_name"])
        per_iter[it] = {"files": len(fc), "differing_tensors": len(differs),
                        "positions_whose_tensor_differs_between_the_two_runs_orders": moved,
                        "first_differing_tensor_by_timestamp": {
            "position_in_bad_order": later_diff_first_in_bad,
            "position": k, "op_type": a["op_type"], "op_name": a["op_name"], "full_name": name,
            "io": a["io"], "slot": a["slot"], "correct_file": a["file"], "bad_file": b["file"]}}
        if first is None:
            first = {"iteration": int(it), "k": k, "a": a, "b": b, "full_name": name}
    assert first is not None
    a, b, name = first["a"], first["b"], first["full_name"]
    param = reads.get(name, {}).get(a["slot"])
    sa = stats(ranks["correct"] / NET / graph / "0" / a["file"])
    sb = stats(ranks["bad"] / NET / graph / "0" / b["file"])
    _check(first["iteration"] == 0 and a["op_type"] == "Mul" and a["io"] == "input"
           and name.startswith("Default/network-NetWithLoss/net-TinyGPT/norm_out-RMSNorm/")
           and param == "net.norm_out.weight", f"first difference {name} slot {a['slot']} reads {param}")
    _check(sb["max"] == sb["min"] == sb["norm"] == 0.0 and sa["min"] > 0.1, f"values {sa} / {sb}")
    fault = {
        "kind": "checkpoint_not_loaded", "role": "origin", "step": 0, "rank": 0, "iteration_folder": "0",
        "node": name, "op_type": a["op_type"], "tensor": f"{name}.input.{a['slot']}",
        "module": "norm_out", "parameter": param,
        "file": str((ranks["bad"] / NET / graph / "0" / b["file"]).relative_to(sample)),
        "baseline_file": str((ranks["correct"] / NET / graph / "0" / a["file"]).relative_to(sample)),
        "position_in_timestamp_order": first["k"],
        "values": {"correct": sa, "bad": sb},
        "how": "bad resumes through a stale checkpoint key map (net.norm_out.weight -> net.final_norm.weight) "
               "with load_param_into_net(strict_load=True): net.norm_out.weight is listed as not loaded and "
               "keeps its zero initialisation; every kernel before the final RMSNorm's weight Mul is "
               "bit-identical to the correct resume",
    }
    exec_csv = ranks["correct"] / "execution_order" / f"ms_execution_order_graph_{graph}.csv"
    listed = [ln.strip() for ln in exec_csv.read_text(encoding="utf-8").splitlines()[1:] if ln.strip()]
    files0 = {r["op_name"] for r in kernel_files(ranks["correct"] / NET / graph / "0") if r["op_type"] != "Parameter"}
    listed_ = {x.replace("/", "_") for x in listed}
    versions = mindspore_versions()
    return _header(
        ctx, "kernel_resume",
        "MindSpore 2.10 GRAPH_MODE CPU kernel (e2e) dumps, tensor mode, of a tiny GPT resumed from a checkpoint "
        "for 2 iterations: correct/ loads every weight, bad/ leaves the final RMSNorm weight at 0 (not loaded)",
        _Model(),  # type: ignore[arg-type]
        task="tensor (MindSpore e2e dump, no msprobe)", world_size=1, steps=list(range(ITERATIONS)),
        mindspore_interpreter={"env": "PRECNB_MINDSPORE_PYTHON", **versions},
        dump_roots={"correct": "correct/dump", "bad": "bad/dump"},
        dump_config=dump_config(Path("<variant>/dump")),
        layout={"pattern": "<dump>/rank_0/<net_name>/<graph_id>/<iteration>/<op_type>.<op_name>.<task_id>."
                           "<stream_id>.<timestamp>.<input|output>.<slot>.<format>.<dtype>.npy; op_name = the "
                           "kernel's full scope name with '/' replaced by '_'; parameters as "
                           "Parameter.<name>...output.0 (their value after the iteration's optimizer step)",
                **{v: layout[v] for v in ("correct", "bad")}},
        faults=[fault],
        checks={"per_iteration": per_iter, "param_not_load": {v: runs[v]["param_not_load"] for v in ("correct", "bad")},
                "execution_order_csv": {"file": str(exec_csv.relative_to(sample)), "names": len(listed),
                                        "names_without_files": len(listed_ - files0),
                                        "kernels_not_listed": len(files0 - listed_),
                                        "note": "on CPU the execution-order CSV does not match the files: order "
                                                "kernels by their dump-file timestamps"},
                "norm_out_weight_in_checkpoint_mean": runs["pretrain"]["norm_weights_after"]["net.norm_out.weight"]},
        iteration_note="iteration folders 0 and 1 are the resumed process's iterations (MindSpore counts from 0), "
                       f"training iterations {PRETRAIN_ITERATIONS} and {PRETRAIN_ITERATIONS + 1}",
        losses={v: runs[v]["losses"] for v in ("pretrain", "correct", "bad")},
    )


def digest(gt: dict[str, Any]) -> list[str]:
    """README lines for this sample."""
    f = gt["faults"][0]
    c = gt["checks"]["execution_order_csv"]
    return [f"- first differing kernel input (timestamp order, iteration 0): `{f['tensor']}` reads "
            f"`{f['parameter']}`: bad max/min/norm {f['values']['bad']['max']}/{f['values']['bad']['min']}/"
            f"{f['values']['bad']['norm']}, correct mean {f['values']['correct']['mean']:.3g}",
            f"- files per graph and iteration: {gt['layout']['correct']['graphs_iterations_filecounts']}; "
            f"removed (absolute paths): {gt['layout']['correct']['removed_pb_files']}",
            f"- execution-order CSV: {c['names']} names, {c['names_without_files']} without files, "
            f"{c['kernels_not_listed']} kernels not listed"]


GENERATORS = {"kernel_resume": gen_kernel_resume}
