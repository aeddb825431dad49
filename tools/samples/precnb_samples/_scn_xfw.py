"""Sample ``xfw``: the tiny GPT in PyTorch and its MindSpore 2.10 port, healthy and with a real bug.

``pt/`` runs the project's PyTorch model under msprobe (as ``healthy`` does); ``ms_same/`` and
``ms_bug/`` run the MindSpore port (MindFormers-style names, see ``_ms_model.py``) under msprobe
PyNative on CPU in the MindSpore interpreter (``PRECNB_MINDSPORE_PYTHON``), with the PyTorch
initial weights (``inputs/init_state_pt.npz``, loaded through a name map and checked bit-equal)
and the same batches (``inputs/batches.npz``). ``ms_bug`` differs from ``ms_same`` in one place:
layer 1's ffn_norm uses eps 1e-2 instead of 1e-6. Every location in the ground truth is read back
from the dumps (:mod:`precnb_samples._xfw_truth`) and checked against that injection.
"""

from __future__ import annotations

import csv
import json
from collections import Counter
from pathlib import Path
from typing import Any

from . import _dumps as D  # noqa: N812
from . import _xfw_truth as X  # noqa: N812
from ._ms_run import mindspore_versions, require_mindspore, run_ms, run_ms_command

STEPS = 2
BUG = {"module": "layers.1.ffn_norm", "eps": 1e-2, "healthy_eps": 1e-6}
REQUIRES = require_mindspore


def _root_data(root: Path, step: int) -> tuple[dict, dict, Path]:
    dirs = D.rank_dirs(root / f"step{step}")
    if len(dirs) != 1:
        raise _error(f"{root}/step{step}: expected one rank folder, found {dirs}")
    return (D.dump_data(dirs[0] / "dump.json"), D.load_json(dirs[0] / "construct.json"), dirs[0])


def _error(message: str) -> Exception:
    from ._scenarios import GroundTruthError  # imports torch: only when a check fails

    return GroundTruthError(message)


def _check(cond: bool, message: str) -> None:
    if not cond:
        raise _error(message)


def _inputs(sample: Path, model: Any) -> tuple[Path, Path]:
    import numpy as np
    import torch

    from ._model import TinyGPT, make_batch

    inputs = sample / "inputs"
    inputs.mkdir(parents=True)
    net = TinyGPT(model)  # seeded: the same initial weights as the PyTorch worker's model
    state = {k: v.detach().numpy() for k, v in net.state_dict().items()}
    np.savez(inputs / "init_state_pt.npz", **state)  # type: ignore[arg-type]
    batches = {}
    for step in range(STEPS):
        x, y = make_batch(model, step, 0)
        batches[f"x{step}"], batches[f"y{step}"] = x.numpy(), y.numpy()
    np.savez(inputs / "batches.npz", **batches)  # type: ignore[arg-type]
    del torch
    return inputs / "init_state_pt.npz", inputs / "batches.npz"


def _write_mappings(sample: Path, modules: list[dict[str, Any]]) -> dict[str, str]:
    """Write msprobe's cell-mapping (-cm) and layer-mapping (-lm) YAML for this pair, from the module pairs."""
    folder = sample / "msprobe_mapping"
    folder.mkdir()
    cell = [f"{m['ms_cell']}.{m['ms_class']}: {m['pt_module']}.{m['pt_class']}" for m in modules]
    (folder / "cell_mapping.yaml").write_text("\n".join(cell) + "\n", encoding="utf-8")
    classes = {m["ms_cell"]: m["ms_class"] for m in modules}
    layer: dict[str, dict[str, str]] = {}
    for m in modules:
        ms_parts, pt_parts = m["ms_cell"].split("."), m["pt_module"].split(".")
        cut = 2 if ms_parts[-1].isdigit() else 1  # layers.0: the attribute is the container's name
        parent = classes.get(".".join(ms_parts[:-cut]), "TopLayer")
        key, val = ms_parts[-cut], pt_parts[-cut]
        if key != val:
            layer.setdefault(parent, {})[key] = val
    text = "".join(f"{cls}:\n" + "".join(f"  {k}: {v}\n" for k, v in kv.items()) for cls, kv in layer.items() if kv)
    (folder / "layer_mapping.yaml").write_text(text, encoding="utf-8")
    return {"cell_mapping": "msprobe_mapping/cell_mapping.yaml", "layer_mapping": "msprobe_mapping/layer_mapping.yaml"}


def _msprobe_compare(ctx: Any, sample: Path, target: str, options: list[str], tag: str) -> dict[str, Any]:
    """Run msprobe compare (MindSpore target vs PyTorch golden, step 0) and summarise its CSV."""
    out = ctx.log_dir / tag
    t = D.rank_dirs(sample / target / "step0")[0] / "dump.json"
    g = D.rank_dirs(sample / "pt" / "step0")[0] / "dump.json"
    args = ["-c", "import sys; from msprobe.msprobe import main; sys.argv = ['msprobe'] + sys.argv[1:]; "
            "sys.exit(main())", "compare", "-tp", str(t), "-gp", str(g), "-o", str(out)]
    args += [str(sample / o) if o.endswith(".yaml") else o for o in options]
    rc = run_ms_command(args, log_dir=ctx.log_dir, tag=tag)
    csvs = sorted(out.glob("compare_result_*.csv"))
    _check(rc == 0 and len(csvs) == 1, f"msprobe compare {tag} failed (rc {rc}, {csvs})")
    with open(csvs[0], newline="", encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    matched = [r for r in rows if r["Bench Name"] != "N/A"]

    def value_error(r: dict[str, str]) -> bool:
        msgs = json.loads(r["Err_message"] or "[]")
        return any(m.startswith("error") and "dtype" not in m and "Required_Grad" not in m and "shape" not in m
                   for m in msgs)

    first_value = next((r["NPU Name"] for r in matched if value_error(r)), None)
    return {"target": target, "golden": "pt", "step": 0, "options": " ".join(options) or "(none)",
            "rows": len(rows), "matched_rows": len(matched),
            "result_counts_matched": dict(Counter(r["Result"] for r in matched)),
            "result_counts_unmatched": dict(Counter(r["Result"] for r in rows if r["Bench Name"] == "N/A")),
            "error_rows": sum(r["Result"] == "error" for r in rows),
            "error_messages_top": Counter(r["Err_message"] for r in rows if r["Result"] == "error").most_common(3),
            "rows_with_a_value_error": sum(value_error(r) for r in matched),
            "first_row_with_a_value_error": first_value}


def gen_xfw(ctx: Any, sample: Path) -> dict:
    """PyTorch TinyGPT vs its MindSpore port (healthy and with a wrong RMSNorm eps), 2 steps."""
    from ._model import ModelConfig
    from ._scenarios import _dump_config, _header, _layout
    from ._train import RunSpec, launch

    model = ModelConfig(blocks=2)
    state, batches = _inputs(sample, model)
    spec = RunSpec("dump", str(_dump_config(sample, sample / "pt", "config_pt.json")), 1, STEPS,
                   str(ctx.log_dir), init_dist=False, model=model, tag="xfw_pt")
    losses: dict[str, Any] = {"pt": launch(spec)[0]}
    cfg = {"vocab": model.vocab, "hidden": model.hidden, "heads": model.heads, "ffn": model.ffn,
           "blocks": model.blocks, "seq": model.seq}
    ms_info = {}
    for variant, eps in (("ms_same", {}), ("ms_bug", {BUG["module"]: BUG["eps"]})):
        conf = _dump_config(sample, sample / variant, f"config_{variant}.json")
        res = run_ms("_ms_port_worker.py", {"config": str(conf), "cfg": cfg, "state": str(state),
                                            "batches": str(batches), "steps": STEPS, "lr": model.lr,
                                            "weight_decay": model.weight_decay, "eps": eps},
                     log_dir=ctx.log_dir, tag=f"xfw_{variant}")
        losses[variant] = res["losses"]
        ms_info[variant] = res
    truth = _truth(ctx, sample)
    versions = mindspore_versions()
    info = ms_info["ms_same"]
    return _header(
        ctx, "xfw",
        "PyTorch TinyGPT (pt/) vs the same model ported to MindSpore 2.10 PyNative CPU with "
        "MindFormers-style names: healthy (ms_same/) and with layer 1's ffn_norm RMSNorm eps 1e-2 "
        "instead of 1e-6 (ms_bug/); identical weights and batches, msprobe statistics dumps at level mix",
        model, task="statistics", level="mix", world_size=1, steps=list(range(STEPS)),
        frameworks={"pt": "torch (msprobe.pytorch), see generated_by",
                    "ms_same": f"mindspore {versions['mindspore']} PyNative CPU (msprobe.mindspore)",
                    "ms_bug": f"mindspore {versions['mindspore']} PyNative CPU (msprobe.mindspore)"},
        mindspore_interpreter={"env": "PRECNB_MINDSPORE_PYTHON", **versions},
        dump_roots={"pt": "pt", "ms_same": "ms_same", "ms_bug": "ms_bug"},
        dump_files={r: _layout(sample / r, sample) for r in ("pt", "ms_same", "ms_bug")},
        inputs={"init_state_pt": "inputs/init_state_pt.npz", "batches": "inputs/batches.npz"},
        **truth,
        losses=losses,
        ms_run_info={"optimizer": "hand-written torch.optim.AdamW semantics (float32 numpy; lr "
                                  f"{model.lr}, betas 0.9/0.999, eps 1e-8, weight_decay {model.weight_decay}) "
                                  "run after debugger.stop(): the MindSpore dumps have no optimizer ops, the "
                                  "PyTorch dump has Torch._fused_adamw_",
                     "param_name_map_pt_to_ms": info["param_name_map_pt_to_ms"],
                     "weights_equal_to_pytorch_init_asserted": info["weights_equal_to_pytorch_init_asserted"],
                     "cpu_workarounds": ["mint.norm replaced by sqrt(sum(x*x)) for msprobe's statistics "
                                         "(LinalgVectorNorm has no CPU kernel)",
                                         "RMSNorm composed from basic ops (ops.rms_norm has no CPU kernel)",
                                         "GELU approximate='none' (MindSpore's default is tanh)"]},
        msprobe_compare=[_msprobe_compare(ctx, sample, t, o, f"xfw_compare_{t}_{i}")
                         for t in ("ms_same", "ms_bug")
                         for i, o in enumerate(([], ["-lm", "msprobe_mapping/layer_mapping.yaml"],
                                                ["-cm", "msprobe_mapping/cell_mapping.yaml"]))],
    )


def _truth(ctx: Any, sample: Path) -> dict[str, Any]:
    pt0, ptc0, pt_dir = _root_data(sample / "pt", 0)
    same0, samec0, _ = _root_data(sample / "ms_same", 0)
    bug0, bugc0, bug_dir = _root_data(sample / "ms_bug", 0)
    modules = X.pair_modules(pt0, same0)
    _check(len(modules) == 25, f"{len(modules)} module pairs")
    _check([m["ms_node"] for m in modules] == [m["ms_node"] for m in X.pair_modules(pt0, bug0)],
           "ms_bug's module tree differs from ms_same's")
    apis, unpaired = X.pair_apis(pt0, ptc0, same0, samec0, modules)
    apis_bug, _ = X.pair_apis(pt0, ptc0, bug0, bugc0, modules)
    _check(apis == apis_bug, "ms_bug's API pairs differ from ms_same's")
    mappings = _write_mappings(sample, modules)
    # healthy: every paired module and API agrees to fp32 noise at every step
    close = {}
    for step in range(STEPS):
        pt, _, _ = _root_data(sample / "pt", step)
        same, _, _ = _root_data(sample / "ms_same", step)
        c = X.module_closeness(pt, same, modules)
        worst_api = max(X.scale_aware_err(pt[a["pt_api"]]["output"][0], same[a["ms_api"]]["output"][0]) for a in apis)
        worst = max(v["scale_aware_err"] for v in c.values())
        _check(worst < X.NOISE and worst_api < X.NOISE, f"ms_same step {step} differs: {worst}, {worst_api}")
        close[f"step{step}"] = {"modules": c, "max_module_scale_aware_err": worst,
                                "max_api_scale_aware_err": worst_api}
    # the bug, same framework: ms_bug vs ms_same, bit-exact before the injection
    first_same = D.first_differing_node(same0, bug0)
    _check(first_same is not None and list(same0) == list(bug0), f"ms_bug vs ms_same: {first_same}")
    assert first_same is not None
    parent = D.parent_of(bugc0, first_same)
    diff_leaves = D.differing_leaves(same0[first_same], bug0[first_same])
    ffn = next(m for m in modules if m["ms_cell"] == BUG["module"])
    _check(parent == ffn["ms_node"] and X.api_name(first_same) == "Tensor.__add__"
           and "input_args.1" in diff_leaves and bug0[first_same]["input_args"][1].get("value") == BUG["eps"],
           f"first ms_bug/ms_same difference {first_same} in {parent}: {diff_leaves}")
    # the bug, across frameworks: the culprit module and its first differing API, at step 0
    found = X.culprit(pt0, bug0, modules, apis)
    _check(found is not None and found["ms_cell"] == BUG["module"], f"culprit {found and found['ms_cell']}")
    assert found is not None
    api = found["first_differing_api"]
    _check(api is not None and api["ms_api"] == first_same, f"first differing API {api}")
    later = [m["ms_cell"] for m in modules if X.io_errors(pt0[m["pt_node"]], bug0[m["ms_node"]])[1] > X.NOISE]
    rel = lambda d: str((d / "dump.json").relative_to(sample))  # noqa: E731
    fault = {
        "kind": "divergence", "role": "origin", "step": 0, "rank": 0,
        "node": found["ms_node"], "module": found["ms_cell"], "dump_json": rel(bug_dir),
        "baseline_node": found["pt_node"], "baseline_module": found["pt_module"],
        "baseline_dump_json": rel(pt_dir),
        "first_differing_api": api["ms_api"], "baseline_first_differing_api": api["pt_api"],
        "first_differing_api_inputs": api["differing_inputs"],
        "module_input_scale_aware_err": found["input_err"], "module_output_scale_aware_err": found["output_err"],
        "api_output_scale_aware_err": api["output_err"],
        "first_differing_node_vs_ms_same": first_same,
        "differing_leaves_vs_ms_same": diff_leaves,
        "modules_whose_output_differs_step0": later,
        "how": f"ms_bug builds {BUG['module']} (the port of blocks.1.mlp_norm) with RMSNorm eps "
               f"{BUG['eps']} instead of {BUG['healthy_eps']}; everything else is ms_same. The module's "
               "input agrees with PyTorch, its output does not; inside it the first API whose output "
               "differs is the `var + eps` Tensor.__add__ (its scalar input_args.1 is the wrong eps)",
    }
    return {
        "faults": [fault],
        "noise_threshold_scale_aware": X.NOISE,
        "node_counts_step0": {"pt": len(pt0), "ms_same": len(same0), "ms_bug": len(bug0)},
        "module_map_pt_to_ms": modules,
        "module_map_short": {m["pt_module"]: m["ms_cell"] for m in modules},
        "class_map_pt_to_ms": {**X.CLASS_MAP, "ModuleList": "CellList", "TinyGPT": "TinyGPT"},
        "container_and_root_nodes": {"note": "the root model and the ModuleList/CellList containers get "
                                             "no node (containers are never called)"},
        "api_name_pairs_pt_to_ms": {pt: sorted({X.api_name(a["ms_api"]) for a in apis if X.api_name(a["pt_api"]) == pt})
                                    for pt in sorted({X.api_name(a["pt_api"]) for a in apis})},
        "api_pairs_forward_step0": apis,
        "unpaired_forward_apis_step0": unpaired,
        "glue_rules": {"ms": X.MS_GLUE.pattern, "pt": X.PT_GLUE.pattern,
                       "pt_top_level_optimizer": "Torch._fused_adamw_ (the MindSpore optimizer runs outside the dump)"},
        "healthy_closeness": close,
        "msprobe_mapping_files": mappings,
        "counts": {"module_pairs": len(modules), "forward_api_pairs_step0": len(apis)},
    }


def digest(gt: dict[str, Any]) -> list[str]:
    """README lines for this sample."""
    f = gt["faults"][0]
    out = [f"- {gt['counts']['module_pairs']} module pairs, {gt['counts']['forward_api_pairs_step0']} forward "
           "API pairs at step 0 (`module_map_pt_to_ms`, `api_pairs_forward_step0`); glue nodes in "
           "`unpaired_forward_apis_step0`",
           "- healthy pair: max scale-aware error of module outputs per step "
           + ", ".join(f"{k} {v['max_module_scale_aware_err']:.2g}" for k, v in gt["healthy_closeness"].items()),
           f"- bug: step {f['step']}, `{f['node']}` (PyTorch `{f['baseline_node']}`): input agrees "
           f"({f['module_input_scale_aware_err']:.2g}), output differs ({f['module_output_scale_aware_err']:.2g}); "
           f"first differing API `{f['first_differing_api']}` (PyTorch `{f['baseline_first_differing_api']}`)"]
    for c in gt["msprobe_compare"]:
        out.append(f"- msprobe compare {c['target']} vs pt, mapping {c['options']}: {c['rows']} rows, "
                   f"{c['matched_rows']} matched, "
                   f"{c['error_rows']} marked error, {c['rows_with_a_value_error']} with a value error")
    return out


GENERATORS = {"xfw": gen_xfw}
