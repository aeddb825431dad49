"""MoE draws of the accuracy population (issue 48 item 6): real Megatron-Core MoE runs, alltoall dispatcher.

The model, training and CPU patches are the MoE sample's (:mod:`precnb_samples._scn_megatron_moe`: 2 MoE
layers of 4 SequentialMLP experts, top-2 sigmoid router with expert bias, ``finalize_model_grads``; 3 steps
trained, all dumped), with the model seed drawn (it seeds the initial weights and the batches). Layouts:
``moe_ep1`` (world 1, the reference), ``moe_tp2ep2`` (TP 2 with sequence parallelism, EP 2 / ETP 1 folded onto
the same 2 ranks) and ``moe_tp1ep2dp2`` (EP 2 over DP 2); ``moe_pp2ep2dp2`` (PP 2 × DP 2 with EP 2 over each
stage's DP pair, world 4, one layer per stage) and ``moe_tp2pp2ep2`` (TP 2 with sequence parallelism × PP 2, EP 2
folded onto each stage's TP pair) are drawn only when asked (``draw_moe(..., layouts=[...])``, issue 48
"EP+PP>1"). Fault kinds (one expert or one rank, drawn in the EP layouts; the expert faults act on the rank
that holds the expert, global expert ``g`` of layer ``l`` on EP rank ``g // 2`` of the stage holding ``l``,
which is global rank ``stage * 2 + g // 2`` in these layouts, :func:`expert_rank`):

- ``expert_fc1_scale``: that expert's ``linear_fc1`` output times ``1 + m`` from step ``from_step``;
- ``expert_dw_only``: that expert's ``linear_fc1``/``linear_fc2`` weight gradient times ``1 + m`` (the worker's
  ``dw_only`` on the expert's global parameter name);
- ``router_logit_scale``: the layer's router logits on one rank times ``1 + m`` before the sigmoid;
- ``starved_grad_per_token``: the expert's weight gradient divided by its token count (``expert_grad_per_token``)
  from the step where it receives no token: 0/0 = NaN. The starvation is a *condition*, not the fault: every
  rank's router masks the expert's logit at that step (``route_mask``, rank ``"all"``), in the fault run, in its
  healthy twin and in its ep1 reference alike (an expert with no token is a legitimate routing outcome), so the
  twin and the reference are healthy runs with a starved expert, scored as healthy pairs too.

A MoE run spec carries ``"moe": true`` (dense specs are unchanged, so dense draws keep their content hashes) and
its runs share the population's ``runs/`` folder; initial weights live in ``seeds/moe<seed>``.

>>> plan = draw_moe(1)
>>> sorted({f["kind"] for f in plan["faults"]}) == sorted(KINDS)
True
>>> all(plan["runs"][f["twin"]]["bugs"] == f["condition"] for f in plan["faults"])
True
>>> expert_rank(3, 2)
1
"""

from __future__ import annotations

import math
import random
from typing import Any

from . import _scn_megatron_moe as M  # noqa: N812

__all__ = ["KINDS", "LAYOUTS", "draw_moe", "expert_rank", "is_moe", "run_spec"]

LAYOUTS: dict[str, dict[str, Any]] = {"moe_ep1": M.ROOTS["moe_ep1"]["layout"],
                                      "moe_tp2ep2": M.ROOTS["moe_tp2ep2"]["layout"],
                                      "moe_tp1ep2dp2": M.ROOTS["moe_tp1ep2dp2"]["layout"],
                                      # experts replicated (expert data-parallel size 2, not drawn by draw_moe):
                                      # over the DP pair, and over the TP pair (ETP 1 under TP 2)
                                      "moe_dp2": M.EDP_LAYOUTS["moe_dp2"],
                                      "moe_tp2etp1": M.EDP_LAYOUTS["moe_tp2etp1"],
                                      # pipeline parallel (not drawn by default): PP 2 x DP 2, EP 2 per stage
                                      "moe_pp2ep2dp2": M._lay(dp=2, ep=2, pp=2),
                                      # and TP 2 (sequence parallel) x PP 2, EP 2 folded onto each stage's TP pair
                                      "moe_tp2pp2ep2": M._lay(tp=2, ep=2, pp=2)}
EP = ["moe_tp2ep2", "moe_tp1ep2dp2"]
KINDS: dict[str, list[str]] = {"expert_fc1_scale": EP, "expert_dw_only": EP, "router_logit_scale": EP,
                               "starved_grad_per_token": EP}


def is_moe(spec: dict[str, Any]) -> bool:
    """Whether a run spec is a MoE run."""
    return bool(spec.get("moe"))


def stage_first_rank(layout: str, layer: int) -> int:
    """First global rank of the pipeline stage holding whole-model *layer* (rank order tp-cp-ep-dp-pp).

    >>> stage_first_rank("moe_pp2ep2dp2", 1), stage_first_rank("moe_tp2ep2", 1)
    (2, 0)
    """
    lay = LAYOUTS[layout]
    return int(layer // (M.MODEL["layers"] // lay["pp"]) * lay["tp"] * lay["dp"])


def expert_rank(expert: int, ep: int, layer: int = 0, layout: str | None = None) -> int:
    """Global rank holding global *expert* (of whole-model *layer* in *layout*) in the EP layouts.

    The EP rank is the rank inside the stage there (EP folded onto TP or DP, ``ep = tp * dp``; ep1: 0).

    >>> expert_rank(3, 2, 1, "moe_pp2ep2dp2"), expert_rank(1, 2, 1, "moe_pp2ep2dp2"), expert_rank(3, 2, 0)
    (3, 2, 1)
    """
    return (stage_first_rank(layout, layer) if layout else 0) + expert // (M.MODEL["experts"] // ep)


def run_spec(seed: int, layout: str, bugs: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """One MoE run of the population (what its content hash is taken over)."""
    return {"moe": True, "seed": seed, "layout": layout, "threads": 1, "dropout": 0.0, "level": "mix",
            "bugs": bugs or [], "train_steps": M.TRAIN_STEPS, "dump_steps": M.DUMP_STEPS}


def _fault(rng: random.Random, kind: str, layout: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """One drawn fault: (the injection, the condition shared with its twin and reference)."""
    ep = LAYOUTS[layout]["ep"]
    layer, expert = rng.randrange(M.MODEL["layers"]), rng.randrange(M.MODEL["experts"])
    m = round(math.exp(rng.uniform(math.log(1e-3), math.log(1e-1))), 6)
    step = rng.randint(1, M.TRAIN_STEPS - 1)
    module = rng.choice(["linear_fc1", "linear_fc2"])
    rank = expert_rank(expert, ep, layer, layout)
    b: dict[str, Any] = {"kind": kind, "rank": rank, "layer": layer, "from_step": step}
    if kind == "expert_fc1_scale":
        b.update(expert=expert, m=m)
    elif kind == "expert_dw_only":
        b.update(kind="dw_only", expert=expert, m=m,
                 param=f"decoder.layers.{layer}.mlp.experts.local_experts.{expert}.{module}.weight")
    elif kind == "router_logit_scale":
        b.update(rank=stage_first_rank(layout, layer) + rng.randrange(2), m=m)
    elif kind == "starved_grad_per_token":
        b.update(kind="expert_grad_per_token", expert=expert, module=module)
        mask = {"kind": "route_mask", "rank": "all", "layer": layer, "expert": expert, "steps": [step]}
        return b, [mask]
    return b, []


def draw_moe(seed: int, repeat: int = 2, kinds: list[str] | None = None,
             layouts: list[str] | None = None) -> dict[str, Any]:
    """Plan one MoE draw (the dense draw's schema; draw key ``moe<seed>``).

    *layouts*: the EP layouts of the healthy pairs and of every fault kind instead of the default two (draw key
    ``moe<seed>_<layouts without "moe_">``; e.g. ``["moe_pp2ep2dp2"]``).

    Two model seeds; healthy pairs: moe_tp2ep2 and moe_tp1ep2dp2 against moe_ep1 of the same seed, and every
    starved condition's twin against its masked ep1 reference. Each kind is drawn *repeat* times, its EP
    layouts in a drawn order (so every layout when *repeat* >= 2), at a random seed; a fault's twin has the
    same seed, layout and condition, its reference is moe_ep1 with the same condition.
    """
    rng = random.Random(f"moe-{seed}")  # noqa: S311 (a reproducible draw, not a secret)
    seeds = sorted(rng.sample(range(1000, 10000), 2))
    from ._pop_plan import healthy_pairs, run_registry

    runs, add = run_registry()
    healthy = healthy_pairs(seeds, "moe_ep1", layouts or EP, run_spec, add, moe=True)
    faults = []
    where = {kind: layouts or KINDS[kind] for kind in KINDS}
    orders = {kind: rng.sample(where[kind], len(where[kind])) for kind in KINDS}  # each kind in every layout
    for i in range(repeat):
        for kind in kinds or list(KINDS):
            lay, s = orders[kind][i % len(orders[kind])], rng.choice(seeds)
            bug, cond = _fault(rng, kind, lay)
            twin, ref = add(run_spec(s, lay, cond)), add(run_spec(s, "moe_ep1", cond))
            if cond:
                c = cond[0]
                healthy.append({"name": f"{lay}+starved(L{c['layer']}E{c['expert']}s{c['steps'][0]})@{s}",
                                "seed": s, "layout": lay, "run": twin, "reference": ref, "moe": True,
                                "condition": cond})
            faults.append({"name": f"{kind}#{i}", "kind": kind, "seed": s, "layout": lay, "injection": bug,
                           "condition": cond, "run": add(run_spec(s, lay, [*cond, bug])), "twin": twin,
                           "reference": ref, "moe": True})
    key = f"moe{seed}" + ("_" + "_".join(x.removeprefix("moe_") for x in layouts) if layouts else "")
    return {"draw_seed": key, "size": f"moe x{repeat}", "seeds": seeds, "runs": runs, "healthy": healthy,
            "faults": faults}


def worker_spec(spec: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any], str]:
    """(model, layout, seed folder name) of a MoE run spec for the worker."""
    return dict(M.MODEL, seed=spec["seed"]), dict(LAYOUTS[spec["layout"]]), f"moe{spec['seed']}"
