"""Loss spike from data in a model with a causal mask (issue 47): ``spike_data_mask``.

The run is :mod:`precnb_samples._scn_spike`'s ``spike_data`` (2-rank data parallel, 10 steps,
rank 1's batch at step 6 holds tokens never seen in training) with causal self-attention in
the block: every step and rank, ``scores.masked_fill(causal_mask, -inf)`` puts ``-inf`` above
the diagonal of the attention scores before the softmax. That ``-inf`` is there by design; the
spike's cause is rank 1's batch, and a diagnosis that calls the mask a numerics overflow is
wrong.

The committed files hold no absolute path of the machine that made them: the dump config's
``dump_path`` is rewritten relative to the sample and msprobe's ``stack.json`` frames by
:func:`precnb_samples.scrub.scrub_paths` (:func:`relative_paths`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from . import _dumps as D  # noqa: N812
from ._scenarios import Context, _check, _header
from ._scn_spike import (
    STEPS,
    WORLD,
    _common,
    _run,
    _series,
    _spike_block,
    _stats,
    check_data_spike,
    data_spike_facts,
)
from .scrub import leftovers, scrub_paths

__all__ = ["GENERATORS", "relative_paths"]


def relative_paths(sample: Path, dump: Path) -> list[str]:
    """Rewrite absolute paths in the JSON files under *sample*; return the files still holding one.

    ``dump_path`` in ``configs/config.json`` becomes *dump* relative to *sample*; the other paths are
    rewritten by :func:`precnb_samples.scrub.scrub_paths` (the repository root dropped, ``<venv>/site-packages/``,
    ``<python>/lib/python3.N/``).

    >>> import tempfile, json
    >>> d = Path(tempfile.mkdtemp())
    >>> _ = (d / "stack.json").write_text(json.dumps(["File /opt/x/lib/python3.11/site-packages/t.py, line 1"]))
    >>> relative_paths(d, d / "dump"), json.loads((d / "stack.json").read_text())
    ([], ['File <venv>/site-packages/t.py, line 1'])
    """
    left = []
    for f in sorted(sample.rglob("*.json")):
        text = f.read_text(encoding="utf-8")
        if f.name == "config.json" and f.parent.name == "configs":
            text = text.replace(f'"dump_path": "{dump}"', f'"dump_path": "{dump.relative_to(sample).as_posix()}"')
        text = scrub_paths(text)
        f.write_text(text, encoding="utf-8")
        if leftovers(text):
            left.append(str(f.relative_to(sample)))
    return left


def _mask_records(data: dict, step: int, rank: int) -> list[tuple[str, str, dict]]:
    """(node, leaf, stats) of the ``masked_fill`` outputs holding ``-inf`` at (step, rank)."""
    out = []
    for node, rec in data[(step, rank)].items():
        if ".masked_fill" not in node:
            continue
        for path, leaf in D.node_leaves(rec).items():
            if path.startswith("output") and leaf.get("Min") == -math.inf:
                out.append((node, path, _stats(leaf)))
    return out


def gen_spike_data_mask(ctx: Context, sample: Path) -> dict:
    """Rank 1's batch at step 6 holds unseen tokens; the causal mask's -inf is at every dumped step and rank."""
    name = "spike_data_mask"
    r = _run(ctx, sample, name)
    case, data = r["case"], r["data"]
    model = case["model"]
    step, rank, ids = check_data_spike(r, model.vocab)
    node, bad = "Functional.embedding.0.forward", ids[f"rank{rank}"][f"step{step}"]
    masks = {f"step{s}/rank{k}": _mask_records(data, s, k) for s in case["window"] for k in range(WORLD)}
    _check(all(len(v) == 1 for v in masks.values()) and len({v[0][:2] for v in masks.values()}) == 1,
           f"masked_fill -inf records {masks}")
    mask_node, mask_leaf, _ = next(iter(masks.values()))[0]
    mon = _series(r["folders"], "actv", "embed.input", "mean", range(STEPS))
    construct = D.load_json(r["root"] / f"step{step}" / f"rank{rank}" / "construct.json")
    left = relative_paths(sample, r["root"])
    _check(not left, f"absolute paths left in {left}")
    return _header(
        ctx, name,
        f"loss spike from data with a causal mask: spike_data's run with causal self-attention; every step and rank "
        f"{mask_node} fills the attention scores above the diagonal with -inf before the softmax (by design); at "
        f"step {step} rank {rank}'s batch holds tokens drawn uniformly from {model.vocab // 2}..{model.vocab - 1} "
        f"(never seen in training), so rank {rank}'s loss jumps while rank 0's does not",
        model, **_common(sample, r), spike=_spike_block(r, step),
        **data_spike_facts(model, step, rank, node, construct, bad, mon),
        not_causes=[{"node": mask_node, "tensor": mask_leaf, "why": "the causal mask: masked_fill(causal_mask, -inf) "
                     "writes -inf at the same places at every step and rank, by design (not a numerics overflow)"}],
        evidence={"token_ids": ids, "monitor_embed_input_mean_by_step": mon,
                  "causal_mask": {k: v[0][2] for k, v in masks.items()},
                  "series": [f"dump {node} input_args.0 (Min/Max of the int64 token ids)",
                             f"dump {mask_node} {mask_leaf} (Min = -inf at every dumped step and rank)",
                             "loss_log.csv: rank 1 jumps at the step, rank 0 does not"]},
        checks={"spike_steps_mean": r["spikes"], "spike_steps_by_rank": r["rank_spikes"]},
    )


GENERATORS: dict[str, Callable[[Context, Path], dict[str, Any]]] = {"spike_data_mask": gen_spike_data_mask}
