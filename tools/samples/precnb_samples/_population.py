"""A random population of real Megatron-Core runs, healthy and faulty, for precnb's accuracy benchmark.

:func:`draw` plans the runs of one draw (model seeds, layouts, fault kinds, steps, layers, ranks, magnitudes);
:func:`generate` runs them one at a time in the Megatron interpreter (``PRECNB_MEGATRON_PYTHON``, see
:mod:`precnb_samples._mg_run`), caching each run under a content hash of its spec (re-running reuses finished
runs), and writes ``manifest.json`` as runs complete; the ground truth of every fault is read back from the
dumps by :mod:`precnb_samples._pop_truth`. Torch-free here.

Every run trains :data:`TRAIN_STEPS` steps and msprobe dumps :data:`DUMP_STEPS` (so optimizer steps happen
inside and after the dump window).

>>> plan = draw(7, "small")
>>> len({f["kind"] for f in plan["faults"]}) >= 12
True
>>> all(plan["runs"][f["twin"]]["bugs"] == [] for f in plan["faults"])
True
>>> run_id(plan["runs"][plan["faults"][0]["run"]]) == plan["faults"][0]["run"]
True
"""

from __future__ import annotations

import json
import math
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ._pop_plan import healthy_pairs, run_id, run_registry

__all__ = ["DUMP_STEPS", "KINDS", "LAYOUTS", "TRAIN_STEPS", "draw", "generate", "layer_ranks", "run_id"]

TRAIN_STEPS = 6
DUMP_STEPS = [0, 1, 2, 3, 4]
DROPOUT = 0.1
# name -> (tp, pp, vpp, dp, sp, threads); tp1pp1 is the reference (the unsharded run)
LAYOUTS: dict[str, tuple[int, int, int, int, bool, int]] = {
    "tp1pp1": (1, 1, 1, 1, False, 1), "tp2pp1": (2, 1, 1, 1, False, 1), "tp1pp2": (1, 2, 1, 1, False, 1),
    "tp2pp2": (2, 2, 1, 1, False, 1), "tp1pp2vpp2": (1, 2, 2, 1, False, 1), "tp2sp": (2, 1, 1, 1, True, 1),
    "dp2": (1, 1, 1, 2, False, 1), "tp1pp1t2": (1, 1, 1, 1, False, 2)}
# precnb's --layout text of each layout (None: nothing to merge)
LAYOUT_TEXT: dict[str, str | None] = {
    "tp1pp1": None, "tp2pp1": "tp=2", "tp1pp2": "pp=2", "tp2pp2": "tp=2,pp=2", "tp1pp2vpp2": "pp=2,vpp=2",
    "tp2sp": "tp=2", "dp2": "dp=2", "tp1pp1t2": None}
TP = ["tp2pp1", "tp2pp2", "tp2sp"]
ANY = ["tp2pp1", "tp1pp2", "tp2pp2", "tp2sp", "dp2", "tp1pp1"]
# kind -> layouts it is drawn in
KINDS: dict[str, list[str]] = {
    "row_output_scale": TP, "bias_grad_scale": TP, "weight_zero": ANY, "act_noise": ANY, "softmax_scale": ANY,
    "norm_eps": ANY, "dw_only": ANY, "dw_only_L1": ANY, "wrong_shard": TP, "unsynced_seed": TP, "nan": ANY,
    "optimizer_state": ANY, "vpp_chunk": ["tp1pp2vpp2"]}
WEIGHTS = ["self_attention.linear_qkv", "self_attention.linear_proj", "mlp.linear_fc1", "mlp.linear_fc2"]
LAYERS = 4


def layout_dict(name: str) -> dict[str, Any]:
    """The worker's layout dict of a layout name."""
    tp, pp, vpp, dp, sp, _ = LAYOUTS[name]
    return {"tp": tp, "pp": pp, "vpp": vpp, "dp": dp, "sp": sp, "ep": 1}


def layer_ranks(name: str, layer: int) -> list[int]:
    """Global ranks holding whole-model *layer* (Megatron's rank order tp-dp-pp; chunks of equal layers)."""
    tp, pp, vpp, dp, _, _ = LAYOUTS[name]
    stage = (layer // (LAYERS // (pp * vpp))) % pp
    return [t + tp * (d + dp * stage) for d in range(dp) for t in range(tp)]


def run_spec(seed: int, layout: str, bugs: list[dict[str, Any]] | None = None, *, dropout: float = 0.0,
             level: str = "mix") -> dict[str, Any]:
    """One run of the population (what its content hash is taken over)."""
    return {"seed": seed, "layout": layout, "threads": LAYOUTS[layout][5], "dropout": dropout, "level": level,
            "bugs": bugs or [], "train_steps": TRAIN_STEPS, "dump_steps": DUMP_STEPS}


def _fault(rng: random.Random, kind: str, layout: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """One drawn fault: (the worker's bug dict, run options)."""
    layer = rng.choice([2, 3]) if kind == "vpp_chunk" else rng.randrange(LAYERS)
    ranks = layer_ranks(layout, layer)
    rank = rng.choice([r for r in ranks if r % LAYOUTS[layout][0] == 1] if kind in ("wrong_shard", "unsynced_seed")
                      else ranks)
    m = round(math.exp(rng.uniform(math.log(1e-3), math.log(1e-1))), 6)
    step = rng.randint(1, 4)
    param = f"decoder.layers.{layer}.{rng.choice(WEIGHTS)}.weight"
    b: dict[str, Any] = {"kind": kind, "rank": rank, "layer": layer, "from_step": step}
    opts: dict[str, Any] = {}
    if kind in ("row_output_scale", "bias_grad_scale"):
        b.update(module=rng.choice(["linear_proj", "linear_fc2"]), m=m)
    elif kind in ("weight_zero",):
        b["param"] = param
    elif kind in ("act_noise",):
        b["m"] = m
    elif kind in ("softmax_scale", "vpp_chunk"):
        b.update(kind="softmax_scale", factor=1.0 + m, m=m)
    elif kind == "norm_eps":
        b.update(eps=m, m=m)
    elif kind == "nan":
        b.update(kind="norm_eps", eps=-1.0)
    elif kind in ("dw_only", "dw_only_L1"):
        b.update(kind="dw_only", param=param, m=m)
        opts["level"] = "L1" if kind == "dw_only_L1" else "mix"
        if kind == "dw_only_L1":  # no weight grads at L1: the fault shows in the next step's forward
            b["from_step"] = rng.randint(1, 3)
    elif kind == "wrong_shard":
        b.update(param=param, loads_shard_of_tp_rank=0)
    elif kind == "unsynced_seed":
        b = {"kind": kind, "rank": rank, "layer": None, "from_step": 0}
        opts["dropout"] = DROPOUT
    elif kind == "optimizer_state":
        b.update(param=param, m=m, state="exp_avg", from_step=rng.randint(1, 3))
    return b, opts


def draw(seed: int, size: str = "small", kinds: list[str] | None = None) -> dict[str, Any]:
    """Plan one draw: ``{"runs": id -> spec, "healthy": [...], "faults": [...]}``.

    *size* ``small``: 2 model seeds, every kind once; ``full``: 3 model seeds, every kind 3 times. Healthy
    pairs: every layout vs tp1pp1 of the same seed. Each fault has its healthy twin (same seed, layout,
    dropout, level) and the tp1pp1 run of the same seed (and dropout) as reference.
    """
    rng = random.Random(seed)  # noqa: S311 (a reproducible draw, not a secret)
    seeds = sorted(rng.sample(range(1000, 10000), 2 if size == "small" else 3))
    repeat = 1 if size == "small" else 3
    runs, add = run_registry()
    healthy = healthy_pairs(seeds, "tp1pp1", LAYOUTS, run_spec, add)
    faults = []
    for i in range(repeat):
        for kind in kinds or list(KINDS):
            lay, s = rng.choice(KINDS[kind]), rng.choice(seeds)
            if kind == "unsynced_seed" and LAYOUTS[lay][4]:  # SP shards the dropout masks: tp1pp1 differs anyway
                lay = "tp2pp1"
            bug, opts = _fault(rng, kind, lay)
            twin = add(run_spec(s, lay, **opts))
            faults.append({"name": f"{kind}#{i}", "kind": kind, "seed": s, "layout": lay, "injection": bug,
                           "run": add(run_spec(s, lay, [bug], **opts)), "twin": twin,
                           "reference": add(run_spec(s, "tp1pp1", dropout=opts.get("dropout", 0.0),
                                                     level=opts.get("level", "mix")))})
    return {"draw_seed": seed, "size": size, "seeds": seeds, "runs": runs, "healthy": healthy, "faults": faults}


def _config(spec: dict[str, Any], path: Path, dump: Path) -> Path:
    cfg = {"task": "statistics", "dump_path": str(dump), "rank": [], "step": spec["dump_steps"],
           "level": spec["level"], "async_dump": False,
           "statistics": {"scope": [], "list": [], "data_mode": ["all"], "summary_mode": "statistics"}}
    path.write_text(json.dumps(cfg, indent=1) + "\n", encoding="utf-8")
    return path


def _run_one(rid: str, spec: dict[str, Any], out: Path) -> dict[str, Any]:
    from ._mg_run import run_mg
    from ._pop_moe import is_moe, worker_spec
    from ._scn_megatron import MODEL

    if is_moe(spec):
        model, layout, folder = worker_spec(spec)
    else:
        model = dict(MODEL, seed=spec["seed"], hidden_dropout=spec["dropout"])
        layout, folder = layout_dict(spec["layout"]), str(spec["seed"])
    seed_dir = out / "seeds" / folder
    seed_dir.mkdir(parents=True, exist_ok=True)
    files = {"weights": str(seed_dir / "init_state.pt"), "batches": str(seed_dir / "batches.pt")}
    if not (seed_dir / "batches.pt").exists():
        run_mg({"mode": "init", "model": model, "steps": spec["train_steps"], **files}, log_dir=seed_dir, tag="init")
    run = out / "runs" / rid
    run.mkdir(parents=True, exist_ok=True)
    (run / "spec.json").write_text(json.dumps(spec, indent=1) + "\n", encoding="utf-8")
    cfg = _config(spec, run / "config.json", run / "dump")
    t0 = time.time()
    result = run_mg({"mode": "megatron", "model": model, "layout": layout,
                     "steps": spec["train_steps"], "bugs": spec["bugs"], "threads": spec["threads"],
                     "config": str(cfg), **files}, log_dir=run / "logs", tag="run")
    result["seconds"] = round(time.time() - t0, 1)
    (run / "result.json").write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    return result


def load_manifest(out: Path) -> dict[str, Any]:
    """The population's manifest (empty when there is none)."""
    path = out / "manifest.json"
    return json.loads(path.read_text(encoding="utf-8")) if path.exists() else {"runs": {}, "draws": {}}


def write_manifest(out: Path, manifest: dict[str, Any]) -> None:
    """Write ``manifest.json`` atomically."""
    tmp = out / "manifest.json.tmp"
    tmp.write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")
    tmp.replace(out / "manifest.json")


def generate(plan: dict[str, Any], out: Path, log: Callable[[str], None] = print,
             order: list[str] | None = None) -> dict[str, Any]:
    """Run every run of *plan* not yet finished under *out* (one at a time); the updated manifest.

    *order*: run ids to run first (the rest follow in plan order). A failed run is recorded with its error
    and skipped. Ground truth of the faults is added by :func:`precnb_samples._pop_truth.annotate`.
    """
    from . import _pop_truth

    out.mkdir(parents=True, exist_ok=True)
    manifest = load_manifest(out)
    manifest["draws"][str(plan["draw_seed"])] = {k: plan[k] for k in ("size", "seeds", "healthy", "faults")}
    ids = list(dict.fromkeys([*(order or []), *plan["runs"]]))
    for n, rid in enumerate(ids, 1):
        spec = plan["runs"][rid]
        done = manifest["runs"].get(rid, {})
        if done.get("status") == "ok" and (out / "runs" / rid / "result.json").exists():
            continue
        log(f"[population] {n}/{len(ids)} {rid} {spec['layout']} seed {spec['seed']} bugs {spec['bugs']}")
        try:
            result = _run_one(rid, spec, out)
            manifest["runs"][rid] = {"spec": spec, "status": "ok", "dir": f"runs/{rid}", "seconds": result["seconds"],
                                     "losses": {r: v["losses"] for r, v in result["ranks"].items()}}
        except (SystemExit, RuntimeError, OSError) as exc:
            manifest["runs"][rid] = {"spec": spec, "status": "failed", "error": str(exc)[-2000:]}
        _pop_truth.annotate(manifest, out)
        write_manifest(out, manifest)
    _pop_truth.annotate(manifest, out)
    write_manifest(out, manifest)
    return manifest


def main(argv: list[str] | None = None) -> int:
    """``python -m precnb_samples._population --draw-seed N --size small|full --out DIR``: plan and run a draw.

    ``--moe`` draws MoE runs instead (:func:`precnb_samples._pop_moe.draw_moe`, draw key ``moe<N>``; ``--repeat``
    draws of each MoE kind, ``--only`` MoE kinds, ``--moe-layout`` the EP layouts); the dense draw of the same seed is
    unchanged.
    """
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--draw-seed", type=int, default=1)
    ap.add_argument("--size", choices=["small", "full"], default="small")
    ap.add_argument("--only", action="append", help="fault kinds to draw (repeatable)")
    ap.add_argument("--out", type=Path, default=Path("/work/pop"))
    ap.add_argument("--moe", action="store_true", help="a MoE draw (alltoall dispatcher; see _pop_moe)")
    ap.add_argument("--repeat", type=int, default=2, help="with --moe: draws of each MoE fault kind")
    ap.add_argument("--moe-layout", action="append", help="with --moe: EP layouts to draw in (repeatable; default "
                                                          "moe_tp2ep2 and moe_tp1ep2dp2)")
    args = ap.parse_args(argv)
    if args.moe:
        from ._pop_moe import draw_moe

        plan = draw_moe(args.draw_seed, args.repeat, args.only, args.moe_layout)
    else:
        plan = draw(args.draw_seed, args.size, args.only)
    manifest = generate(plan, args.out, log=lambda m: print(m, flush=True))
    bad = [r for r, v in manifest["runs"].items() if v["status"] != "ok"]
    print(f"[population] {len(manifest['runs'])} runs, {len(bad)} failed: {bad}")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
