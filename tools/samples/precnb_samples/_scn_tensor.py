"""Tensor-mode samples (``task: tensor``): healthy bf16 autocast, and a real bug at one module.

``tensor_bf16``: an fp32 baseline and the same run under ``torch.autocast("cpu",
dtype=torch.bfloat16)`` (healthy mixed precision: the dtype differs on whole op families).
``tensor_bug``: an fp32 baseline and a target whose block 1 scales its attention residual by 0.5
instead of 1.0 (same ops in both runs; only the scalar differs).

Each sample keeps the CSV that ``msprobe compare`` (26.2.0) wrote for its pair under
``msprobe_compare/``, so precnb's tensor metrics are checked against msprobe's on every tensor
without msprobe installed. Every location in ``ground_truth.json`` is read back from the dumps.
"""

from __future__ import annotations

import contextlib
import csv
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812

from . import _dumps as D  # noqa: N812
from ._model import Faults, ModelConfig, TinyGPT, make_batch, make_optimizer
from ._scenarios import Context, _check, _header, _layout, _load_all, _rank_dir, write_json
from ._train import WorkerSpec, finish_worker, launch, start_worker

# small enough for two tensor-mode runs (+ the compare CSV) to stay under ~3 MB per sample
TENSOR_MODEL = ModelConfig(blocks=2, vocab=32, batch=1)
STEPS = 1
BUG_BLOCK = 1
BUG_SCALE = 0.5

_TENSOR_CONFIG: dict[str, Any] = {
    "task": "tensor",
    "dump_path": None,
    "rank": [],
    "step": [],
    "level": "mix",
    "async_dump": False,
    "tensor": {"scope": [], "list": [], "data_mode": ["all"]},
}


@dataclass(kw_only=True)
class TensorSpec(WorkerSpec):
    """One tensor-mode run: optional bf16/fp16 autocast and per-block residual scales."""

    autocast: str | None = None  # forward + loss under torch.autocast("cpu", dtype=...)
    residual_scale: tuple[tuple[int, float], ...] = ()  # (block, factor) on the attention residual


def worker(rank: int, spec: TensorSpec) -> None:
    """Train the tiny GPT under msprobe; the dump stops before the optimizer step (smaller files)."""
    start_worker(rank, spec)
    cfg = spec.model
    faults = Faults()
    faults.residual_scale = dict(spec.residual_scale)
    model = TinyGPT(cfg, faults)
    opt = make_optimizer(model, cfg)
    from msprobe.pytorch import PrecisionDebugger

    debugger = PrecisionDebugger(config_path=spec.config_path)
    region = (torch.autocast("cpu", dtype=getattr(torch, spec.autocast)) if spec.autocast
              else contextlib.nullcontext())
    losses = []
    for step in range(spec.steps):
        x, y = make_batch(cfg, step, 0)
        opt.zero_grad(set_to_none=True)
        debugger.start(model)
        with region:
            logits = model(x)
            loss = F.cross_entropy(logits.reshape(-1, cfg.vocab), y.reshape(-1))
        loss.backward()
        debugger.stop()
        opt.step()
        debugger.step()
        losses.append(float(loss.detach()))
    finish_worker(rank, spec, losses)


def _config(sample: Path, root: Path, name: str) -> Path:
    path = sample / "configs" / name
    write_json(path, dict(_TENSOR_CONFIG, dump_path=str(root)))
    return path


def _run(ctx: Context, sample: Path, variant: str, tag: str, **kw: Any) -> list[float]:
    root = sample / variant
    cfg = _config(sample, root, f"config_{variant}.json")
    spec = TensorSpec(config_path=str(cfg), log_dir=str(ctx.log_dir), world_size=1, steps=STEPS,
                      model=TENSOR_MODEL, tag=tag, **kw)
    losses = launch(spec, worker)[0]
    for step in range(STEPS):
        rdir = _rank_dir(root, step, 0)
        _check(rdir.name == "rank0", f"{rdir}: expected rank0 (torch.distributed initialised)")
        _check((rdir / "dump_tensor_data").is_dir(), f"{rdir}: no dump_tensor_data/")
    return losses


def run_msprobe_compare(ctx: Context, target_rank_dir: Path, baseline_rank_dir: Path, out: Path,
                        tag: str) -> Path:
    """Run ``msprobe compare`` (tensor mode) on one rank pair; return the CSV it wrote.

    The target folder is copied without ``stack.json`` first, so msprobe leaves out the
    ``NPU_Stack_Info`` column (long absolute paths of the generating machine).
    """
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="precnb-cmp-") as tmp:
        copy = Path(tmp) / "target"
        shutil.copytree(target_rank_dir, copy, ignore=shutil.ignore_patterns("stack.json"))
        cmd = [sys.executable, "-c", "import sys; from msprobe.msprobe import main; sys.exit(main())",
               "compare", "-tp", str(copy / "dump.json"), "-gp", str(baseline_rank_dir / "dump.json"),
               "-o", str(out)]
        log = ctx.log_dir / f"{tag}_msprobe_compare.log"
        with open(log, "w", encoding="utf-8") as fh:
            proc = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, check=False, timeout=1800)
        _check(proc.returncode == 0, f"msprobe compare failed ({proc.returncode}); see {log}")
    found = sorted(out.glob("compare_result_*.csv"))
    _check(len(found) == 1, f"msprobe compare wrote {found}")
    return found[0]


def _csv_rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="", encoding="utf-8") as fh:
        return list(csv.DictReader(fh))


def _compare_facts(csv_path: Path, sample: Path) -> dict[str, Any]:
    rows = _csv_rows(csv_path)
    with_data = [r for r in rows if r["Cosine"] not in ("unsupported", "N/A", "")]
    return {
        "csv": str(csv_path.relative_to(sample)),
        "command": "msprobe compare -tp <target>/step0/rank0/dump.json -gp "
                   "<baseline>/step0/rank0/dump.json -o msprobe_compare (target copied without stack.json)",
        "rows": len(rows),
        "rows_with_metrics": len(with_data),
        "result_counts": dict(Counter(r["Result"] for r in rows)),
    }


def _tensor_leaves(data: dict) -> dict[tuple[str, str], dict]:
    return {(n, p): leaf for n, rec in data.items() for p, leaf in D.node_leaves(rec).items()
            if isinstance(leaf.get("dtype"), str) and leaf.get("type", "").startswith("torch")}


# ----------------------------------------------------------------------------------- tensor_bf16
def gen_tensor_bf16(ctx: Context, sample: Path) -> dict:
    """fp32 baseline vs the same run under CPU bf16 autocast; healthy, no fault."""
    model = TENSOR_MODEL
    losses = {"baseline": _run(ctx, sample, "baseline", "tensor_bf16_baseline"),
              "target": _run(ctx, sample, "target", "tensor_bf16_target", autocast="bfloat16")}
    base, targ = _load_all(sample / "baseline"), _load_all(sample / "target")
    b0, t0 = base[(0, 0)], targ[(0, 0)]
    _check(list(b0) == list(t0), "node lists differ between the fp32 and the autocast run")
    lb, lt = _tensor_leaves(b0), _tensor_leaves(t0)
    changed = [(n, p) for (n, p), leaf in lt.items()
               if leaf["dtype"] == "torch.bfloat16" and lb.get((n, p), {}).get("dtype") == "torch.float32"]
    _check(not any(leaf["dtype"] == "torch.bfloat16" for leaf in lb.values()), "bf16 in the fp32 baseline")
    families = Counter(".".join(n.split(".")[:2]) for n, _ in changed if not n.startswith("Module."))
    _check(len(families) >= 3, f"autocast changed too few API families: {families}")
    params_bf16 = [n for n, p in changed if p.startswith("parameters")]
    _check(not params_bf16, f"autocast must not change parameter dtypes: {params_bf16[:3]}")
    first = next(n for n in t0 if any(k[0] == n for k in changed))
    facts = _compare_facts(run_msprobe_compare(ctx, _rank_dir(sample / "target", 0, 0),
                                               _rank_dir(sample / "baseline", 0, 0),
                                               sample / "msprobe_compare", "tensor_bf16"), sample)
    return _header(
        ctx, "tensor_bf16",
        "tensor mode (task tensor, level mix), 1 process, 1 step: an fp32 baseline and the same run "
        "under torch.autocast('cpu', dtype=torch.bfloat16) (forward and loss); healthy mixed "
        "precision, no fault",
        model, task="tensor", level="mix", world_size=1, distributed_initialised=True,
        steps=list(range(STEPS)), dump_roots={"baseline": "baseline", "target": "target"},
        dump_files={v: _layout(sample / v, sample) for v in ("baseline", "target")},
        faults=[],
        precision={
            "target": "bfloat16 (autocast)",
            "baseline": "float32",
            "tensors_float32_in_baseline_bfloat16_in_target": len(changed),
            "api_families_changed": dict(sorted(families.items())),
            "first_node_with_bfloat16": first,
            "parameters_changed": 0,
            "expected": "no divergence once compared with bf16 tolerance; msprobe compare marks the "
                        "bf16 rows `error` for the dtype difference alone",
        },
        msprobe_compare=facts,
        checks={"same_node_names_in_same_order": True, "nodes": len(t0)},
        losses=losses,
    )


# ------------------------------------------------------------------------------------ tensor_bug
def gen_tensor_bug(ctx: Context, sample: Path) -> dict:
    """fp32 baseline vs a target whose block 1 scales its attention residual by 0.5 (a real bug)."""
    model = TENSOR_MODEL
    losses = {"baseline": _run(ctx, sample, "baseline", "tensor_bug_baseline",
                               residual_scale=((BUG_BLOCK, 1.0),)),
              "target": _run(ctx, sample, "target", "tensor_bug_target",
                             residual_scale=((BUG_BLOCK, BUG_SCALE),))}
    base, targ = _load_all(sample / "baseline"), _load_all(sample / "target")
    b0, t0 = base[(0, 0)], targ[(0, 0)]
    _check(list(b0) == list(t0), "node lists differ between baseline and target")
    node = D.first_differing_node(b0, t0)
    _check(node is not None and node.startswith("Tensor.__mul__."), f"first differing node {node}")
    assert node is not None
    construct = D.load_json(_rank_dir(sample / "target", 0, 0) / "construct.json")
    parent = D.parent_of(construct, node)
    _check(parent == f"Module.blocks.{BUG_BLOCK}.Block.forward.0", f"parent of {node}: {parent}")
    leaves_b, leaves_t = D.node_leaves(b0[node]), D.node_leaves(t0[node])
    _check(leaves_b["input_args.1"].get("value") == 1.0 and leaves_t["input_args.1"].get("value") == BUG_SCALE,
           f"scalar of {node}: {leaves_b.get('input_args.1')} vs {leaves_t.get('input_args.1')}")
    differing = D.differing_leaves(b0[node], t0[node])
    _check("output.0" in differing, f"origin output does not differ: {differing}")
    before = list(t0)[: list(t0).index(node)]
    _check(all(not D.differing_leaves(b0[n], t0[n]) for n in before), "a node before the origin differs")
    facts = _compare_facts(run_msprobe_compare(ctx, _rank_dir(sample / "target", 0, 0),
                                               _rank_dir(sample / "baseline", 0, 0),
                                               sample / "msprobe_compare", "tensor_bug"), sample)
    rel = str((_rank_dir(sample / "target", 0, 0) / "dump.json").relative_to(sample))
    return _header(
        ctx, "tensor_bug",
        "tensor mode (task tensor, level mix), 1 process, 1 step, fp32: baseline vs a target whose "
        f"block {BUG_BLOCK} adds its attention branch scaled by {BUG_SCALE} instead of 1.0 (a wrong "
        "residual scale); same ops in both runs",
        model, task="tensor", level="mix", world_size=1, distributed_initialised=True,
        steps=list(range(STEPS)), dump_roots={"baseline": "baseline", "target": "target"},
        dump_files={v: _layout(sample / v, sample) for v in ("baseline", "target")},
        faults=[{
            "kind": "divergence",
            "role": "origin",
            "step": 0,
            "rank": 0,
            "node": node,
            "tensor": f"{node}.output.0",
            "module": f"blocks.{BUG_BLOCK}",
            "module_node": parent,
            "dump_json": rel,
            "how": f"Block.forward: x = x + attn(attn_norm(x)) * scale, scale = 1.0 in the baseline and "
                   f"{BUG_SCALE} in the target for block {BUG_BLOCK}; the scalar is input_args.1 of "
                   "the Tensor.__mul__; its output differs by exactly that factor (cosine 1.0, "
                   "relative error 0.5), and everything after it differs",
            "differing_leaves": differing,
        }],
        msprobe_compare=facts,
        checks={"same_node_names_in_same_order": True, "nodes": len(t0),
                "nodes_before_origin_identical": len(before)},
        losses=losses,
    )


GENERATORS: dict[str, Callable[[Context, Path], dict]] = {
    "tensor_bf16": gen_tensor_bf16,
    "tensor_bug": gen_tensor_bug,
}
