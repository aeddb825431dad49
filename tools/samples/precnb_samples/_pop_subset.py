"""The committed subset of the Megatron-Core population: ``data_samples/megatron_pop`` (tests and the smoke run).

Four runs of one model seed, made by the population generator (:mod:`precnb_samples._population`, cached
under the population folder) and copied without ``stack.json`` and without logs, their ``dump.json`` and
``construct.json`` re-serialised without indentation (the same JSON values; data_samples must stay small):
the healthy tp1pp1 and tp2pp1 runs (6 steps trained, 5 dumped), a healthy dp2 run dumped at level L1 (steps
0-1, with its ``stack.json``), a healthy dp2 run (steps 0-2), a tp1pp1 fault run whose healthy twin is that tp1pp1
run, a tp2pp1 fault on TP rank 1 only (a replica departure) and an AdamW moment scaled on one DP replica; of the
fault runs the steps up to the fault's are kept; from draw 6 (scored blind), a healthy tp2 run with sequence
parallelism at level L1 (step 0) and a tp2pp2 run with one TP rank of stage 0 scaled (steps 3-4, its twin and
reference step 4). The
``ground_truth.json`` has the manifest's schema (``runs``, ``draws``, ``truth``), so ``bench_accuracy.py
--smoke`` scores it like a population.

``PYTHONPATH=tools/samples python -m precnb_samples._pop_subset --pop /work/pop --dest data_samples/megatron_pop``
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from . import _population as P  # noqa: N812
from ._pop_plan import copy_run, fault_lines, subset_main
from .scrub import scrub_tree

SEED = 2033
PP_L1_SEED = 2500
DROPOUT_SEED = 4867  # a healthy dropout-0.1 pair (draw 5)
SP_L1_SEED = 2320  # draw 6 (generated on another machine than the runs above: each pair is made on one machine)
# (kind, layout, bug, dumped steps kept: None for every one) — the fault runs keep the steps up to their fault's
# (from step 0: msprobe numbers calls per step and Megatron's first step makes calls later steps do not)
FAULTS = [
    ("act_noise", "tp1pp1", {"kind": "act_noise", "rank": 0, "layer": 1, "from_step": 2, "m": 0.01}, [0, 1, 2]),
    ("row_output_scale", "tp2pp1", {"kind": "row_output_scale", "rank": 1, "layer": 1, "from_step": 2,
                                    "module": "linear_proj", "m": 0.005}, [0, 1, 2]),
    # one DP replica's AdamW moment scaled: the replicas must depart at the optimizer's input at step 2
    ("optimizer_state", "dp2", {"kind": "optimizer_state", "rank": 1, "layer": 3, "from_step": 2,
                                "param": "decoder.layers.3.mlp.linear_fc2.weight", "m": 0.080341,
                                "state": "exp_avg"}, [0, 1, 2]),
]
# level-L1 fault runs: (kind, model seed, layout, bug, steps kept); twin and reference are that seed's L1 runs
FAULTS_L1 = [
    ("dw_only_L1", 2500, "tp2pp2", {"kind": "dw_only", "rank": 2, "layer": 3, "from_step": 2,
                                    "param": "decoder.layers.3.mlp.linear_fc1.weight", "m": 0.076066}, [0, 1, 2]),
]

# faults of another model seed, at mix level, with their twin and unsharded reference kept at the same steps:
# (kind, model seed, layout, bug, steps kept)
FAULTS_SEEDED = [
    # one TP rank of pipeline stage 1 seeded apart (draw 5): stage 1's labels name other calls than stage 0's
    # (no embedding dropout there), so the departing op's module is the stage's own
    ("unsynced_seed_pp", 5185, "tp2pp2", {"kind": "unsynced_seed", "rank": 3, "layer": None, "from_step": 0}, [0]),
]

# one TP rank of pipeline stage 0 scaled (draw 6): at step 4 stage 1's TP pair departs as well (it receives
# stage 0's activations) and comes first in its ranks' own numbering; the replica check needs a step where
# the copies agree, so the fault run keeps steps 3-4, its twin and reference step 4:
# (kind, model seed, layout, bug, steps kept, companions' steps kept)
FAULTS_PP = [
    ("row_output_scale_pp", 2320, "tp2pp2", {"kind": "row_output_scale", "rank": 0, "layer": 0, "from_step": 4,
                                             "module": "linear_fc2", "m": 0.021166}, [3, 4], [4]),
]


def plan() -> dict[str, Any]:
    """The subset's plan, in :func:`precnb_samples._population.draw`'s form (draw seed ``subset``)."""
    ref, tp2, dp2 = P.run_spec(SEED, "tp1pp1"), P.run_spec(SEED, "tp2pp1"), P.run_spec(SEED, "dp2")
    runs = {P.run_id(s): s for s in (ref, tp2, dp2)}
    faults = []
    twins = {"tp1pp1": ref, "tp2pp1": tp2, "dp2": dp2}
    for kind, layout, bug, keep in FAULTS:
        spec = P.run_spec(SEED, layout, [bug])
        runs[P.run_id(spec)] = spec
        faults.append({"name": f"{kind}#subset", "kind": kind, "seed": SEED, "layout": layout, "injection": bug,
                       "run": P.run_id(spec), "twin": P.run_id(twins[layout]), "reference": P.run_id(ref),
                       **({"steps_kept": keep} if keep else {})})
    # a data-parallel run dumped at level L1 (no module records) against the level-mix reference: steps 0-1
    # (msprobe's counters shift at step 1) with its stack.json (the only record of which calls run in the backward)
    dp_l1 = P.run_spec(SEED, "dp2", level="L1")
    runs[P.run_id(dp_l1)] = dp_l1
    # a tp2pp2 run and its unsharded twin, both at level L1 (another model seed, from the population's draw 2):
    # two micro-batches per step, stitched without module records; steps 0-2 (counters shift at step 1; the L1
    # fault below departs at step 2)
    pp_l1, ref_l1 = P.run_spec(PP_L1_SEED, "tp2pp2", level="L1"), P.run_spec(PP_L1_SEED, "tp1pp1", level="L1")
    runs[P.run_id(pp_l1)], runs[P.run_id(ref_l1)] = pp_l1, ref_l1
    healthy = [{"name": f"tp2pp1@{SEED}", "seed": SEED, "layout": "tp2pp1", "run": P.run_id(tp2),
                "reference": P.run_id(ref)},
               {"name": f"dp2@{SEED}", "seed": SEED, "layout": "dp2", "run": P.run_id(dp2),
                "reference": P.run_id(ref), "steps_kept": [0, 1, 2]},
               {"name": f"dp2L1@{SEED}", "seed": SEED, "layout": "dp2", "run": P.run_id(dp_l1),
                "reference": P.run_id(ref), "steps_kept": [0, 1], "stacks": True},
               {"name": f"tp2pp2L1@{PP_L1_SEED}", "seed": PP_L1_SEED, "layout": "tp2pp2", "run": P.run_id(pp_l1),
                "reference": P.run_id(ref_l1), "steps_kept": [0, 1, 2]}]
    # a tp2 run with sequence parallelism at level L1 against the same unsharded L1 run (draw 6's false alarm):
    # its backward makes the calls of tp1 and more, all at the root; lined up on op names alone, a run of
    # ``matmul, t, matmul`` shifted and paired one layer's weight gradient with another's; step 0
    sp_l1, sp_ref = P.run_spec(SP_L1_SEED, "tp2sp", level="L1"), P.run_spec(SP_L1_SEED, "tp1pp1", level="L1")
    runs[P.run_id(sp_l1)], runs[P.run_id(sp_ref)] = sp_l1, sp_ref
    healthy.append({"name": f"tp2spL1@{SP_L1_SEED}", "seed": SP_L1_SEED, "layout": "tp2sp", "run": P.run_id(sp_l1),
                    "reference": P.run_id(sp_ref), "steps_kept": [0]})
    # a healthy tp2pp1 run with dropout 0.1 and its unsharded twin (draw 5's unsynced-seed twin and reference): at
    # step 1 one bias gradient's Max differs, at step 3 one layernorm weight gradient's Min (one element of a weight
    # Adam moved by its eps-magnified noise): the one-element noise rule's cases; steps 0, 1 and 3
    drop, drop_ref = P.run_spec(DROPOUT_SEED, "tp2pp1", dropout=0.1), P.run_spec(DROPOUT_SEED, "tp1pp1", dropout=0.1)
    runs[P.run_id(drop)], runs[P.run_id(drop_ref)] = drop, drop_ref
    healthy.append({"name": f"tp2pp1dropout@{DROPOUT_SEED}", "seed": DROPOUT_SEED, "layout": "tp2pp1",
                    "run": P.run_id(drop), "reference": P.run_id(drop_ref), "steps_kept": [0, 1, 3], "dropout": 0.1})
    for kind, seed, layout, bug, keep in FAULTS_L1:
        spec = P.run_spec(seed, layout, [bug], level="L1")
        runs[P.run_id(spec)] = spec
        twin, ref1 = P.run_spec(seed, layout, level="L1"), P.run_spec(seed, "tp1pp1", level="L1")
        faults.append({"name": f"{kind}#subset", "kind": kind, "seed": seed, "layout": layout, "injection": bug,
                       "run": P.run_id(spec), "twin": P.run_id(twin), "reference": P.run_id(ref1),
                       "steps_kept": keep})
    for kind, seed, layout, bug, keep in FAULTS_SEEDED:
        d = 0.1 if bug["kind"] == "unsynced_seed" else 0.0  # the population's seed faults run with dropout
        spec, twin, ref1 = (P.run_spec(seed, layout, [bug], dropout=d), P.run_spec(seed, layout, dropout=d),
                            P.run_spec(seed, "tp1pp1", dropout=d))
        runs.update({P.run_id(x): x for x in (spec, twin, ref1)})
        faults.append({"name": f"{kind}#subset", "kind": kind, "seed": seed, "layout": layout, "injection": bug,
                       "run": P.run_id(spec), "twin": P.run_id(twin), "reference": P.run_id(ref1),
                       "steps_kept": keep, "companions_kept": keep})
    for kind, seed, layout, bug, keep, companions in FAULTS_PP:
        spec, twin, ref1 = P.run_spec(seed, layout, [bug]), P.run_spec(seed, layout), P.run_spec(seed, "tp1pp1")
        runs.update({P.run_id(x): x for x in (spec, twin, ref1)})
        faults.append({"name": f"{kind}#subset", "kind": kind, "seed": seed, "layout": layout, "injection": bug,
                       "run": P.run_id(spec), "twin": P.run_id(twin), "reference": P.run_id(ref1),
                       "steps_kept": keep, "companions_kept": companions})
    return {"draw_seed": "subset", "size": "subset", "seeds": [SEED], "runs": runs, "healthy": healthy,
            "faults": faults}


def export(pop: Path, dest: Path) -> dict[str, Any]:
    """Copy the subset's runs from *pop* to *dest* (no stack.json, no logs, relative dump_path)."""
    p = plan()
    manifest = P.load_manifest(pop)
    if dest.exists():
        shutil.rmtree(dest)
    keep = {f["run"]: f.get("steps_kept") for f in p["faults"] + p["healthy"]}
    keep.update({h["reference"]: h["steps_kept"] for h in p["healthy"] if h["reference"] not in keep
                 and h["reference"] != P.run_id(P.run_spec(SEED, "tp1pp1"))})
    for f in p["faults"]:  # a fault's twin and reference kept at its steps only
        keep.update({f[k]: f["companions_kept"] for k in ("twin", "reference") if f.get("companions_kept")})
    stacks = {h["run"] for h in p["healthy"] if h.get("stacks")}
    for rid in p["runs"]:
        src, dst = pop / "runs" / rid, dest / "runs" / rid
        steps = {f"step{s}" for s in keep[rid]} if keep.get(rid) else None
        copy_run(src, dst, lambda name, step, rid=rid, steps=steps: (name == "stack.json" and rid not in stacks)
                 or (steps is not None and step not in steps))
    runs = {rid: {k: v for k, v in manifest["runs"][rid].items() if k != "seconds"} for rid in p["runs"]}
    truth = {f["run"]: manifest["truth"][f["run"]] for f in p["faults"]}
    gt = {"runs": runs, "draws": {"subset": {k: p[k] for k in ("size", "seeds", "healthy", "faults")}},
          "truth": truth}
    (dest / "ground_truth.json").write_text(json.dumps(gt, indent=1) + "\n", encoding="utf-8")
    (dest / "README.md").write_text(_readme(p, gt), encoding="utf-8")
    scrub_tree(dest)  # the dp2 run's stack.json frames name the machine's files
    return gt


def _readme(p: dict[str, Any], gt: dict[str, Any]) -> str:
    lines = ["# megatron_pop: the committed subset of the Megatron-Core accuracy population", "",
             "Generated by `PYTHONPATH=tools/samples python -m precnb_samples._pop_subset --pop POP --dest "
             "data_samples/megatron_pop` from runs of the population generator "
             "(`tools/samples/precnb_samples/_population.py`; Megatron-Core 0.19.2, msprobe 26.2.0 on CPU): "
             f"model seed {SEED}, the 4-layer hidden-32 GPT of `data_samples/megatron`, {P.TRAIN_STEPS} steps "
             f"trained, steps {P.DUMP_STEPS} dumped (statistics, level mix). `stack.json` and the logs are left "
             "out, `dump.json` and `construct.json` are re-serialised without indentation (same JSON values); "
             "each run keeps `spec.json`, `config.json` and the worker's `result.json` (losses, layer "
             "numbers per chunk, what each fault did at each step).", "", "| run | layout | fault |", "|---|---|---|"]
    for rid, spec in p["runs"].items():
        kept = next((f.get("steps_kept") for f in p["faults"] if f["run"] == rid), None)
        lines.append(f"| `runs/{rid}` | {spec['layout']} | {spec['bugs'] or '-'}"
                     f"{f' (steps {kept} kept)' if kept else ''} |")
    lines += ["", "Healthy pairs (no finding is right: `precnb diff REF RUN --target-layout LAYOUT`, "
              "`precnb replicas RUN`):", ""]
    for h in p["healthy"]:
        spec = p["runs"][h["run"]]
        extra = f", level {spec['level']}" + (", with `stack.json`" if h.get("stacks") else "") \
            if spec["level"] != "mix" else ""
        ref_level = p["runs"][h["reference"]]["level"]
        lines.append(f"- `{h['run']}` ({h['layout']}{extra}) vs `{h['reference']}` (tp1pp1"
                     f"{f', level {ref_level}' if ref_level != 'mix' else ''})")
    lines += ["", "Faults (ground truth read back from the dumps against the healthy twin, `ground_truth.json`):", ""]
    lines += fault_lines(p["faults"], gt["truth"])
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Generate (or reuse) the subset's runs under ``--pop`` and export them to ``--dest``."""
    return subset_main(argv, __doc__ or "", Path("/work/pop"), plan, P.generate, export)


if __name__ == "__main__":
    raise SystemExit(main())
