"""Synthetic sharded runs built from real arrays, so merged statistics have exact answers.

A tiny "model" of L layers; every tensor is a real numpy array whose statistics are computed
exactly as msprobe does (max, min, mean, L2 norm). Shards are real slices (np.array_split,
so unequal sizes are possible) and partial sums real addends.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import xarray as xr

from precnb.analysis.layout import Layout
from precnb.io import RecordBuilder, assemble


def stats(a: np.ndarray) -> dict[str, float]:
    a = np.asarray(a, dtype=np.float64)
    return {"max": float(a.max()), "min": float(a.min()), "mean": float(a.mean()),
            "norm": float(np.sqrt((a * a).sum()))}


@dataclass
class FullTensor:
    label_tpl: str  # with {layer}, {chunk} and {call} placeholders
    node_tpl: str
    role: str
    kind: str
    array: np.ndarray
    layer: int
    how: str  # "shard:DIM", "replicated", "partial", "reduce_in", "reduce_out", "expert:J"


def full_model(n_layers: int = 4, *, rows: int = 6, seed: int = 0, experts: int = 0) -> list[FullTensor]:
    rng = np.random.default_rng(seed)
    out: list[FullTensor] = []
    mod = "Module.{chunk}decoder.layers.{layer}"
    for i in range(n_layers):
        w = rng.normal(size=(rows, 4))
        out.append(FullTensor(f"{mod}.mlp.linear_fc1.ColumnParallelLinear.forward.0.parameters.weight",
                              f"{mod}.mlp.linear_fc1.ColumnParallelLinear.forward.0", "parameter", "module",
                              w, i, "shard:0"))
        act = rng.normal(size=(3, rows)) * (i + 1)
        out.append(FullTensor("Functional.gelu.{call}.forward.output.0", "Functional.gelu.{call}.forward",
                              "output", "api", act, i, "shard:-1"))
        full = rng.normal(size=(3, 4))
        out.append(FullTensor("Functional.linear.{call}.forward.output.0", "Functional.linear.{call}.forward",
                              "output", "api", full, i, "partial"))
        out.append(FullTensor("Distributed.all_reduce.{call}.forward.input.0",
                              "Distributed.all_reduce.{call}.forward", "input", "api", full, i, "reduce_in"))
        out.append(FullTensor("Distributed.all_reduce.{call}.forward.output.0",
                              "Distributed.all_reduce.{call}.forward", "output", "api", full, i, "reduce_out"))
        out.append(FullTensor(f"{mod}.norm.LayerNorm.forward.0.parameters.weight",
                              f"{mod}.norm.LayerNorm.forward.0", "parameter", "module",
                              1 + 0.1 * rng.normal(size=(4,)), i, "replicated"))
        for j in range(experts):
            out.append(FullTensor(f"{mod}.mlp.experts.local_experts.{{expert}}.Linear.forward.0.parameters.weight",
                                  f"{mod}.mlp.experts.local_experts.{{expert}}.Linear.forward.0", "parameter",
                                  "module", rng.normal(size=(2, 4)) * (j + 1), i, f"expert:{j}"))
    return out


def make_run(layout: Layout, *, n_layers: int = 4, rows: int = 6, experts: int = 0, steps: int = 2,
             seed: int = 0, cp_dim: int = -2, perturb: dict | None = None) -> xr.Dataset:
    """One run laid out as *layout*. ``perturb={"rank": r, "step": s, "label": substr}``."""
    per_step = [full_model(n_layers, rows=rows, seed=seed + s, experts=experts) for s in range(steps)]
    lpc = n_layers // (layout.pp * layout.vpp)
    records = []
    for r in range(layout.world_size):
        c = layout.coords(r)
        for s in range(steps):
            b = RecordBuilder(s, r)
            # execution order: chunk by chunk, layer by layer
            for chunk in range(layout.vpp):
                first = (chunk * layout.pp + c["pp"]) * lpc
                for t in per_step[s]:
                    if not first <= t.layer < first + lpc:
                        continue
                    local = t.layer - first
                    call = local + chunk * lpc
                    a = t.array
                    if t.how.startswith("expert:"):
                        j = int(t.how.split(":")[1])
                        n_local = experts // layout.ep
                        if j // n_local != c["ep"]:
                            continue
                        jl = j % n_local
                    else:
                        jl = 0
                    if t.how.startswith("shard:") and layout.tp > 1:
                        a = np.array_split(a, layout.tp, axis=int(t.how.split(":")[1]))[c["tp"]]
                    elif t.how in ("partial", "reduce_in") and layout.tp > 1:
                        rng = np.random.default_rng(1000 + t.layer + 100 * s)
                        parts = [rng.normal(size=a.shape) for _ in range(layout.tp - 1)]
                        parts.append(a - sum(parts))
                        a = parts[c["tp"]]
                    if layout.cp > 1 and t.role != "parameter" and t.how != "replicated":
                        a = np.array_split(a, layout.cp, axis=cp_dim)[c["cp"]]
                    chunk_txt = f"{chunk}." if layout.vpp > 1 else ""
                    fmt = {"chunk": chunk_txt, "layer": local, "call": call, "expert": jl}
                    label, node = t.label_tpl.format(**fmt), t.node_tpl.format(**fmt)
                    st = stats(a)
                    if perturb and perturb["rank"] == r and perturb["step"] == s and perturb["label"] in label:
                        st["norm"] *= 1.01
                    b.add(label, st, shape=list(a.shape), node=node, kind=t.kind, role=t.role,
                          direction="forward", dtype="torch.float32", api=node.rsplit(".", 2)[0])
            records.append(b.build())
    return assemble(records, source_format="synthetic")


def reference_stats(n_layers: int = 4, *, rows: int = 6, experts: int = 0, steps: int = 2, seed: int = 0):
    """label (global names, no chunk prefix, global API calls) → per-step exact statistics."""
    out: dict[str, list[dict[str, float]]] = {}
    for s in range(steps):
        for t in full_model(n_layers, rows=rows, seed=seed + s, experts=experts):
            j = int(t.how.split(":")[1]) if t.how.startswith("expert:") else 0
            label = t.label_tpl.format(chunk="", layer=t.layer, call=t.layer, expert=j)
            out.setdefault(label, []).append(stats(t.array))
    return out
