"""The faulty-device samples (sdc, sdc_clean, sdc_md5, sdc_rank; issue 28): ground truth re-checked on the dumps.

Parsed with Python's json and csv (no precnb reader), like ``test_samples_generator``. Which
tensors are replicated is re-derived here from the clean control (bit-identical statistics on
the TP ranks of each TP group, or the DP ranks of each DP group, at every dumped step), then
every recorded departure is checked on the faulty jobs' dumps: the inputs of the departing node
identical across its replicas, its output not, nothing replicated departing before it, and the
rank and device of the origin as the rank tables (HCCL JSON and CSV) say.
"""

from __future__ import annotations

import csv
import math

import pytest

from tests.test_samples_generator import DATA, gt, leaves, load

WORLD = 4
TP_GROUPS = [[0, 1], [2, 3]]
DP_GROUPS = [[0, 2], [1, 3]]
STEPS = (1, 2, 3)


def _data(root, step: int, rank: int) -> dict:
    return load(root / f"step{step}" / f"rank{rank}" / "dump.json")["data"]


def _key(leaf: dict, md5: bool = True) -> tuple:
    keys = ("type", "dtype", "shape", "Max", "Min", "Mean", "Norm", "value", "group_ranks") + (("md5",) if md5 else ())
    return tuple("nan" if isinstance(leaf.get(k), float) and math.isnan(leaf[k])
                 else (tuple(leaf[k]) if isinstance(leaf.get(k), list) else leaf.get(k)) for k in keys)


def _leaf(data: dict, node: str, path: str) -> dict:
    return dict(leaves(data[node]))[path]


def _is_input(path: str) -> bool:
    return path.split(".", 1)[0] in ("input_args", "input_kwargs", "input", "parameters")


def _tensors(data: dict) -> list[tuple[str, str]]:
    return [(n, p) for n, rec in data.items() for p, lf in leaves(rec) if "shape" in lf]


def _replicated(groups: list[list[int]]) -> list[tuple[str, str]]:
    root = DATA / "sdc_clean"
    dumps = {(s, r): _data(root, s, r) for s in STEPS for r in range(WORLD)}
    return [(n, p) for n, p in _tensors(dumps[(1, 0)])
            if all(len({_key(_leaf(dumps[(s, r)], n, p)) for r in g}) == 1 for s in STEPS for g in groups)]


@pytest.fixture(scope="module")
def replicated() -> dict[str, list[tuple[str, str]]]:
    gt("sdc_clean")
    return {"tp": _replicated(TP_GROUPS), "dp": _replicated(DP_GROUPS)}


def _departing(root, step: int, group: list[int], rep: list[tuple[str, str]], md5: bool = True) -> list:
    dumps = {r: _data(root, step, r) for r in group}
    return [(n, p) for n, p in rep if n in dumps[group[0]]
            and len({_key(_leaf(dumps[r], n, p), md5) for r in group}) > 1]


def _rank_table(sample: str, job: str) -> dict[int, tuple[str, str]]:
    """rank -> (host, device) from the HCCL JSON, checked equal to the CSV."""
    table = load(DATA / sample / "rank_tables" / f"{job}.json")
    assert table["version"] == "1.0" and table["status"] == "completed"
    assert int(table["server_count"]) == len(table["server_list"])
    from_json = {int(d["rank_id"]): (s["server_id"], d["device_id"]) for s in table["server_list"]
                 for d in s["device"]}
    assert all(d["device_ip"].count(".") == 3 for s in table["server_list"] for d in s["device"])
    with open(DATA / sample / "rank_tables" / f"{job}.csv", newline="", encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    assert list(rows[0]) == ["rank", "host", "device"]
    assert {int(r["rank"]): (r["host"], r["device"]) for r in rows} == from_json
    return from_json


# ---------------------------------------------------------------------------------------- clean
def test_replicated_sets_are_what_tensor_parallelism_makes(replicated):
    g = gt("sdc_clean")
    tp, dp = replicated["tp"], replicated["dp"]
    assert len(tp) == g["replicated"]["tp_tensors"] and len(dp) == g["replicated"]["dp_tensors"]
    # the loss, the RMSNorm rsqrt and the replicated parameters agree on TP ranks; the column shard does not
    assert ("Functional.cross_entropy.0.forward", "output.0") in tp
    assert ("Torch.rsqrt.0.forward", "output.0") in tp
    assert ("Module.lm_head.Linear.forward.0", "parameters.weight") in tp
    assert ("Module.blocks.0.mlp.up_proj.ColumnParallelLinear.forward.0", "parameters.weight") not in tp
    # across DP ranks the shard is replicated, the activations (other batches) are not
    assert ("Module.blocks.0.mlp.up_proj.ColumnParallelLinear.forward.0", "parameters.weight") in dp
    assert ("Functional.cross_entropy.0.forward", "output.0") not in dp


def test_sdc_clean_departs_nowhere(replicated):
    g = gt("sdc_clean")
    assert g["faults"] == [] and g["checks"]["departures"] == 0
    root = DATA / "sdc_clean"
    for step in STEPS:
        for kind, groups in (("tp", TP_GROUPS), ("dp", DP_GROUPS)):
            for grp in groups:
                assert not _departing(root, step, grp, replicated[kind])
                slot = g["checks"]["per_step"][f"step{step}"][f"{kind}_group_{grp[0]}_{grp[1]}"]
                assert slot == {"replicated_tensors": len(replicated[kind]), "departing": 0}
    # the TP-replicated parameters are equal on all four ranks (TP- and DP-synced)
    for step in STEPS:
        ws = {_key(_leaf(_data(root, step, r), "Module.lm_head.Linear.forward.0", "parameters.weight"))
              for r in range(WORLD)}
        assert len(ws) == 1


# ------------------------------------------------------------------------------------------ sdc
def test_sdc_rank_tables_place_the_faulty_device_on_another_rank():
    g = gt("sdc")
    dev = (g["faulty_device"]["host"], g["faulty_device"]["device"])
    tables = {job: _rank_table("sdc", job) for job in ("job1", "job2")}
    assert tables["job1"] != tables["job2"]
    assert [r for r, d in tables["job1"].items() if d == dev] == [1]
    assert [r for r, d in tables["job2"].items() if d == dev] == [2]
    for job, t in tables.items():
        assert {str(r): {"host": h, "device": d} for r, (h, d) in t.items()} == g["placement"][job]
        assert len(set(t.values())) == WORLD


def test_sdc_departures_have_identical_inputs_and_follow_the_device(replicated):
    g = gt("sdc")
    events = [(f["run"], f["step"], f["rank"], f["node"], f["tensor"]) for f in g["faults"]]
    assert events == [("job1", 1, 1, "Torch.rsqrt.0.forward", "output.0"),
                      ("job1", 3, 1, "Torch.rsqrt.0.forward", "output.0"),
                      ("job2", 2, 2, "Torch.rsqrt.0.forward", "output.0")]
    clean = DATA / "sdc_clean"
    candidates = []
    for f in g["faults"]:
        root = DATA / "sdc" / f["run"]
        group = next(x for x in TP_GROUPS if f["rank"] in x)
        assert f["ranks"] == group and f["inputs_identical"] is True
        dumps = {r: _data(root, f["step"], r) for r in group}
        ins = [{p: _key(lf) for p, lf in leaves(dumps[r][f["node"]]) if _is_input(p)} for r in group]
        assert ins[0] == ins[1] and ins[0]  # tensors and scalar arguments alike
        assert _key(_leaf(dumps[group[0]], f["node"], f["tensor"])) != _key(_leaf(dumps[group[1]], f["node"],
                                                                                 f["tensor"]))
        # the first replicated tensor to depart, in execution order
        dep = _departing(root, f["step"], group, replicated["tp"])
        assert dep[0] == (f["node"], f["tensor"]) and len(dep) - 1 == f["consequences"]["tensors"]
        construct = load(root / f"step{f['step']}" / f"rank{f['rank']}" / "construct.json")
        assert construct[f["node"]] == f["module"] == "Module.blocks.0.mlp_norm.RMSNorm.forward.0"
        # the rank table names the origin's device
        host, dev = _rank_table("sdc", f["run"])[f["rank"]]
        assert f["device"] == {"host": host, "device": dev} == g["faulty_device"]
        candidates.append({(c["host"], c["device"]) for c in f["candidates"]})
        # the clean run decides where the inputs still match it
        if f["baseline"]["decides"]:
            other = next(r for r in group if r != f["rank"])
            same = {r: _key(_leaf(dumps[r], f["node"], f["tensor"]))
                    == _key(_leaf(_data(clean, f["step"], r), f["node"], f["tensor"])) for r in group}
            assert same == {f["rank"]: False, other: True}
    assert [f["baseline"]["decides"] for f in g["faults"]] == [True, False, True]
    assert candidates[0] & candidates[2] == {(g["faulty_device"]["host"], g["faulty_device"]["device"])}
    # no other step or group departs: the gradient sync re-synchronises the replicas
    faulty = {(f["run"], f["step"], tuple(f["ranks"])) for f in g["faults"]}
    for job in ("job1", "job2"):
        for step in STEPS:
            for kind, groups in (("tp", TP_GROUPS), ("dp", DP_GROUPS)):
                for grp in groups:
                    if (job, step, tuple(grp)) not in faulty or kind == "dp":
                        assert not _departing(DATA / "sdc" / job, step, grp, replicated[kind]), (job, step, grp)


def test_sdc_bit_flip_is_in_the_dumped_output():
    for f in gt("sdc")["faults"]:
        flip = f["bit_flip"]
        assert flip["step"] == f["step"] and abs(flip["correct"] - flip["computed"]) > 0.1
        out = _leaf(_data(DATA / "sdc" / f["run"], f["step"], f["rank"]), f["node"], f["tensor"])
        other = _leaf(_data(DATA / "sdc" / f["run"], f["step"], f["ranks"][1 - f["ranks"].index(f["rank"])]),
                      f["node"], f["tensor"])
        # one element of 16 changed by (computed - correct): the Mean moves by exactly that / 16 (float32)
        assert out["Mean"] - other["Mean"] == pytest.approx((flip["computed"] - flip["correct"]) / 16, rel=1e-4)


def test_sdc_devices_summary_matches_the_tables():
    g = gt("sdc")
    tables = {job: _rank_table("sdc", job) for job in ("job1", "job2")}
    for d in g["devices"]:
        for job, rank in d["ranks"].items():
            assert tables[job][rank] == (d["host"], d["device"])
    top = g["devices"][0]
    assert (top["host"], top["device"]) == (g["faulty_device"]["host"], g["faulty_device"]["device"])
    assert len(top["origin_of"]) == 3 and all(not d["origin_of"] for d in g["devices"][1:])


# ------------------------------------------------------------------------------------------ md5
def test_sdc_md5_equality_is_bitwise(replicated):
    g = gt("sdc_md5")
    assert g["summary_mode"] == "md5" and load(DATA / "sdc_md5" / "configs" / "config.json")["statistics"][
        "summary_mode"] == "md5"
    root = DATA / "sdc_md5"
    for step in STEPS:
        for r in range(WORLD):
            for n, p in _tensors(_data(root, step, r)):
                crc = _leaf(_data(root, step, r), n, p)["md5"]
                assert isinstance(crc, str) and len(crc) == 8 and int(crc, 16) >= 0
    assert [(f["step"], f["rank"], f["node"]) for f in g["faults"]] == [(1, 1, "Torch.rsqrt.0.forward"),
                                                                        (3, 1, "Torch.rsqrt.0.forward")]
    for f in g["faults"]:
        d = {r: _data(root, f["step"], r) for r in (0, 1)}
        crc = {r: {p: _leaf(d[r], f["node"], p)["md5"] for p in ("input_args.0", "output.0")} for r in (0, 1)}
        assert crc[0]["input_args.0"] == crc[1]["input_args.0"] and crc[0]["output.0"] != crc[1]["output.0"]
        assert crc == {r: f["md5"][f"rank{r}"] for r in (0, 1)}
        # by CRC alone (statistics ignored) the same tensor departs first
        rep = [(n, p) for n, p in replicated["tp"] if n in d[0]]
        by_crc = [(n, p) for n, p in rep if _leaf(d[0], n, p)["md5"] != _leaf(d[1], n, p)["md5"]]
        assert by_crc[0] == (f["node"], f["tensor"])
    # apart from the departures every TP-replicated tensor has one CRC across its replicas
    rep = [(n, p) for n, p in replicated["tp"] if n in _data(root, 1, 0)]
    equal = sum(len({_leaf(_data(root, s, r), n, p)["md5"] for r in grp}) == 1
                for s in STEPS for grp in TP_GROUPS for n, p in rep)
    assert equal == g["checks"]["tp_replicated_leaves_with_equal_crc"]
    departing = sum(len(_departing(root, s, grp, rep)) for s in STEPS for grp in TP_GROUPS)
    assert equal + departing == g["checks"]["tp_replicated_leaves_checked"] == len(rep) * 6
    # the CRCs msprobe may take after an in-place change (collective inputs, the partial sum): none replicated
    racy = {tuple(x.split(" ")) for x in g["checks"]["crc_unreliable"]}
    assert ("Distributed.all_reduce.0.forward", "input_args.0") in racy
    assert not racy & (set(replicated["tp"]) | set(replicated["dp"]))
    d = _data(root, 1, 0)
    assert _key(_leaf(d, "Functional.linear.1.forward", "output.0"), md5=False) == _key(
        _leaf(d, "Distributed.all_reduce.0.forward", "input_args.0"), md5=False)  # the same tensor


# ------------------------------------------------------------------------------------- sdc_rank
def test_sdc_rank_departure_follows_the_rank(replicated):
    g = gt("sdc_rank")
    assert g["faulty_device"] is None and g["follows"] == "rank"
    clean = DATA / "sdc_clean"
    devices = {}
    for job in ("job1", "job2"):
        table = _rank_table("sdc_rank", job)
        for step in STEPS:
            for grp in TP_GROUPS:
                dep = _departing(DATA / "sdc_rank" / job, step, grp, replicated["tp"])
                assert dep[0] == ("Torch.normal.0.forward", "output.0")
                d = {r: _data(DATA / "sdc_rank" / job, step, r) for r in grp}
                ins = [{p: _key(lf) for p, lf in leaves(d[r]["Torch.normal.0.forward"]) if _is_input(p)} for r in grp]
                assert ins[0] == ins[1]  # mean, std and size are the same: an unsynchronised seed
                # TP rank 0 draws what the clean run draws, TP rank 1 does not
                ref = {r: _key(_leaf(_data(clean, step, r), "Torch.normal.0.forward", "output.0")) for r in grp}
                got = {r: _key(_leaf(d[r], "Torch.normal.0.forward", "output.0")) for r in grp}
                assert got[grp[0]] == ref[grp[0]] and got[grp[1]] != ref[grp[1]]
                devices.setdefault(grp[1], set()).add(table[grp[1]])
    # ranks 1 and 3 depart in both jobs, each time on another device
    assert {r: len(v) for r, v in devices.items()} == {1: 2, 3: 2}
    faults = g["faults"]
    assert len(faults) == 2 * len(STEPS) * len(TP_GROUPS)
    assert all(f["random_op"] and f["cause"] == "unsynchronised_seed" and f["rank"] in (1, 3) for f in faults)
    assert g["checks"]["wrong_side_ranks"] == [1, 3]


# ----------------------------------------------------------------------------------- sdc_tensor
def test_sdc_tensor_ground_truth_holds_in_the_tensor_files(replicated):
    """One bit of one rsqrt output element differs on rank 1; its inputs are the same bytes on both TP replicas."""
    import numpy as np

    from precnb.io._torchzip import read_torch_zip  # torch-free .pt reader (no unpickling)

    g = gt("sdc_tensor")
    f = g["faults"][0]
    root = DATA / "sdc_tensor"
    assert (f["step"], f["rank"], f["ranks"], f["node"], f["tensor"]) == (1, 1, [0, 1], "Torch.rsqrt.0.forward",
                                                                          "output.0")
    assert _rank_table("sdc_tensor", "job1")[1] == (f["device"]["host"], f["device"]["device"])
    assert g["task"] == "tensor" and g["level"] == "L1" and g["steps"] == [1, 2]
    # statistics: the first TP-replicated tensor that departs at step 1 is rsqrt's output; nothing at step 2
    tp = [k for k in replicated["tp"] if k[0] in _data(root, 1, 0)]
    assert _departing(root, 1, [0, 1], tp)[0] == (f["node"], f["tensor"])
    assert not _departing(root, 1, [2, 3], tp) and not _departing(root, 2, [0, 1], tp)
    assert not _departing(root, 2, [2, 3], tp)

    def pt(rank: int, leaf: str) -> np.ndarray:
        name = f["tensor_files"][f"rank{rank}"][leaf]
        return read_torch_zip(root / "step1" / f"rank{rank}" / "dump_tensor_data" / name)[0]

    assert pt(0, "input_args.0").tobytes() == pt(1, "input_args.0").tobytes()
    a, b = pt(0, "output.0").view(np.int32), pt(1, "output.0").view(np.int32)
    where = np.argwhere(a != b).tolist()
    flip = f["bit_flip"]
    assert where == [flip["position"]] == [f["recomputed"]["outputs_differ_at"]["position"]]
    assert int(a[tuple(flip["position"])] ^ b[tuple(flip["position"])]) == 1 << flip["bit"]
    assert float(pt(1, "output.0")[tuple(flip["position"])]) == flip["computed"]
    assert float(pt(0, "output.0")[tuple(flip["position"])]) == flip["correct"]
    assert f["recomputed"]["equals_dumped_output_of"] == [0] and f["recomputed"]["inputs_bit_identical"]
