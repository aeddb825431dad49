"""Faulty-device scenarios (issue 28): replica departures with identical inputs, followed to a host and device.

A tp2 x dp2 job (4 ranks, :mod:`precnb_samples._sdc_train`) whose ranks are placed on two hosts
with two devices each by a rank table. Samples:

* ``sdc``: the same training twice, job1 and a rescheduled job2 with another rank -> device
  placement; device ``10.0.0.1:1`` computes one ``torch.rsqrt`` output element wrongly (one bit
  flipped) at steps 1 and 3 of job1 (where it serves rank 1) and at step 2 of job2 (rank 2);
  the rank tables of both jobs as HCCL ``rank_table_file`` JSON and as ``rank,host,device`` CSV;
* ``sdc_clean``: the same training with no fault (placement of job1): nothing departs;
* ``sdc_md5``: job1 again, dumped with ``summary_mode: md5`` (CRC-32 of every tensor);
* ``sdc_rank``: job1 and job2 placements with no faulty device but a code bug: the embedding
  noise (``torch.normal``, outside any model-parallel RNG region) is seeded with Megatron's
  tensor-parallel offset, so TP rank 1 (ranks 1 and 3) draws other noise than its replica at
  every step, on whatever device it runs: the departure follows the rank.

Which tensors are replicated (bit-identical across the TP ranks of a group, or across the DP
ranks of a group) is read from a clean run of the same training (the ``sdc_clean`` job, rerun in
the log folder when another sample needs it). Every departure in ``ground_truth.json`` is found
in the produced dumps and checked against what was injected.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from . import _dumps as D  # noqa: N812
from ._model import ModelConfig
from ._scenarios import Context, _check, _header, _layout, _load_all, write_json
from ._sdc_train import (
    DP,
    NOISE_SEED,
    NOISE_STD,
    TP,
    TP_SEED_OFFSET,
    WORLD,
    DeviceFault,
    SdcRun,
    dp_groups,
    launch,
    tp_groups,
    tp_rank,
)

__all__ = ["GENERATORS", "rank_tables"]

MODEL = ModelConfig(blocks=1, attention=False)
TRAINED_STEPS = 4
DUMP_STEPS = [1, 2, 3]
FAULTY_DEVICE = ("10.0.0.1", "1")
PLACEMENTS: dict[str, dict[int, tuple[str, str]]] = {
    "job1": {0: ("10.0.0.1", "0"), 1: ("10.0.0.1", "1"), 2: ("10.0.0.2", "0"), 3: ("10.0.0.2", "1")},
    # rescheduled: the faulty device now serves rank 2, next to a device it never shared a TP group with
    "job2": {0: ("10.0.0.2", "1"), 1: ("10.0.0.1", "0"), 2: ("10.0.0.1", "1"), 3: ("10.0.0.2", "0")},
}
FAULT_STEPS = {"job1": (1, 3), "job2": (2,)}
FAULT = DeviceFault(steps=())  # its call, position and bit; the steps come from FAULT_STEPS
FAULT_NODE = "Torch.rsqrt.0.forward"
NOISE_NODE = "Torch.normal.0.forward"

_CONFIG: dict[str, Any] = {"task": "statistics", "dump_path": None, "rank": [], "step": DUMP_STEPS, "level": "mix",
                           "async_dump": False,
                           "statistics": {"scope": [], "list": [], "data_mode": ["forward"],
                                          "summary_mode": "statistics"}}
_REFERENCE: dict[Path, dict[tuple[int, int], dict]] = {}


# ------------------------------------------------------------------------------------ running
def _config(sample: Path, name: str, root: Path, summary: str = "statistics") -> Path:
    cfg = dict(_CONFIG, dump_path=str(root), statistics=dict(_CONFIG["statistics"], summary_mode=summary))
    path = sample / "configs" / f"{name}.json"
    write_json(path, cfg)
    return path


def _run(ctx: Context, root: Path, config: Path, tag: str, job: str, *, faulty: bool,
         tp_seeded_noise: bool = False, stop_before_sync: bool = False) -> dict[int, dict]:
    fault = DeviceFault(steps=FAULT_STEPS[job], call=FAULT.call, position=FAULT.position, bit=FAULT.bit)
    run = SdcRun(config_path=str(config), log_dir=str(ctx.log_dir), world_size=WORLD, steps=TRAINED_STEPS,
                 model=MODEL, tag=tag, placement=PLACEMENTS[job], faulty_device=FAULTY_DEVICE if faulty else None,
                 fault=fault if faulty else None, tp_seeded_noise=tp_seeded_noise,
                 stop_before_sync=stop_before_sync)
    out = launch(run)
    found = D.step_dirs(root)
    _check([s for s, _ in found] == DUMP_STEPS, f"{root}: steps {[s for s, _ in found]}")
    for _, sdir in found:
        names = [p.name for p in D.rank_dirs(sdir)]
        _check(names == [f"rank{r}" for r in range(WORLD)], f"{sdir}: {names}")
    return out


def _reference(ctx: Context) -> dict[tuple[int, int], dict]:
    """The clean job (job1 placement, no fault) in the log folder: which tensors are replicated."""
    root = ctx.log_dir / "sdc_clean_reference"
    if root not in _REFERENCE:
        cfg = ctx.log_dir / "sdc_clean_reference_config.json"
        write_json(cfg, dict(_CONFIG, dump_path=str(root)))
        _run(ctx, root, cfg, "sdc_reference", "job1", faulty=False)
        _REFERENCE[root] = _load_all(root)
    return _REFERENCE[root]


# ------------------------------------------------------------------------------------ reading
def _key(leaf: dict, md5: bool = True) -> tuple:
    """Everything a leaf says about its value (NaN-safe): equal keys = the same tensor or argument.

    ``md5=False`` leaves the CRC out (to compare an md5-mode dump with a statistics-mode one).
    """
    out = []
    for k in ("type", "dtype", "shape", *D.STAT_KEYS, "value", *(("md5",) if md5 else ()), "group_ranks"):
        v = leaf.get(k)
        out.append("nan" if isinstance(v, float) and math.isnan(v) else (tuple(v) if isinstance(v, list) else v))
    return tuple(out)


def _is_input(path: str) -> bool:
    return path.split(".", 1)[0] in ("input_args", "input_kwargs", "input", "parameters")


def _inputs_identical(a: dict, b: dict, md5: bool = True) -> bool:
    la, lb = D.node_leaves(a), D.node_leaves(b)
    ins = [p for p in la if _is_input(p)]
    return sorted(ins) == sorted(p for p in lb if _is_input(p)) and all(
        _key(la[p], md5) == _key(lb[p], md5) for p in ins)


def _tensor_leaves(data: dict) -> list[tuple[str, str]]:
    """``(node, leaf path)`` of every tensor leaf, in dump (execution) order."""
    return [(n, p) for n, rec in data.items() for p, leaf in D.node_leaves(rec).items() if "shape" in leaf]


def _replicated(ref: dict[tuple[int, int], dict], groups: list[list[int]]) -> list[tuple[str, str]]:
    """Tensor leaves bit-identical (every statistic) within every group at every dumped step of the clean run."""
    order = _tensor_leaves(ref[(DUMP_STEPS[0], 0)])
    keep = []
    for node, path in order:
        same = True
        for step in DUMP_STEPS:
            for g in groups:
                keys = {_key(D.node_leaves(ref[(step, r)][node])[path]) for r in g}
                same = same and len(keys) == 1
        if same:
            keep.append((node, path))
    return keep


def _departures(data: dict, step: int, group: list[int], replicated: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """Replicated tensor leaves whose copies differ within ``group`` at ``step``, in execution order."""
    out = []
    for node, path in replicated:
        if len({_key(D.node_leaves(data[(step, r)][node])[path]) for r in group}) > 1:
            out.append((node, path))
    return out


def _stats(leaf: dict) -> dict[str, Any]:
    return {k: leaf[k] for k in ("dtype", "shape", *D.STAT_KEYS, "md5") if k in leaf}


def _module(root: Path, step: int, rank: int, node: str) -> str | None:
    return D.parent_of(D.load_json(root / f"step{step}" / f"rank{rank}" / "construct.json"), node)


def _device(job: str, rank: int) -> dict[str, str]:
    host, dev = PLACEMENTS[job][rank]
    return {"host": host, "device": dev}


def _group_name(group: list[int]) -> str:
    return "_".join(str(r) for r in group)


# ---------------------------------------------------------------------------------- rank tables
def rank_tables(sample: Path, job: str, place: dict[int, tuple[str, str]]) -> dict[str, str]:
    """Write ``rank_tables/<job>.json`` (Ascend HCCL rank_table_file v1.0) and ``<job>.csv`` (``rank,host,device``).

    ``place`` maps each rank to its ``(host, device)``; returns both paths relative to ``sample``.
    """
    hosts = list(dict.fromkeys(place[r][0] for r in sorted(place)))  # server order: first rank first
    servers = []
    for host in hosts:
        devices = sorted(((dev, r) for r, (h, dev) in place.items() if h == host), key=lambda x: int(x[0]))
        servers.append({"server_id": host,
                        "device": [{"device_id": dev, "device_ip": f"192.168.{100 + int(dev)}.{10 + int(host[-1])}",
                                    "rank_id": str(r)} for dev, r in devices],
                        "host_nic_ip": "reserve"})
    table = {"version": "1.0", "server_count": str(len(servers)), "server_list": servers, "status": "completed"}
    jpath = sample / "rank_tables" / f"{job}.json"
    write_json(jpath, table)
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(["rank", "host", "device"])
    for r in sorted(place):
        writer.writerow([r, *place[r]])
    cpath = sample / "rank_tables" / f"{job}.csv"
    cpath.write_text(buf.getvalue(), encoding="utf-8")
    return {"json": str(jpath.relative_to(sample)), "csv": str(cpath.relative_to(sample))}


# ------------------------------------------------------------------------------------ analysis
def _analyse(root: Path, sample: Path, job: str, ref: dict, tp_rep: list, dp_rep: list) -> dict[str, Any]:
    """Every replica departure of one job: per step and group, the first one and its consequences."""
    data = _load_all(root)
    per_step: dict[str, Any] = {}
    events = []
    for step in DUMP_STEPS:
        names = {r: list(data[(step, r)]) for r in range(WORLD)}
        _check(all(v == names[0] for v in names.values()), f"{job} step {step}: node lists differ across ranks")
        slot: dict[str, Any] = {}
        for kind, groups, rep in (("tp", tp_groups(), tp_rep), ("dp", dp_groups(), dp_rep)):
            for g in groups:
                dep = _departures(data, step, g, rep)
                entry: dict[str, Any] = {"replicated_tensors": len(rep), "departing": len(dep)}
                if dep:
                    node, path = dep[0]
                    recs = [data[(step, r)][node] for r in g]
                    entry["first"] = {"node": node, "tensor": path,
                                      "inputs_identical": all(_inputs_identical(recs[0], x) for x in recs[1:])}
                    later = dep[1:]
                    entry["consequences"] = {"tensors": len(later), "nodes": len(dict.fromkeys(n for n, _ in later)),
                                             "first": f"{later[0][0]} {later[0][1]}" if later else None,
                                             "last": f"{later[-1][0]} {later[-1][1]}" if later else None}
                    events.append({"step": step, "group": g, "kind": kind, "node": node, "tensor": path,
                                   "inputs_identical": entry["first"]["inputs_identical"], "later": later})
                slot[f"{kind}_group_{_group_name(g)}"] = entry
        per_step[f"step{step}"] = slot
    return {"data": data, "per_step": per_step, "events": events}


def _baseline_sides(data: dict, ref: dict, step: int, group: list[int], node: str, path: str) -> dict[str, Any]:
    """Which replicas agree with the clean run (output and inputs) at a departure."""
    agrees, differs = [], []
    inputs_match = []
    for r in group:
        mine, clean = data[(step, r)][node], ref[(step, r)][node]
        same = _key(D.node_leaves(mine)[path], md5=False) == _key(D.node_leaves(clean)[path], md5=False)
        (agrees if same else differs).append(r)
        inputs_match.append(_inputs_identical(mine, clean, md5=False))
    return {"agree_with_baseline": agrees, "differ_from_baseline": differs,
            "inputs_match_baseline": all(inputs_match),
            "decides": all(inputs_match) and len(differs) == 1}


def _faulty_rank(job: str, group: list[int]) -> int:
    """The rank the faulty device serves in ``job`` (it must be in ``group``)."""
    rank = next(r for r, d in PLACEMENTS[job].items() if d == FAULTY_DEVICE)
    _check(rank in group, f"{job}: a departure in {group}, away from the faulty device (rank {rank})")
    return rank


def _vs_baseline(data: dict, ref: dict, step: int) -> dict[str, Any]:
    """Per rank at ``step``: the first tensor (execution order) that differs from the clean run, and how many do."""
    out = {}
    for r in range(WORLD):
        mine, clean = data[(step, r)], ref[(step, r)]
        diff = [f"{n} {p}" for n, p in _tensor_leaves(mine)
                if _key(D.node_leaves(mine[n])[p], md5=False) != _key(D.node_leaves(clean[n])[p], md5=False)]
        out[f"rank{r}"] = {"first_differing": diff[0] if diff else None, "differing_tensors": len(diff),
                           "tensors": len(_tensor_leaves(data[(step, r)]))}
    return out


def _fault_how(job: str, flips: list[dict]) -> str:
    f = flips[0]
    return (f"the device {FAULTY_DEVICE[0]}:{FAULTY_DEVICE[1]} computes torch.rsqrt wrongly at steps "
            f"{list(FAULT_STEPS[job])}: call {FAULT.call} of the step (blocks.0.mlp_norm) gets bit {f['bit']} of "
            f"output element {f['position']} flipped (e.g. {f['correct']:.7g} -> {f['computed']:.7g}); torch.rsqrt "
            "is replaced before msprobe wraps torch, so the dump records the wrong result as Torch.rsqrt's own "
            "output while its input is the correct one")


def _device_events(sample: Path, jobs: dict[str, dict], ref: dict, cause: str,
                   origin_rank: Callable[[str, list[int]], int]) -> tuple[list[dict], list[dict]]:
    """Ground-truth faults (one per departure event) and the per-device summary of the jobs.

    ``origin_rank(job, group)`` is the rank of the group that was made to depart (what was injected);
    the clean run must confirm it wherever its inputs still match that run.
    """
    faults = []
    by_device: dict[tuple[str, str], dict[str, Any]] = {}
    for host, dev in sorted({d for p in PLACEMENTS.values() for d in p.values()}):
        by_device[(host, dev)] = {"host": host, "device": dev,
                                  "ranks": {j: r for j in jobs for r, d in PLACEMENTS[j].items() if d == (host, dev)},
                                  "departures": [], "origin_of": [], "wrong_side": []}
    for job, info in jobs.items():
        root = sample / job if (sample / job).is_dir() else sample
        for ev in info["events"]:
            step, group, node, path = ev["step"], ev["group"], ev["node"], ev["tensor"]
            sides = _baseline_sides(info["data"], ref, step, group, node, path)
            wrong = sides["differ_from_baseline"]
            leaves = {f"rank{r}": _stats(D.node_leaves(info["data"][(step, r)][node])[path]) for r in group}
            for r in group:
                by_device[PLACEMENTS[job][r]]["departures"].append(
                    {"run": job, "step": step, "rank": r, "node": node, "inputs_identical": ev["inputs_identical"]})
            for r in wrong:
                by_device[PLACEMENTS[job][r]]["wrong_side"].append({"run": job, "step": step, "rank": r})
            rank = origin_rank(job, group)
            _check(not sides["decides"] or wrong == [rank], f"{job} step {step}: the clean run blames {wrong}")
            by_device[PLACEMENTS[job][rank]]["origin_of"].append({"run": job, "step": step, "rank": rank})
            rel = str((root / f"step{step}" / f"rank{rank}" / "dump.json").relative_to(sample))
            faults.append({
                "kind": "replica_departure", "role": "origin", "run": job, "step": step,
                "rank": rank, "ranks": group, "group": ev["kind"], "node": node, "tensor": path,
                "module": _module(root, step, group[0], node), "inputs_identical": ev["inputs_identical"],
                "random_op": node == NOISE_NODE, "cause": cause,
                "device": _device(job, rank),
                "candidates": [{"rank": r, **_device(job, r)} for r in group],
                "other_dump_json": [str((root / f"step{step}" / f"rank{r}" / "dump.json").relative_to(sample))
                                    for r in group if r != rank],
                "baseline": sides, "vs_baseline": _vs_baseline(info["data"], ref, step), "stats": leaves,
                "dump_json": rel,
                "consequences": {"tensors": len(ev["later"]), "nodes": len(dict.fromkeys(n for n, _ in ev["later"]))},
            })
    devices = sorted(by_device.values(), key=lambda d: (-len(d["origin_of"]), -len(d["departures"]),
                                                        d["host"], d["device"]))
    return faults, devices


def _common(sample: Path, jobs: list[str], tp_rep: list, dp_rep: list) -> dict[str, Any]:
    """Ground-truth fields every faulty-device sample states (one dump root per job, or the sample itself)."""
    own = all((sample / j).is_dir() for j in jobs)
    roots = {"dump_roots": {j: j for j in jobs}, "dump_files": {j: _layout(sample / j, sample) for j in jobs}} if own \
        else {"dump_files": _layout(sample, sample)}
    return {**roots,
        "task": "statistics", "level": "mix", "data_mode": ["forward"], "world_size": WORLD,
        "distributed_initialised": True, "steps": DUMP_STEPS, "trained_steps": TRAINED_STEPS,
        "layout": {"tp": TP, "dp": DP, "pp": 1, "order": "tp-dp (Megatron: TP fastest)", "tp_groups": tp_groups(),
                   "dp_groups": dp_groups(), "sequence_parallel": False, "model_parallel_rng_region": None},
        "placement": {j: {str(r): _device(j, r) for r in range(WORLD)} for j in jobs},
        "rank_tables": {j: rank_tables(sample, j, PLACEMENTS[j]) for j in jobs},
        "replicated": {
            "tp_tensors": len(tp_rep), "dp_tensors": len(dp_rep),
            "rule": "a tensor leaf is TP-replicated when all its statistics (dtype, shape, Max, Min, Mean, Norm) are "
            "equal on the TP ranks of every TP group at every dumped step of the clean run (sdc_clean), "
            "DP-replicated likewise across the DP ranks of every DP group; with statistics only equality of "
            "every statistic stands for bit-identity (md5 mode: the CRC-32 too)",
            "tp_examples": [f"{n} {p}" for n, p in tp_rep[:4]], "dp_examples": [f"{n} {p}" for n, p in dp_rep[:4]],
        },
        "mechanics": (
            f"world {WORLD} = tp{TP} x dp{DP}; MLP-only tiny GPT with column-parallel up_proj and row-parallel "
            "down_proj (Megatron f/g autograd functions on the TP group); embedding noise "
            f"torch.normal(0, {NOISE_STD}, size) seeded {NOISE_SEED} + dp_rank; the gradients live in one buffer: "
            "the TP-replicated parameters' part is averaged over the TP group, then the buffer over the DP group "
            "(one all_reduce each, as Megatron's grad buckets), so the replicas are bit-identical again after every "
            "optimizer step; msprobe dumps forward records only (data_mode forward) of steps 1-3 of 4"),
    }


# ------------------------------------------------------------------------------------ samples
def gen_sdc_clean(ctx: Context, sample: Path) -> dict:
    """The clean control: same training, job1 placement, no fault; nothing departs."""
    ref = _reference(ctx)
    cfg = _config(sample, "config", sample)
    out = _run(ctx, sample, cfg, "sdc_clean", "job1", faulty=False)
    tp_rep, dp_rep = _replicated(ref, tp_groups()), _replicated(ref, dp_groups())
    info = _analyse(sample, sample, "job1", ref, tp_rep, dp_rep)
    _check(not info["events"], f"clean run departs: {info['events'][:2]}")
    data = info["data"]
    _check(all(_key(D.node_leaves(data[k][n])[p]) == _key(D.node_leaves(ref[k][n])[p])
               for k in data for n, p in _tensor_leaves(data[k])), "clean run differs from the reference rerun")
    return _header(
        ctx, "sdc_clean",
        "the faulty-device samples' training with no fault (tp2 x dp2 on 4 ranks, job1's rank -> device "
        "placement): the negative control; every TP- and DP-replicated tensor is bit-identical across its "
        "replicas at every step",
        MODEL, **_common(sample, ["job1"], tp_rep, dp_rep), faults=[],
        checks={"per_step": info["per_step"], "departures": 0,
                "note": "departing = replicated tensors whose copies differ within the group; 0 everywhere"},
        losses={str(r): v["losses"] for r, v in out.items()},
    )


def gen_sdc(ctx: Context, sample: Path) -> dict:
    """Job1 and the rescheduled job2; the faulty device departs at steps 1 and 3 (job1) and 2 (job2)."""
    ref = _reference(ctx)
    tp_rep, dp_rep = _replicated(ref, tp_groups()), _replicated(ref, dp_groups())
    jobs, losses, flips = {}, {}, {}
    for job in ("job1", "job2"):
        root = sample / job
        out = _run(ctx, root, _config(sample, f"config_{job}", root), f"sdc_{job}", job, faulty=True)
        losses[job] = {str(r): v["losses"] for r, v in out.items()}
        faulty_rank = next(r for r, d in PLACEMENTS[job].items() if d == FAULTY_DEVICE)
        flips[job] = out[faulty_rank]["flipped"]
        _check([f["step"] for f in flips[job]] == list(FAULT_STEPS[job]), f"{job} flips {flips[job]}")
        _check(all(not v["flipped"] for r, v in out.items() if r != faulty_rank), f"{job}: other ranks flipped")
        info = _analyse(root, sample, job, ref, tp_rep, dp_rep)
        group = next(g for g in tp_groups() if faulty_rank in g)
        want = [(s, group, FAULT_NODE, "output.0", True) for s in FAULT_STEPS[job]]
        got = [(e["step"], e["group"], e["node"], e["tensor"], e["inputs_identical"]) for e in info["events"]]
        _check(got == want, f"{job}: departures {got}, injected {want}")
        jobs[job] = info
    faults, devices = _device_events(sample, jobs, ref, "compute_fault", _faulty_rank)
    for f in faults:
        f["how"] = _fault_how(f["run"], flips[f["run"]])
        f["cause_text"] = ("inputs identical across the TP replicas, output differs: a compute fault on that "
                           "device, or a non-deterministic kernel")
        f["bit_flip"] = next(x for x in flips[f["run"]] if x["step"] == f["step"])
    first = faults[0]
    _check(first["baseline"]["decides"] and first["rank"] == 1 and first["device"] == _device("job1", 1),
           f"baseline side of job1's first departure {first['baseline']}")
    _check(faults[2]["baseline"]["decides"] and faults[2]["rank"] == 2, f"job2 {faults[2]['baseline']}")
    _check(not faults[1]["baseline"]["inputs_match_baseline"] and not faults[1]["baseline"]["decides"],
           "job1 step 3: the clean run still decides")
    cand = [{(c["host"], c["device"]) for c in f["candidates"]} for f in faults]
    _check(cand[0] & cand[2] == {FAULTY_DEVICE}, f"candidate devices of the two jobs {cand}")
    suspect = devices[0]
    _check((suspect["host"], suspect["device"]) == FAULTY_DEVICE, f"device order {devices[:2]}")
    return _header(
        ctx, "sdc",
        "a faulty device in a tp2 x dp2 job (4 ranks on 2 hosts x 2 devices): device 10.0.0.1:1 flips one bit of "
        "one torch.rsqrt output element (blocks.0.mlp_norm) at steps 1 and 3 of job1, where it serves rank 1, and "
        "at step 2 of job2, the same training rescheduled so that it serves rank 2; the op's inputs are "
        "bit-identical across the TP replicas, its output is not, and everything after it in that step inherits; "
        "rank tables of both jobs (HCCL JSON and CSV) in rank_tables/",
        MODEL, **_common(sample, ["job1", "job2"], tp_rep, dp_rep),
        faulty_device={"host": FAULTY_DEVICE[0], "device": FAULTY_DEVICE[1]},
        faults=faults, devices=devices,
        devices_note="per device: the rank it serves in each job, every departure in which it was one of the "
        "departing replicas (a candidate), and those where it was the side that differs from the clean run "
        "(sdc_clean, the same training) while the inputs still matched that run (wrong_side), and those it "
        "caused (origin_of: what was injected). Job1 step 3 has no wrong side (after step 1 the trajectory "
        "already differs from the clean run, so the clean run cannot decide): both TP ranks stay candidates. The "
        "candidate sets of job1 and job2 intersect in the faulty device only",
        baseline="sdc_clean (the same training, no fault; bit-identical to the reference rerun used here)",
        checks={"per_run": {j: info["per_step"] for j, info in jobs.items()},
                "note": "per run, step and replica group (tp_group_0_1 = TP ranks 0 and 1, dp_group_0_2 = DP ranks 0 "
                "and 2): how many replicated tensors, how many depart, the first departure (execution order) with "
                "whether its inputs (tensors and scalar arguments) are identical across the group, and the later "
                "departures of that step (its consequences). Steps without a fault depart nowhere: the gradient "
                "sync re-synchronises the replicas"},
        losses=losses,
    )


def _crc_unreliable(data: dict) -> list[tuple[str, str]]:
    """Tensor leaves an in-place op changes right after msprobe records them (CRC-32 racy on CPU).

    The inputs of the (in-place) collectives, and earlier outputs that are the same tensor (equal
    dtype, shape and statistics), such as the row-parallel partial sum the all_reduce then sums in place.
    """
    names = list(data)
    out: dict[tuple[str, str], None] = {}
    for i, node in enumerate(names):
        if not node.startswith("Distributed."):
            continue
        for path, leaf in D.node_leaves(data[node]).items():
            if not path.startswith("input_args") or "shape" not in leaf:
                continue
            out[(node, path)] = None
            for prev in names[:i]:
                for q, other in D.node_leaves(data[prev]).items():
                    if not _is_input(q) and "shape" in other and _key(other, md5=False) == _key(leaf, md5=False):
                        out[(prev, q)] = None
    return list(out)


def gen_sdc_md5(ctx: Context, sample: Path) -> dict:
    """Job1 dumped in md5 mode (CRC-32 per tensor): the same departures, bitwise."""
    ref = _reference(ctx)
    tp_rep, dp_rep = _replicated(ref, tp_groups()), _replicated(ref, dp_groups())
    out = _run(ctx, sample, _config(sample, "config", sample, summary="md5"), "sdc_md5", "job1", faulty=True,
               stop_before_sync=True)
    first = _load_all(sample)[(DUMP_STEPS[0], 0)]
    tp_rep = [k for k in tp_rep if k[0] in first]  # the dump ends before the gradient sync
    dp_rep = [k for k in dp_rep if k[0] in first]
    info = _analyse(sample, sample, "job1", ref, tp_rep, dp_rep)
    got = [(e["step"], e["group"], e["node"], e["tensor"], e["inputs_identical"]) for e in info["events"]]
    _check(got == [(s, [0, 1], FAULT_NODE, "output.0", True) for s in FAULT_STEPS["job1"]], f"md5 departures {got}")
    data = info["data"]
    leaves = [D.node_leaves(d[n])[p] for d in data.values() for n, p in _tensor_leaves(d)]
    _check(all(isinstance(lf.get("md5"), str) and len(lf["md5"]) == 8 for lf in leaves), "tensor leaves without md5")
    crc_equal = 0
    for step in DUMP_STEPS:
        for g in tp_groups():
            crc_equal += sum(len({D.node_leaves(data[(step, r)][n])[p]["md5"] for r in g}) == 1 for n, p in tp_rep)
    stats_only = 0  # departures the statistics alone would also show
    for ev in info["events"]:
        la, lb = (D.node_leaves(data[(ev["step"], r)][ev["node"]])[ev["tensor"]] for r in ev["group"])
        stats_only += any(la[k] != lb[k] for k in D.STAT_KEYS)
    faults, _ = _device_events(sample, {"job1": info}, ref, "compute_fault", _faulty_rank)
    _check(faults[0]["baseline"]["decides"] and not faults[1]["baseline"]["decides"], "md5: clean-run sides")
    racy = sorted({k for d in data.values() for k in _crc_unreliable(d)})
    _check(racy and not set(racy) & (set(tp_rep) | set(dp_rep)), f"racy CRCs among replicated tensors: {racy}")
    flips = out[1]["flipped"]
    for f in faults:
        f["how"] = _fault_how("job1", flips)
        f["bit_flip"] = next(x for x in flips if x["step"] == f["step"])
        f["md5"] = {f"rank{r}": {"input_args.0": D.node_leaves(data[(f['step'], r)][f["node"]])["input_args.0"]["md5"],
                                 f["tensor"]: D.node_leaves(data[(f['step'], r)][f["node"]])[f["tensor"]]["md5"]}
                    for r in f["ranks"]}
    return _header(
        ctx, "sdc_md5",
        "the sdc sample's job1 (device 10.0.0.1:1, serving rank 1, flips one bit of a torch.rsqrt output at steps 1 "
        "and 3) dumped with summary_mode md5: every tensor leaf also carries its CRC-32, so replica equality is "
        "bitwise",
        MODEL, **_common(sample, ["job1"], tp_rep, dp_rep), summary_mode="md5",
        faulty_device={"host": FAULTY_DEVICE[0], "device": FAULTY_DEVICE[1]},
        faults=faults,
        checks={"per_step": info["per_step"], "tp_replicated_leaves_with_equal_crc": crc_equal,
                "tp_replicated_leaves_checked": len(tp_rep) * len(DUMP_STEPS) * len(tp_groups()),
                "departures_also_visible_in_statistics": stats_only,
                "md5_note": "md5 = CRC-32 of the tensor's bytes (8 hex digits); the statistics are kept as well",
                "crc_unreliable": [f"{n} {p}" for n, p in racy],
                "crc_unreliable_note": "msprobe computes the CRC-32 in a thread pool on the live CPU tensor, so a "
                "tensor changed in place right after it is recorded may get the CRC of a later value: the inputs "
                "of the in-place collectives and the row-parallel partial sum the forward all_reduce sums in place "
                "(their CRCs changed between identical reruns); none of them is a replicated tensor. The dumped "
                "region ends after backward, so the gradient sync and the fused optimizer (whose CRCs differed "
                "across replicas with equal statistics) are not in it"},
        losses={str(r): v["losses"] for r, v in out.items()},
    )


def gen_sdc_rank(ctx: Context, sample: Path) -> dict:
    """No faulty device; TP rank 1's noise seed carries the TP offset: departures follow the ranks across jobs."""
    ref = _reference(ctx)
    tp_rep, dp_rep = _replicated(ref, tp_groups()), _replicated(ref, dp_groups())
    jobs, losses = {}, {}
    for job in ("job1", "job2"):
        root = sample / job
        out = _run(ctx, root, _config(sample, f"config_{job}", root), f"sdc_rank_{job}", job, faulty=False,
                   tp_seeded_noise=True)
        losses[job] = {str(r): v["losses"] for r, v in out.items()}
        info = _analyse(root, sample, job, ref, tp_rep, dp_rep)
        want = [(s, g, NOISE_NODE, "output.0", True) for s in DUMP_STEPS for g in tp_groups()]
        got = [(e["step"], e["group"], e["node"], e["tensor"], e["inputs_identical"]) for e in info["events"]]
        _check(got == want, f"{job}: departures {got}")
        jobs[job] = info
    faults, devices = _device_events(sample, jobs, ref, "unsynchronised_seed",
                                     lambda job, group: next(r for r in group if tp_rank(r) == 1))
    for f in faults:
        _check(f["baseline"]["decides"] and tp_rank(f["rank"]) == 1, f"baseline side {f['baseline']}")
        f["how"] = (f"torch.manual_seed({NOISE_SEED} + dp_rank + {TP_SEED_OFFSET} * tp_rank) before training: "
                    "the default generator that draws the embedding noise (torch.normal, outside any model-parallel "
                    "RNG region) gets Megatron's tensor-parallel seed offset, so TP rank 1 draws other noise than "
                    "its replica at every step")
        f["cause_text"] = ("a random op whose output differs across the TP replicas while its inputs (mean, std, "
                           "size) are identical, outside any model-parallel RNG region: an unsynchronised seed")
    wrong = {(f["run"], f["rank"]) for f in faults}
    _check(wrong == {(j, r) for j in jobs for r in (1, 3)}, f"wrong sides {wrong}")
    return _header(
        ctx, "sdc_rank",
        "the sdc sample's two placements (job1, job2) with no faulty device but a seeding bug: the embedding noise "
        "(torch.normal, outside any model-parallel RNG region) is seeded with the tensor-parallel offset, so TP "
        "rank 1 (ranks 1 and 3) departs from its replica at every step in both jobs, on different devices: the "
        "departure follows the rank, not the device",
        MODEL, **_common(sample, ["job1", "job2"], tp_rep, dp_rep),
        faulty_device=None, follows="rank",
        faults=faults, devices=devices,
        checks={"per_run": {j: info["per_step"] for j, info in jobs.items()},
                "wrong_side_ranks": sorted({f["rank"] for f in faults}),
                "wrong_side_devices_by_run": {j: sorted({f"{f['device']['host']}:{f['device']['device']}"
                                                         for f in faults if f["run"] == j}) for j in jobs}},
        losses=losses,
    )


GENERATORS: dict[str, Callable[[Context, Path], dict[str, Any]]] = {
    "sdc_clean": gen_sdc_clean,
    "sdc": gen_sdc,
    "sdc_md5": gen_sdc_md5,
    "sdc_rank": gen_sdc_rank,
}
