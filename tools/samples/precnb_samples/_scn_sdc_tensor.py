"""The faulty-device sample in tensor mode (issue 28, item 4): the departing op re-run on its dumped inputs.

``sdc_tensor``: the ``sdc`` sample's job1 (tp2 x dp2 on 4 ranks, device ``10.0.0.1:1`` serving
rank 1) dumped with ``task: tensor``, level L1, only ``torch.rsqrt``, ``Tensor.__mul__`` and
``F.linear`` (msprobe's ``list``), forward only, steps 1 and 2 of 3. The device flips one bit of
one ``torch.rsqrt`` output element at step 1 (blocks.0.mlp_norm); step 2 is clean (the gradient
sync re-synchronised the replicas). Every input and output tensor of those ops is a ``.pt`` file,
so the departing op can be recomputed from rank 1's dumped inputs on another device: the ground
truth states (from the tensor files, with torch) that the inputs of ``Torch.rsqrt.0.forward`` are
bit-identical on ranks 0 and 1, that its outputs are not (one element, one bit), and that
``torch.rsqrt`` of rank 1's dumped input on the CPU equals rank 0's dumped output bit for bit and
differs from rank 1's: a device fault of rank 1's device.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from . import _dumps as D  # noqa: N812
from ._scenarios import Context, _check, _header, _layout, _load_all, write_json
from ._scn_sdc import (
    FAULT,
    FAULT_NODE,
    FAULTY_DEVICE,
    MODEL,
    PLACEMENTS,
    _device,
    _key,
    _module,
    _reference,
    _replicated,
    _stats,
    rank_tables,
)
from ._sdc_train import DP, TP, WORLD, DeviceFault, SdcRun, dp_groups, launch, tp_groups

__all__ = ["GENERATORS"]

JOB = "job1"
TRAINED_STEPS = 3
DUMP_STEPS = [1, 2]
FAULT_STEPS = (1,)
OPS = ["Torch.rsqrt", "Tensor.__mul__", "Functional.linear"]
_CONFIG: dict[str, Any] = {"task": "tensor", "dump_path": None, "rank": [], "step": DUMP_STEPS, "level": "L1",
                           "async_dump": False, "tensor": {"scope": [], "list": OPS, "data_mode": ["forward"]}}


def _pt(root: Path, step: int, rank: int, leaf: dict) -> torch.Tensor:
    """One dumped tensor file, read safely."""
    path = root / f"step{step}" / f"rank{rank}" / "dump_tensor_data" / leaf["data_name"]
    return torch.load(path, weights_only=True, map_location="cpu")


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int32)


def _recompute(root: Path, data: dict, step: int, group: list[int], rank: int) -> dict[str, Any]:
    """The departing op re-run on ``rank``'s dumped input (CPU): which replica's dumped output it equals."""
    ins = {r: _pt(root, step, r, D.node_leaves(data[(step, r)][FAULT_NODE])["input_args.0"]) for r in group}
    outs = {r: _pt(root, step, r, D.node_leaves(data[(step, r)][FAULT_NODE])["output.0"]) for r in group}
    _check(all(torch.equal(_bits(ins[r]), _bits(ins[group[0]])) for r in group), "inputs not bit-identical")
    again = torch.rsqrt(ins[rank])
    diff = (_bits(outs[group[0]]) != _bits(outs[group[1]])).nonzero().tolist()
    _check(len(diff) == 1, f"outputs differ at {diff}")
    pos = diff[0]
    xor = int(_bits(outs[group[0]])[tuple(pos)]) ^ int(_bits(outs[group[1]])[tuple(pos)])
    return {"rank": rank, "device": "cpu", "torch": torch.__version__,
            "inputs_bit_identical": True,
            "outputs_differ_at": {"position": pos, "xor_bits": [b for b in range(32) if xor >> b & 1],
                                  **{f"rank{r}": float(outs[r][tuple(pos)]) for r in group}},
            "equals_dumped_output_of": [r for r in group if torch.equal(_bits(again), _bits(outs[r]))]}


def gen_sdc_tensor(ctx: Context, sample: Path) -> dict:
    """Job1 in tensor mode (L1, three ops), the fault at step 1: the op recomputed on the CPU agrees with rank 0."""
    ref = _reference(ctx)
    cfg = dict(_CONFIG, dump_path=str(sample))
    config = sample / "configs" / "config.json"
    write_json(config, cfg)
    fault = DeviceFault(steps=FAULT_STEPS, call=FAULT.call, position=FAULT.position, bit=FAULT.bit)
    out = launch(SdcRun(config_path=str(config), log_dir=str(ctx.log_dir), world_size=WORLD, steps=TRAINED_STEPS,
                        model=MODEL, tag="sdc_tensor", placement=PLACEMENTS[JOB], faulty_device=FAULTY_DEVICE,
                        fault=fault))
    found = [s for s, _ in D.step_dirs(sample)]
    _check(found == DUMP_STEPS, f"steps {found}")
    data = _load_all(sample)
    faulty_rank = next(r for r, d in PLACEMENTS[JOB].items() if d == FAULTY_DEVICE)
    flips = out[faulty_rank]["flipped"]
    _check([f["step"] for f in flips] == list(FAULT_STEPS), f"flips {flips}")
    nodes = list(data[(DUMP_STEPS[0], 0)])
    _check(all(any(n.startswith(op + ".") for op in OPS) for n in nodes), f"unlisted nodes dumped: {nodes}")
    tp_rep = [k for k in _replicated(ref, tp_groups()) if k[0] in data[(DUMP_STEPS[0], 0)]]
    dp_rep = [k for k in _replicated(ref, dp_groups()) if k[0] in data[(DUMP_STEPS[0], 0)]]
    events = []
    for step in DUMP_STEPS:
        for kind, groups, rep in (("tp", tp_groups(), tp_rep), ("dp", dp_groups(), dp_rep)):
            for g in groups:
                dep = [(n, p) for n, p in rep
                       if len({_key(D.node_leaves(data[(step, r)][n])[p]) for r in g}) > 1]
                if dep:
                    events.append({"step": step, "group": g, "kind": kind, "first": dep[0], "later": dep[1:]})
    group = next(g for g in tp_groups() if faulty_rank in g)
    got = [(e["step"], e["group"], e["first"]) for e in events]
    _check(got == [(1, group, (FAULT_NODE, "output.0"))], f"departures {got}")
    ev = events[0]
    recs = {r: data[(1, r)][FAULT_NODE] for r in group}
    ins_same = all(_key(D.node_leaves(recs[r])["input_args.0"]) == _key(D.node_leaves(recs[group[0]])["input_args.0"])
                   for r in group)
    _check(ins_same, "the departing op's inputs differ in the statistics")
    recomputed = _recompute(sample, data, 1, group, faulty_rank)
    healthy = [r for r in group if r != faulty_rank]
    _check(recomputed["equals_dumped_output_of"] == healthy, f"recomputation {recomputed}")
    flip = flips[0]
    _check(recomputed["outputs_differ_at"]["position"] == flip["position"]
           and recomputed["outputs_differ_at"]["xor_bits"] == [flip["bit"]], f"flip {flip} vs {recomputed}")
    fault_entry = {
        "kind": "replica_departure", "role": "origin", "run": JOB, "step": 1, "rank": faulty_rank, "ranks": group,
        "group": "tp", "node": FAULT_NODE, "tensor": "output.0", "module": _module(sample, 1, group[0], FAULT_NODE),
        "inputs_identical": True, "random_op": False, "cause": "compute_fault",
        "cause_text": "inputs identical across the TP replicas, output differs: a compute fault on that device, or a "
                      "non-deterministic kernel",
        "device": _device(JOB, faulty_rank), "candidates": [{"rank": r, **_device(JOB, r)} for r in group],
        "bit_flip": flip,
        "how": (f"the device {FAULTY_DEVICE[0]}:{FAULTY_DEVICE[1]} computes torch.rsqrt wrongly at step 1: call "
                f"{FAULT.call} of the step (blocks.0.mlp_norm) gets bit {flip['bit']} of output element "
                f"{flip['position']} flipped ({flip['correct']:.7g} -> {flip['computed']:.7g})"),
        "stats": {f"rank{r}": _stats(D.node_leaves(recs[r])["output.0"]) for r in group},
        "dump_json": f"step1/rank{faulty_rank}/dump.json",
        "other_dump_json": [f"step1/rank{r}/dump.json" for r in healthy],
        "tensor_files": {f"rank{r}": {"input_args.0": D.node_leaves(recs[r])["input_args.0"]["data_name"],
                                      "output.0": D.node_leaves(recs[r])["output.0"]["data_name"]} for r in group},
        "recomputed": recomputed,
        "repro_verdict": (f"torch.rsqrt of rank {faulty_rank}'s dumped input, recomputed on the CPU, equals rank "
                          f"{healthy[0]}'s dumped output bit for bit and differs from rank {faulty_rank}'s: rank "
                          f"{faulty_rank}'s device ({FAULTY_DEVICE[0]}:{FAULTY_DEVICE[1]}) computed it wrongly"),
        "consequences": {"tensors": len(ev["later"]), "nodes": len(dict.fromkeys(n for n, _ in ev["later"])),
                         "first": " ".join(ev["later"][0]) if ev["later"] else None},
    }
    size = sum(p.stat().st_size for p in sample.rglob("*") if p.is_file())
    _check(size < 2_000_000, f"sdc_tensor is {size} bytes")
    return _header(
        ctx, "sdc_tensor",
        "the sdc sample's job1 (tp2 x dp2, device 10.0.0.1:1 serving rank 1) in tensor mode (task tensor, level L1, "
        "torch.rsqrt, Tensor.__mul__ and F.linear only, forward, steps 1-2): the device flips one bit of one "
        "torch.rsqrt output element at step 1; the op's dumped inputs are bit-identical across the TP replicas, "
        "and rsqrt recomputed on the CPU from rank 1's dumped input equals rank 0's dumped output, not rank 1's",
        MODEL, dump_files=_layout(sample, sample), task="tensor", level="L1", list=OPS, data_mode=["forward"],
        world_size=WORLD, distributed_initialised=True, steps=DUMP_STEPS, trained_steps=TRAINED_STEPS,
        layout={"tp": TP, "dp": DP, "pp": 1, "order": "tp-dp (Megatron: TP fastest)", "tp_groups": tp_groups(),
                "dp_groups": dp_groups(), "sequence_parallel": False, "model_parallel_rng_region": None},
        placement={JOB: {str(r): _device(JOB, r) for r in range(WORLD)}},
        rank_tables={JOB: rank_tables(sample, JOB, PLACEMENTS[JOB])},
        replicated={"tp_tensors": len(tp_rep), "dp_tensors": len(dp_rep),
                    "rule": "the sdc samples' rule (statistics equal within every group at every dumped step of the "
                            "clean run), on the tensors this dump records"},
        faulty_device={"host": FAULTY_DEVICE[0], "device": FAULTY_DEVICE[1]},
        faults=[fault_entry],
        checks={"departures": [{"step": e["step"], "group": e["group"], "kind": e["kind"],
                                "first": " ".join(e["first"]), "later": len(e["later"])} for e in events],
                "step2": "no replicated tensor departs (the gradient sync re-synchronised the replicas)",
                "size_bytes": size},
        losses={str(r): v["losses"] for r, v in out.items()},
    )


GENERATORS: dict[str, Callable[[Context, Path], dict[str, Any]]] = {"sdc_tensor": gen_sdc_tensor}
