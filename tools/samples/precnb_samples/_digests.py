"""README digests of the samples of runs whose names differ and of the TP replica check (no torch).

:func:`precnb_samples._readme.write_readme` calls ``DIGESTS[name](ground_truth)`` for the
samples listed here; each returns Markdown bullet lines.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def _renamed(gt: dict[str, Any]) -> list[str]:
    f = gt["faults"][0]
    b = f["baseline"]
    out = [
        f"- **{f['kind']} ({f['role']})**: step {f['step']}, rank {f['rank']}: target "
        f"`{f['node']}` in `{f['module_path']}` (`{f['dump_json']}`) ↔ baseline `{b['node']}` in "
        f"`{b['module_path']}` (`{b['dump_json']}`); differing leaves "
        f"{sorted(f['differing_leaves'])}, output error {f['output_scale_aware_error']:.2e}",
        f"- culprit module (inputs agree, output differs): target `{f['culprit_module']['target']}`"
        f" ↔ baseline `{f['culprit_module']['baseline']}`",
        f"- {len(gt['module_pairs'])} module pairs, e.g. "
        + ", ".join(f"`{m['baseline']}` ↔ `{m['target']}`" for m in gt["module_pairs"][:4])
        + " … (`module_pairs`); unpaired containers: "
        + ", ".join(f"baseline `{m['module']}`" for m in gt["unpaired_modules"]["baseline"])
        + ", "
        + ", ".join(f"target `{m['module']}`" for m in gt["unpaired_modules"]["target"]),
        f"- {len(gt['node_pairs']['step0_forward'])} forward and "
        f"{len(gt['node_pairs']['step0_backward'])} backward API node pairs at step 0 "
        "(`node_pairs`), all bit-identical; counter shifts: "
        + (", ".join(f"`{c['api']}` {c['target_minus_baseline']:+d}" for c in gt["counter_shifts"]) or "none"),
        "- extra target ops: "
        + ", ".join(
            f"`{e['node']}`" + ("" if e["in_dump_json"] else " (construct.json only)") for e in gt["extra_ops"]
        ),
    ]
    for step, c in gt["checks"]["per_step"].items():
        out.append(
            f"- {step}: first differing paired node (target) `{c['first_differing_target_node']}`"
            f" ({c['differing_paired_nodes']} of {c['paired_nodes']} paired nodes differ)"
        )
    out.append(f"- {gt['checks']['loss_note']}")
    return out


def _pp_local(gt: dict[str, Any]) -> list[str]:
    lay = gt["layout"]
    out = [
        f"- no fault; pp2 = `{lay['pp2']}`, rank r holds global blocks "
        + ", ".join(f"rank {r}: {b}" for r, b in lay["global_blocks_of_rank"].items())
        + f" as {lay['local_block_names']}; {lay['note']}",
    ]
    for rank, st in gt["stages"].items():
        ex = [m for m in st["module_pairs"] if m["stage"] != m["pp1"]][:2] or st["module_pairs"][:2]
        out.append(
            f"- {rank}: {len(st['module_pairs'])} module pairs ("
            + ", ".join(f"`{m['stage']}` ↔ pp1 `{m['pp1']}`" for m in ex)
            + f", …), {len(st['node_pairs']['step0_forward'])} forward / "
            f"{len(st['node_pairs']['step0_backward'])} backward API pairs; not paired: "
            + ", ".join(f"`{n}`" for n in st["not_paired"])
        )
    for p in gt["p2p"]:
        if p["step"] == 0:
            out.append(
                f"- p2p {p['role']}: rank {p['send']['rank']} `{p['send']['node']}` → rank "
                f"{p['recv']['rank']} `{p['recv']['node']}` = pp1 `{p['pp1']['node']}` "
                f"{p['pp1']['leaf']}"
            )
    for step, s in gt["stitching"].items():
        out.append(
            f"- {step}: stitched pp2 vs pp1, max scale-aware error {s['max_scale_aware_error']} "
            f"over {s['paired_nodes']} paired nodes"
        )
    return out


def _tp_unsync(gt: dict[str, Any]) -> list[str]:
    f = gt["faults"][0]
    rc, cmp = gt["replica_check"], gt["tp1_comparison"]
    out = [
        f"- first replicated tensor differing across the TP ranks: step {f['step']}, ranks "
        f"{f['ranks']}, `{f['node']}` {f['tensor']} (in `{f['module']}`); Mean rank 0 "
        f"{f['stats']['rank0']['Mean']:.6g} vs rank 1 {f['stats']['rank1']['Mean']:.6g}; its "
        "input is identical on both ranks",
    ]
    for step, c in rc["per_step"].items():
        first = c["first"]
        out.append(
            f"- {step}: {c['replicated_tensors_differing_across_ranks']} of "
            f"{c['replicated_tensors']} replicated tensors differ across ranks; first "
            + (f"`{first['node']}` {first['tensor']}" if first else "none")
        )
    a, b = cmp["replicas_checked"], cmp["replicated_taken_from_rank0"]
    out.append(
        f"- TP=1 vs merged TP=2, replicas checked: step {a['step']} `{a['node']}` {a['tensor']} "
        f"(ranks agreeing with tp1: {a['ranks_agreeing_with_tp1']})"
    )
    out.append(
        f"- TP=1 vs merged TP=2, rank 0's copy of replicated tensors: step {b['step']} "
        f"`{b['node']}` {b['tensor']} ({b['relation']}, in `{b['module']}`)"
    )
    return out


def _dev(d: dict[str, str] | None) -> str:
    return f"{d['host']}:{d['device']}" if d else "none"


def _departure_lines(gt: dict[str, Any]) -> list[str]:
    out = []
    for f in gt["faults"]:
        b = f["baseline"]
        side = (f"the clean run (sdc_clean) blames rank {b['differ_from_baseline'][0]}" if b["decides"] else
                "the clean run cannot decide (inputs already differ from it): both ranks stay candidates")
        out.append(
            f"- {f.get('run', '')} step {f['step']}: ranks {f['ranks']} depart at `{f['node']}` {f['tensor']} "
            f"(in `{f['module']}`), inputs identical: {f['inputs_identical']}; origin rank {f['rank']} on "
            f"{_dev(f['device'])} (candidates " + ", ".join(f"rank {c['rank']} {c['host']}:{c['device']}"
                                                          for c in f["candidates"])
            + f"); {side}; {f['consequences']['tensors']} later replicated tensors of that step depart too")
    return out


def _sdc(gt: dict[str, Any]) -> list[str]:
    out = [f"- layout tp{gt['layout']['tp']} x dp{gt['layout']['dp']} (TP groups {gt['layout']['tp_groups']}, DP "
           f"groups {gt['layout']['dp_groups']}); {gt['replicated']['tp_tensors']} TP-replicated and "
           f"{gt['replicated']['dp_tensors']} DP-replicated tensor leaves per dump (read from the clean run)",
           "- placement: " + "; ".join(f"{job}: " + ", ".join(f"rank {r} {_dev(d)}" for r, d in p.items())
                                        for job, p in gt["placement"].items()),
           "- rank tables: " + ", ".join(f"`{v}`" for t in gt["rank_tables"].values() for v in t.values())]
    out += _departure_lines(gt)
    for d in gt.get("devices", []):
        if d["departures"]:
            out.append(f"- device {_dev(d)} (ranks {d['ranks']}): candidate in {len(d['departures'])} departures, "
                       f"origin of {len(d['origin_of'])}, blamed by the clean run in {len(d['wrong_side'])}")
    if gt["scenario"] == "sdc_md5":
        c = gt["checks"]
        out.append(f"- md5 (CRC-32) mode: {c['tp_replicated_leaves_with_equal_crc']} of "
                   f"{c['tp_replicated_leaves_checked']} TP-replicated leaves carry equal CRCs across their replicas; "
                   "the dumped region ends after backward (see the md5 note below)")
    return out


def _sdc_clean(gt: dict[str, Any]) -> list[str]:
    return [f"- no fault: none of the {gt['replicated']['tp_tensors']} TP-replicated and "
            f"{gt['replicated']['dp_tensors']} DP-replicated tensor leaves departs at any step "
            f"(steps {gt['steps']}); rank table `{gt['rank_tables']['job1']['json']}`, "
            f"`{gt['rank_tables']['job1']['csv']}`"]


def _sdc_tensor(gt: dict[str, Any]) -> list[str]:
    f = gt["faults"][0]
    rc = f["recomputed"]
    at = rc["outputs_differ_at"]
    return [f"- task tensor, level {gt['level']}, list {gt['list']}, data_mode {gt['data_mode']}, steps {gt['steps']}; "
            "placement job1: " + ", ".join(
                f"rank {r} {_dev(d)}" for r, d in gt["placement"]["job1"].items()),
            f"- {f['run']} step {f['step']}: ranks {f['ranks']} depart at `{f['node']}` {f['tensor']} ("
            + (f"in `{f['module']}`" if f["module"] else "level L1: no module tree")
            + f"), inputs identical: {f['inputs_identical']} (the tensor files bit for bit); the outputs "
            f"differ at element {at['position']} only (bit {at['xor_bits']}); origin rank {f['rank']} on "
            f"{_dev(f['device'])}; {f['consequences']['tensors']} later replicated tensors of that step depart too",
            f"- recomputed on {rc['device']} (torch {rc['torch']}) from rank {rc['rank']}'s dumped input: equals the "
            f"dumped output of rank(s) {rc['equals_dumped_output_of']}: {f['repro_verdict']}",
            f"- step 2: {gt['checks']['step2']}; rank table `{gt['rank_tables']['job1']['json']}`, "
            f"`{gt['rank_tables']['job1']['csv']}`"]


def _spike(gt: dict[str, Any]) -> list[str]:
    sp = gt["spike"]
    around = sp["loss_around"]
    out = [f"- spike step: {sp['step']} ({sp['rule']}); per-rank departures {sp['rank_departures']}",
           f"- loss around it (steps {around['steps']}): "
           + "; ".join(f"{k} " + ", ".join(f"{x:.3f}" for x in v) for k, v in around.items() if k != "steps")]
    for f in gt["faults"]:
        out.append(f"- origin: cause {f['cause']}, step {f['step']}, rank {f['rank']}, `{f['node']}` {f['tensor']} "
                   f"({f['origin']}" + (f", module `{f['module']}`" if f.get("module") else "")
                   + (f", device {_dev(f['device'])} by `{gt['rank_tables']['rank_table']['json']}`"
                      if f.get("device") else "") + ")")
    out += [f"- {c['cause']}: {c['text']}" for c in gt["causes"]]
    if "evidence" in gt:
        out.append("- series: " + "; ".join(gt["evidence"]["series"]))
    if "precursor" in gt:
        out.append(f"- precursor: {gt['precursor']['note']}")
    out += [f"- not a cause: `{n['node']}` {n['tensor']}: {n['why']}" for n in gt.get("not_causes", [])]
    return out


def _mindspore(name: str) -> Callable[[dict[str, Any]], list[str]]:
    """The digest of a sample from its (torch-free) scenario module: MindSpore, Megatron (imported when used)."""
    def digest(gt: dict[str, Any]) -> list[str]:
        import importlib

        from ._catalog import CATALOG

        fn: Callable[[dict[str, Any]], list[str]] = importlib.import_module(f"{__package__}.{CATALOG[name]}").digest
        return fn(gt)

    return digest


DIGESTS: dict[str, Callable[[dict[str, Any]], list[str]]] = {
    "renamed": _renamed,
    "pp_local": _pp_local,
    "tp_unsync": _tp_unsync,
    "xfw": _mindspore("xfw"),
    "kernel_resume": _mindspore("kernel_resume"),
    "sdc_clean": _sdc_clean,
    "sdc": _sdc,
    "sdc_md5": _sdc,
    "sdc_rank": _sdc,
    "sdc_tensor": _sdc_tensor,
    **{f"spike_{c}": _spike for c in ("healthy", "data", "optimizer", "hardware", "numerics", "data_mask")},
    "megatron": _mindspore("megatron"),  # its scenario module is torch-free too (issue 24)
}
