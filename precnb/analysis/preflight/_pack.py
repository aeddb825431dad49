"""Checks of what a msprobe config_check pack holds besides tensors: environment, packages, random calls.

The pack's dataset features and weights are tensors and go through the generic checks (data,
dp_data, parameters, frozen, initial_weights); its hyper-parameter files go into the
hyper-parameters check. These three compare the rest, like ``msprobe config_check -c`` does, with
GPU and NPU names of the same switch paired (``NCCL_DETERMINISTIC`` / ``HCCL_DETERMINISTIC``).
"""

from __future__ import annotations

from typing import Any

import xarray as xr

from precnb.analysis.preflight._common import check, names_list
from precnb.schema import side_table

__all__ = ["pack_checks"]

#: (canonical switch, NPU name, GPU name, default)
ENV_PAIRS = (
    ("deterministic collectives", "HCCL_DETERMINISTIC", "NCCL_DETERMINISTIC", "False"),
    ("collective algorithm", "HCCL_ALGO", "NCCL_ALGO", "None"),
    ("launch blocking", "ASCEND_LAUNCH_BLOCKING", "CUDA_LAUNCH_BLOCKING", "0"),
    ("visible devices", "ASCEND_RT_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES", "None"),
    ("intra-node RoCE", "HCCL_INTRA_ROCE_ENABLE", None, "0"),
    ("intra-node PCIe", "HCCL_INTRA_PCIE_ENABLE", None, "1"),
    ("cuBLAS workspace (determinism)", None, "CUBLAS_WORKSPACE_CONFIG", "None"),
    ("Python hash seed", "PYTHONHASHSEED", "PYTHONHASHSEED", "None"),
)
#: packages whose version bears on numerics (msprobe's list plus the accelerator stacks)
PACKAGES = ("torch", "torch-npu", "mindspore", "numpy", "transformers", "deepspeed", "megatron-core", "megatron",
            "mindspeed", "mindspeed-llm", "apex", "accelerate", "peft", "datasets", "flash-attn", "triton",
            "cann", "mindstudio-probe")


def _pack(ds: xr.Dataset | None) -> dict[str, Any] | None:
    if ds is None or not ds.attrs.get("config_check"):
        return None
    return side_table(ds, "config_check")


def _npu(env: dict[str, str]) -> bool:
    return any(k.startswith(("HCCL_", "ASCEND_")) for k in env)


def _env_check(pb: dict[str, Any], pt: dict[str, Any], names: tuple[str, str]) -> dict[str, Any]:
    eb, et = pb.get("env") or {}, pt.get("env") or {}
    if not pb.get("env_variables") or not pt.get("env_variables"):
        return check("env", "Environment variables", "skip", "a pack holds no env entry (written by rank 0 only)")
    diffs = []
    for label, npu, gpu, default in ENV_PAIRS:
        kb, kt = (npu if _npu(eb) else gpu), (npu if _npu(et) else gpu)
        if kb is None and kt is None:
            continue
        vb = eb.get(kb, default) if kb else None
        vt = et.get(kt, default) if kt else None
        if kb is None or kt is None:
            continue
        if str(vb) != str(vt):
            diffs.append({"switch": label, "baseline": f"{kb}={vb}", "target": f"{kt}={vt}"})
    details = {"differences": diffs, "kept": sorted(set(eb) | set(et))}
    if diffs:
        return check("env", "Environment variables", "warn", "environment differs: " + names_list(
            [f"{d['switch']}: {d['baseline']} ({names[0]}) vs {d['target']} ({names[1]})" for d in diffs]),
            confidence="high", basis="read", **details)
    return check("env", "Environment variables", "pass", f"the {len(ENV_PAIRS)} reproducibility switches agree "
                 f"({pb.get('env_variables')} and {pt.get('env_variables')} variables in the packs)",
                 confidence="high", basis="read", **details)


def _pip_check(pb: dict[str, Any], pt: dict[str, Any], names: tuple[str, str]) -> dict[str, Any]:
    vb, vt = pb.get("pip") or {}, pt.get("pip") or {}
    if not vb or not vt:
        return check("packages", "Package versions", "skip", "a pack holds no pip entry")
    diffs = [{"package": p, "baseline": vb.get(p), "target": vt.get(p)} for p in PACKAGES
             if (p in vb or p in vt) and vb.get(p) != vt.get(p)]
    if diffs:
        return check("packages", "Package versions", "warn", "versions differ: " + names_list(
            [f"{d['package']} {d['baseline'] or 'absent'} ({names[0]}) vs {d['target'] or 'absent'} ({names[1]})"
             for d in diffs]), confidence="high", basis="read", differences=diffs)
    shown = [f"{p} {vb[p]}" for p in PACKAGES if p in vb]
    return check("packages", "Package versions", "pass", "key packages agree: " + names_list(shown), basis="read")


def _random_check(pb: dict[str, Any], pt: dict[str, Any], names: tuple[str, str]) -> dict[str, Any]:
    rb, rt = pb.get("random") or {}, pt.get("random") or {}
    if not rb or not rt:
        return check("random", "Random calls", "skip", "a pack holds no random entry")
    diffs = []
    for rank in sorted(set(rb) & set(rt), key=int):
        for op in sorted(set(rb[rank]) | set(rt[rank])):
            a = sorted((c["site"], c["count"]) for c in rb[rank].get(op, []))
            b = sorted((c["site"], c["count"]) for c in rt[rank].get(op, []))
            if a != b:
                diffs.append({"rank": int(rank), "op": op, "baseline": a, "target": b})
    if diffs:
        d = diffs[0]
        return check("random", "Random calls", "warn", f"{len(diffs)} random API(s) called differently, e.g. rank "
                     f"{d['rank']} {d['op']}: {sum(c for _, c in d['baseline'])} call(s) ({names[0]}) vs "
                     f"{sum(c for _, c in d['target'])} ({names[1]})", basis="read", differences=diffs[:50])
    ops = sorted({op for r in rb.values() for op in r})
    return check("random", "Random calls", "pass", "the same random APIs from the same call sites: "
                 + names_list(ops), basis="read")


def pack_checks(base: xr.Dataset | None, target: xr.Dataset, names: tuple[str, str]) -> list[dict[str, Any]]:
    """The env / packages / random checks when both runs are config_check packs (nothing otherwise)."""
    pb, pt = _pack(base), _pack(target)
    if pt is None or pb is None:
        return []
    return [_env_check(pb, pt, names), _pip_check(pb, pt, names), _random_check(pb, pt, names)]
