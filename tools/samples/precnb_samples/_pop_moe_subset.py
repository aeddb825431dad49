"""A committed MoE subset of the accuracy population: ``data_samples/megatron_moe_edp`` (issue 48).

Real Megatron-Core MoE runs of the population generator (:mod:`precnb_samples._pop_moe`: 2 MoE layers of 4
SequentialMLP experts, alltoall dispatcher, 3 steps trained, all dumped at level mix) of one model seed, in
layouts where an expert has one copy or two (the expert data-parallel size, ``edp``):

- ``moe_ep1`` (world 1): the reference;
- ``moe_tp1ep2dp2`` (EP 2 over DP 2, edp 1: each expert on one rank, its gradient over both replicas' tokens),
  healthy and with one expert's ``linear_fc1`` weight gradient scaled from step 1 (``dw_only``);
- ``moe_dp2`` (TP 1, DP 2, EP 1: edp 2, every expert on both ranks), healthy and with one replica's copy of an
  expert's ``linear_fc2`` weight gradient scaled from step 1 (before the gradient reduction);
- ``moe_tp2etp1`` (TP 2 with sequence parallelism, EP 1, ETP 1: edp 2 over the TP pair, every expert whole on
  both ranks), healthy and with one TP rank's copy of an expert's ``linear_fc1`` weight gradient scaled.

Steps 0-1 are kept (every fault is at step 1), without ``stack.json`` and logs; ``dump.json`` and
``construct.json`` re-serialised compact (same JSON values). ``ground_truth.json`` has the population
manifest's schema (``runs``, ``draws``, ``truth``: the first dumped step where a fault run differs bit-exactly
from its twin, read back from the dumps by :mod:`precnb_samples._pop_truth`).

``PYTHONPATH=tools/samples python -m precnb_samples._pop_moe_subset --pop /work/pop_moe --dest
data_samples/megatron_moe_edp``
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from . import _pop_moe as PM  # noqa: N812
from . import _population as P  # noqa: N812
from ._pop_plan import copy_run, fault_lines, subset_main
from .scrub import scrub_tree

SEED = 9650
KEEP = [0, 1]
# (name, layout, injection); every fault's twin is the same layout's healthy run, its reference moe_ep1
FAULTS: list[tuple[str, str, dict[str, Any]]] = [
    ("expert_dw_only_edp1", "moe_tp1ep2dp2",
     {"kind": "dw_only", "rank": 0, "layer": 1, "from_step": 1, "expert": 0, "m": 0.018629,
      "param": "decoder.layers.1.mlp.experts.local_experts.0.linear_fc1.weight"}),
    ("expert_dw_only_dp_replica", "moe_dp2",
     {"kind": "dw_only", "rank": 1, "layer": 1, "from_step": 1, "expert": 2, "m": 0.02,
      "param": "decoder.layers.1.mlp.experts.local_experts.2.linear_fc2.weight"}),
    ("expert_dw_only_tp_replica", "moe_tp2etp1",
     {"kind": "dw_only", "rank": 1, "layer": 0, "from_step": 1, "expert": 3, "m": 0.02,
      "param": "decoder.layers.0.mlp.experts.local_experts.3.linear_fc1.weight"}),
]
LAYOUT_TEXT = {"moe_tp1ep2dp2": "dp=2,ep=2", "moe_dp2": "dp=2", "moe_tp2etp1": "tp=2,ep=1,etp=1"}


def plan() -> dict[str, Any]:
    """The subset's plan, in :func:`precnb_samples._pop_moe.draw_moe`'s form (draw key ``moe_edp``)."""
    ref = PM.run_spec(SEED, "moe_ep1")
    runs = {P.run_id(ref): ref}
    healthy, faults = [], []
    for lay in LAYOUT_TEXT:
        spec = PM.run_spec(SEED, lay)
        runs[P.run_id(spec)] = spec
        healthy.append({"name": f"{lay}@{SEED}", "seed": SEED, "layout": lay, "run": P.run_id(spec),
                        "reference": P.run_id(ref), "moe": True})
    for name, lay, bug in FAULTS:
        spec = PM.run_spec(SEED, lay, [bug])
        runs[P.run_id(spec)] = spec
        faults.append({"name": name, "kind": "expert_dw_only", "seed": SEED, "layout": lay, "injection": bug,
                       "condition": [], "run": P.run_id(spec), "twin": P.run_id(PM.run_spec(SEED, lay)),
                       "reference": P.run_id(ref), "moe": True})
    return {"draw_seed": "moe_edp", "size": "moe subset", "seeds": [SEED], "runs": runs, "healthy": healthy,
            "faults": faults}


def export(pop: Path, dest: Path) -> dict[str, Any]:
    """Copy the subset's runs from *pop* to *dest* (steps 0-1, no stack.json, no logs, relative dump_path)."""
    p = plan()
    manifest = P.load_manifest(pop)
    if dest.exists():
        shutil.rmtree(dest)
    for rid in p["runs"]:
        src, dst = pop / "runs" / rid, dest / "runs" / rid
        copy_run(src, dst, lambda name, step: name == "stack.json" or step not in {f"step{s}" for s in KEEP})
    runs = {rid: {k: v for k, v in manifest["runs"][rid].items() if k != "seconds"} for rid in p["runs"]}
    truth = {f["run"]: manifest["truth"][f["run"]] for f in p["faults"]}
    gt = {"runs": runs, "draws": {"moe_edp": {k: p[k] for k in ("size", "seeds", "healthy", "faults")}},
          "truth": truth, "layouts": {k: {**PM.LAYOUTS[k], "text": v} for k, v in LAYOUT_TEXT.items()},
          "steps_kept": KEEP}
    (dest / "ground_truth.json").write_text(json.dumps(gt, indent=1) + "\n", encoding="utf-8")
    (dest / "README.md").write_text(_readme(p, gt), encoding="utf-8")
    scrub_tree(dest)
    return gt


def _readme(p: dict[str, Any], gt: dict[str, Any]) -> str:
    lines = ["# megatron_moe_edp: MoE runs whose experts have one copy or two (expert data parallelism)", "",
             "Generated by `PYTHONPATH=tools/samples python -m precnb_samples._pop_moe_subset --pop POP --dest "
             "data_samples/megatron_moe_edp` from runs of the MoE population generator "
             "(`tools/samples/precnb_samples/_pop_moe.py`; Megatron-Core 0.19.2, msprobe 26.2.0 on CPU/gloo): "
             f"model seed {SEED}, 2 MoE layers of 4 SequentialMLP experts (top-2 sigmoid router with expert bias, "
             "alltoall dispatcher), 3 steps trained, steps 0-2 dumped (statistics, level mix), steps "
             f"{KEEP} kept. `stack.json` and the logs are left out, `dump.json` and `construct.json` are "
             "re-serialised without indentation (same JSON values).", "",
             "| run | layout | `--target-layout` | fault |", "|---|---|---|---|"]
    for rid, spec in p["runs"].items():
        lines.append(f"| `runs/{rid}` | {spec['layout']} | `{LAYOUT_TEXT.get(spec['layout'], '-')}` | "
                     f"{spec['bugs'] or '-'} |")
    lines += ["", "Healthy pairs (no finding is right: `precnb diff REF RUN --target-layout LAYOUT`, "
              "`precnb replicas RUN`):", ""]
    lines += [f"- `{h['run']}` ({h['layout']}) vs `{h['reference']}` (moe_ep1)" for h in p["healthy"]]
    lines += ["", "Faults (ground truth read back from the dumps against the healthy twin):", ""]
    lines += fault_lines(p["faults"], gt["truth"], label="name", notes=False)
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Generate (or reuse) the subset's runs under ``--pop`` and export them to ``--dest``."""
    return subset_main(argv, __doc__ or "", Path("/work/pop_moe"), plan, P.generate, export, no_export=True)


if __name__ == "__main__":
    raise SystemExit(main())
