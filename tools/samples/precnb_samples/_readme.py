"""Write ``data_samples/README.md`` from the samples' ``ground_truth.json`` files (no torch)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ._catalog import SAMPLE_NAMES
from ._digests import DIGESTS
from ._dumps import rank_dirs, step_dirs
from .scrub import scrub_paths


def _size(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _mb(n: int) -> str:
    return f"{n / 1e6:.2f} MB"


def _kb(n: int) -> str:
    return f"{n / 1e3:.1f} kB"


def _dump_root_lines(root: Path, indent: str) -> list[str]:
    lines = []
    for step, sdir in step_dirs(root):
        for rdir in rank_dirs(sdir):
            files = ", ".join(
                f"{f.name} {_kb(f.stat().st_size)}" for f in sorted(rdir.iterdir()) if f.is_file()
            )
            lines.append(f"{indent}step{step}/{rdir.name}/  ({files})")
    return lines


def _tree(sample: Path) -> list[str]:
    lines = [f"{sample.name}/  ({_mb(_size(sample))})"]
    for child in sorted(sample.iterdir()):
        if child.is_file():
            lines.append(f"  {child.name}  ({_kb(_size(child))})")
        elif step_dirs(child):
            lines.append(f"  {child.name}/  (dump root, {_mb(_size(child))})")
            lines += _dump_root_lines(child, "    ")
        elif child.name.startswith("step"):
            continue
        elif child.name == "monitor_output":
            lines.append(f"  {child.name}/  ({_mb(_size(child))})")
            for sub in sorted(child.iterdir()):
                if sub.name == "anomaly_detected":
                    for f in sorted(sub.rglob("*.json")):
                        lines.append(f"    {f.relative_to(child)}  ({_kb(_size(f))})")
                else:
                    csvs = sorted(sub.glob("*.csv"))
                    lines.append(
                        f"    {sub.name}/  ({len(csvs)} CSV files, {_kb(_size(sub))}: "
                        f"{csvs[0].name} ... {csvs[-1].name})"
                    )
        elif any(f.is_file() for f in child.iterdir()):
            lines.append(
                f"  {child.name}/  "
                + ", ".join(f"{f.name}" for f in sorted(child.iterdir()) if f.is_file())
            )
        else:  # e.g. a MindSpore kernel dump: count the files
            n = sum(1 for f in child.rglob("*") if f.is_file())
            lines.append(f"  {child.name}/  ({n} files, {_mb(_size(child))})")
    if step_dirs(sample):
        lines.insert(1, "  (dump root = this folder)")
        lines += _dump_root_lines(sample, "  ")
    return lines


def _fault_line(f: dict[str, Any]) -> str:
    where = f"step {f['step']}, rank {f['rank']}"
    what = f.get("node") or f.get("name")
    role = f" ({f['role']})" if "role" in f else ""
    where += f", `{what}`" if what else ""
    return f"- **{f['kind']}{role}**: {where}" + (
        f" in `{f['dump_json']}`"
        if "dump_json" in f
        else (f" in `{f['csv']}`" if "csv" in f else "")
    )


def _digest(gt: dict[str, Any]) -> list[str]:  # noqa: C901
    name = gt["scenario"]
    if name in DIGESTS:
        return DIGESTS[name](gt)
    out: list[str] = []
    if name == "healthy":
        c = gt["checks"]
        out.append(f"- no fault; first NaN node per step: {c['first_nan_node_by_step']}")
        out.append(
            f"- non-finite statistics in healthy step 0 (causal mask): "
            f"{sorted(c['nonfinite_stats_step0'])}"
        )
        out.append(f"- rank folder: `{gt['rank_dir_names'][0]}` ({gt['rank_dir_note']})")
    elif name == "dp_nan":
        for f in gt["faults"]:
            out.append(_fault_line(f))
        origin = gt["faults"][0]
        out.append(
            f"- origin module `{origin['module']}`; next NaN node `{origin['next_nan_node']}`"
        )
        for k, v in gt["checks"]["per_step_rank"].items():
            out.append(f"- {k}: first NaN node `{v['first_nan_node']}`")
    elif name == "divergence":
        for f in gt["faults"]:
            out.append(_fault_line(f) + f" — differing leaves: {sorted(f['differing_leaves'])}")
        for k, v in gt["checks"]["per_step_rank"].items():
            out.append(
                f"- {k}: first differing node `{v['first_differing_node']}` "
                f"({v['differing_nodes']} of {v['nodes']} nodes differ)"
            )
    elif name == "dp_sum":
        for k, v in gt["nodes_only_in_baseline"].items():
            out.append(
                f"- {k}: only in baseline: `{v[0]}` ... `{v[-1]}` ({len(v)} nodes); "
                "only in target: none"
            )
        out.append(
            f"- step 0 gradient norm ratio target/baseline: "
            f"{gt['checks']['step0_grad_norm_ratio_target_over_baseline']}"
        )
        out.append(
            f"- first common node that differs: {gt['checks']['first_common_differing_node']}"
        )
    elif name == "tp":
        for step, c in gt["checks"].items():
            rel = ", ".join(f"{k}: {v['count']}" for k, v in c["by_relation"].items())
            out.append(
                f"- {step}: {rel}; partial sums: "
                + ", ".join(f"`{x['node']}` {x['leaf']}" for x in c["partial_sum_tensors"])
                + "; nodes only in "
                f"tp2: {len(c['nodes_only_in_tp2'])} (Distributed.all_reduce)"
            )
        out.append("- per module (step 0):")
        for m in gt["module_correspondence"]:
            out.append(
                f"  - `{m['module']}` ({m['kind']}): weight {m['parameters.weight']}, "
                f"input {m['forward.input']}, output {m['forward.output']}, "
                f"`{m['inner_api']}` output {m['inner_api.output']}"
            )
        out.append("- every tensor's relation: `tensors` in ground_truth.json")
    elif name.startswith("preflight/"):
        out += [_fault_line(f) + (f" ({f['run']})" if "run" in f else (f" in `{f['pack']}`" if "pack" in f else ""))
                for f in gt["faults"]] or ["- no fault: no pre-flight check may fail"]
    elif name == "monitor":
        for f in gt["faults"]:
            line = _fault_line(f)
            if f["kind"] == "gradient_spike":
                line += (
                    f" — grad_unreduced total norm x"
                    f"{f['grad_unreduced_total_norm_ratio_vs_previous_step']:.0f} vs step "
                    f"{f['step'] - 1}"
                )
            out.append(line)
        for r, facts in gt["facts_from_csvs"].items():
            a = facts["first_nan_step_and_names_in_csv_order"].get("actv")
            if a:
                out.append(f"- {r}: first NaN activation step {a['step']}: `{a['names'][0]}`")
        for r, a in gt["anomaly_detected_summary"].items():
            if a and a["first_AnomalyNan_excluding_embed.input"]:
                e = a["first_AnomalyNan_excluding_embed.input"]
                out.append(
                    f"- {r} anomaly.json: {a['entries']} entries; first AnomalyNan (not "
                    f"embed.input): step {e['step']} `{e['tag_name']}`"
                )
    elif name in ("tensor_bf16", "tensor_bug"):
        for f in gt["faults"]:
            out.append(_fault_line(f) + f" — module `{f['module']}`, differing leaves: "
                       f"{sorted(f['differing_leaves'])}")
        p = gt.get("precision")
        if p:
            out.append(f"- {p['target']} vs {p['baseline']}: {p['tensors_float32_in_baseline_bfloat16_in_target']} "
                       f"tensors fp32 → bf16 in {len(p['api_families_changed'])} API families "
                       f"({', '.join(p['api_families_changed'])}); first bf16 node "
                       f"`{p['first_node_with_bfloat16']}`; no parameter changes dtype")
        c = gt["msprobe_compare"]
        out.append(f"- `msprobe compare` (tensor mode) of the pair: `{c['csv']}`, {c['rows']} rows "
                   f"({c['rows_with_metrics']} with metrics), Result {c['result_counts']}")
    else:  # scenarios that state their own digest lines
        out += [str(x) for x in gt.get("digest", [])]
    return out


_NOTES = """\
## msprobe behaviour observed while generating (msprobe 26.2.0, torch 2.13.0+cpu)

- Dump layout `<dump root>/step<N>/<rank dir>/{dump.json, construct.json, stack.json}`. The rank
  folder is `rank<R>` when torch.distributed is initialised before the first `start()` (also for a
  world size of 1: `tp/tp1`), otherwise `proc<PID>` (`healthy/`). The PID changes on every
  regeneration; the generator keeps what msprobe writes.
- dump.json holds bare `NaN`, `Infinity`, `-Infinity` tokens (Python's `json` reads them; strict
  JSON parsers do not). The generator's `ground_truth.json` files also contain `NaN` where losses or
  norms are NaN.
- With the default `risk_level` (FOCUS) low-risk APIs (`Tensor.to`, `view`, `reshape`,
  `transpose`, `clone`, ...) are recorded in construct.json but not in dump.json. In `divergence/`
  the bfloat16 cast itself (`Tensor.to`) is therefore invisible: the first differing node,
  `Functional.gelu.0.forward`, already has a differing (bfloat16) *input*, while the
  `Functional.linear` that produced that input is identical.
- Statistics are taken when the hook runs: `Distributed.all_reduce.N.forward` has
  `input_args` = before and `output` = after the reduction; a `Functional.linear` output that is
  all-reduced in place afterwards keeps its pre-reduction (partial-sum) statistics, while the
  enclosing module's output record shows the reduced value (`tp/`).
- Collectives issued during backward (`_CopyToTP.backward` in `tp/tp2`) are still named
  `Distributed.all_reduce.N.forward`.
- API backward records (`X.N.backward`) exist; `Functional.linear.N.backward` has `input` = the
  grad of the output and `output` = the grad of its 2-D view (`[tokens, features]`), not the grad of
  the linear's input.
- The optimizer is `torch.optim.AdamW(fused=True)`, recorded as one `Torch._fused_adamw_.0.forward`
  node whose `input_args` are lists (params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, steps).
  The CPU default single-tensor AdamW records ~9 ops per parameter and made the samples exceed the
  size budget (the shared S1 sample shows that form).
- torch warns "Full backward hook is firing when gradients are computed with respect to module
  outputs since no inputs require gradients" on every backward (msprobe's module hook on the
  embedding, whose input is integer token ids); harmless.
- TrainerMon: one folder per rank named `<Mon><DD>_<HH-MM-SS>-rank<R>-<uuid8>` (time in
  Asia/Shanghai, so names change on regeneration); `shape` and `dtype` are appended to the
  configured ops; `exp_avg`/`exp_avg_sq` have no step-0 CSV ("optimizer state can not
  accessed" is logged at step 0); `embed.input` rows of `actv_grad` are all `nan` (int token
  ids have no grad), so AnomalyNan fires on them at every step; anomaly.json keeps only the
  last op per tag and step, so the grad-norm hits of the spike are only in the log (counted
  in ground_truth.json).
- TrainerMon is created with `params_have_main_grad=False` (plain PyTorch grads, no Megatron
  `main_grad`) and `set_monitor(model, optimizer=opt, grad_acc_steps=1)`; the data-parallel
  all-reduce is a manual loop over `model.parameters()`, so `grad_reduced` is read in the
  optimizer pre-step hook after it.
- The row-parallel all-reduce is done inside an autograd.Function (`_ReduceFromTP`, identity in
  backward, like Megatron): a bare in-place `dist.all_reduce` on a tensor that requires grad makes
  torch warn that `c10d::allreduce_` has no autograd kernel.
- Point-to-point ops (`pp_local/pp2`): `Distributed.send.N.forward` has the sent tensor as
  `input_args.0` (and again in `output`); `Distributed.recv.N.forward` has `input_args` `[null]`
  and the received tensor as `output.0`. API call counters restart on every rank, so a pipeline
  stage's `Functional.linear.0` is a later `Functional.linear.K` of the unsplit run.
- The fused optimizer node `Torch._fused_adamw_.0.forward` has the pseudo-parent `optimizer` in
  construct.json (a key without a dump record). Module `backward`/`parameters_grad` nodes and
  the backward records of APIs called outside any module's backward hook (the embedding's, whose
  input is integer token ids, and a multiply right after it) have the parent `null`.
- `nn.Embedding` calls `F.embedding` with five more positional arguments (`padding_idx`,
  `max_norm`, `norm_type`, `scale_grad_by_freq`, `sparse`) than a code base that calls
  `F.embedding(ids, weight)` itself: `renamed/` pairs such records whose tensors agree while
  their non-tensor `input_args` differ. `Tensor.float` on a float32 tensor is a low-risk API
  (construct.json only).
- `summary_mode: "md5"` on CPU: the CRC-32 of a tensor is computed by a thread pool on the live
  tensor (msprobe copies to the host only from cuda/npu devices), so a tensor changed in place
  right after it is recorded (the input of `Tensor.div_`, an `all_reduce` output divided in place
  next, the inputs of the fused optimizer) can carry the CRC of its new value and differ across
  replicas whose statistics are equal. `sdc_md5` therefore ends its dumped region after backward
  (before the gradient sync and the optimizer). The inputs of in-place collectives (and the
  row-parallel partial sum the forward `all_reduce` sums in place) stay racy: their CRCs changed
  between identical reruns; `checks.crc_unreliable` lists them (none is a replicated tensor).
- msprobe takes a float16 tensor's `Norm` in float16: `spike_numerics` step 7 has a float16
  `Tensor.pow` output whose Norm is `Infinity` while its Max is 10856 (no element overflowed).
  int64 tensors (token ids) get Max/Min only (Mean and Norm `null`).
- With `data_mode: ["forward"]` (the `sdc*` samples) the collectives issued during backward
  (`_CopyToTP.backward`) are still recorded (they are `Distributed.all_reduce.N.forward`); a
  collective on a sub-group records its `group` argument as `{"type": "torch.ProcessGroup",
  "group_ranks": [...], "group_id": ...}`.
- TrainerMon watches the parameters of its targets (matched by name prefix: target
  `blocks.0.mlp` also takes `blocks.0.mlp_norm`); `forward_only: true` drops `actv_grad`.
  Its statistics ops run inside the dumped region and appear in dump.json
  (`bookkeeping_nodes_per_dump` in the `spike_*` ground truths).
- Fault injection for NaN: `scores + torch.sqrt(poison)` with `poison` zero except `-1` at one
  position on the faulty step/rank. The same ops run on every step and rank (the position is
  written with `Tensor.__setitem__` every time), so node names line up across ranks and steps and
  `Torch.sqrt.0.forward` is an API whose input is finite and whose output holds the NaN.
"""


_MS_NOTES = """\
## MindSpore behaviour observed while generating (MindSpore 2.10.0 CPU, msprobe 26.2.0)

- msprobe's statistics on MindSpore call `mindspore.mint.norm`, whose LinalgVectorNorm kernel is
  not registered on CPU: the port worker replaces it by `sqrt(sum(x*x))` (ops in msprobe's own
  list of internally used APIs, so they are not dumped). `ops.rms_norm` has no CPU kernel
  ("Unsupported op [RmsNorm] on CPU"): RMSNorm is composed from basic ops, as in the PyTorch
  model. MindSpore's GELU defaults to the tanh form: the port passes `approximate="none"`.
- As in the shared S13 sample (whose notes say MindSpore's AdamW variants fail on CPU under
  msprobe), the port's optimizer step is written out (float32 numpy) and runs after
  `debugger.stop()`, so the MindSpore dumps have no optimizer node while the PyTorch dump has
  `Torch._fused_adamw_`.
- The MindSpore dump adds glue nodes PyTorch does not record (`Primitive.*.Shape`,
  `Primitive.*.Reshape`, `Functional.shape`, `Tensor.reshape`/`transpose`); dtypes are spelled
  `Float32` against `torch.float32`. `msprobe compare` of a MindSpore target against a PyTorch
  golden must run where mindspore is importable; its counts are in `xfw/ground_truth.json`.
- MindSpore's own e2e dump on CPU refuses `saved_data: "statistic"` (statistic.csv exists only on
  GPU/Ascend; see the shared S14 sample); `"tensor"` writes one .npy per kernel input/output. Its
  `execution_order/ms_execution_order_graph_<id>.csv` does not match the files (names without
  files, kernels missing from it): order kernels by the files' timestamps. The binary
  `graphs/*.pb` (absolute source paths) is removed; the text IR is kept.
- `load_param_into_net` without `strict_load` falls back to a checkpoint entry whose name ends
  the same way: a weight whose key was renamed silently receives `adam_m.<name>` (its Adam
  moment). `kernel_resume/bad` uses `strict_load=True`, so the weight stays at its zero
  initialisation and is listed as not loaded.
"""


def write_readme(out: str | Path) -> Path:
    """Rewrite ``out/README.md`` describing every sample that has a ground_truth.json."""
    out = Path(out)
    gts = {}
    for name in SAMPLE_NAMES:
        path = out / name / "ground_truth.json"
        if path.exists():
            with open(path, encoding="utf-8") as fh:
                gts[name] = json.load(fh)
    first = next(iter(gts.values()), None)
    versions = first["generated_by"] if first else {}
    total = sum(_size(out / n) for n in gts)
    lines = [
        "# precnb data samples: real msprobe output with recorded ground truth",
        "",
        "Every `dump.json`/`construct.json`/`stack.json`, monitor CSV and `anomaly.json` here was "
        "written by the real MindStudio Probe (PyPI `mindstudio-probe`) while a tiny GPT trained "
        "on "
        "CPU (torch.distributed with the gloo backend on 127.0.0.1, ranks spawned with "
        "torch.multiprocessing). Only `ground_truth.json`, `configs/` and this README are written "
        "by the generator, `tools/samples/precnb_samples/` (the fault locations in `ground_truth.json` are read "
        "back "
        "from the produced dumps and checked against what was injected).",
        "",
        "## How they were made",
        "",
        "```",
        "pip install -e tools/samples     # the generator: torch==2.13.0 (CPU), mindstudio-probe==26.2.0",
        "make samples                     # = the line above + the next one",
        "python -m precnb_samples --out data_samples                  # all samples",
        "python -m precnb_samples --out data_samples --only dp_nan tp # some of them",
        "```",
        "",
        "The MindSpore samples (`xfw`, `kernel_resume`) also run MindSpore 2.10 on CPU in an "
        "interpreter of its own (MindSpore wheels need numpy < 2), named by "
        "`PRECNB_MINDSPORE_PYTHON`:",
        "",
        "```",
        "python3 -m venv ~/venvs/ms",
        "~/venvs/ms/bin/pip install 'numpy<2' mindspore==2.10.0 mindstudio-probe==26.2.0",
        "export PRECNB_MINDSPORE_PYTHON=~/venvs/ms/bin/python",
        "python -m precnb_samples --out data_samples --only xfw kernel_resume",
        "```",
        "",
        "The `megatron` sample runs real Megatron-Core 0.19.2 (and Hugging Face `transformers`) in an interpreter "
        "named by `PRECNB_MEGATRON_PYTHON` (megatron-core 0.19.2 declares Python >= 3.12; its cp311 wheel works on "
        "3.11; about 16 minutes on 2 cores):",
        "",
        "```",
        "python3.11 -m venv ~/venvs/megatron",
        "~/venvs/megatron/bin/pip install torch==2.13.0 mindstudio-probe==26.2.0 triton transformers",
        "~/venvs/megatron/bin/pip download --no-deps --ignore-requires-python megatron-core==0.19.2 -d mg-wheel",
        "~/venvs/megatron/bin/pip install --ignore-requires-python mg-wheel/megatron_core-0.19.2-cp311-*.whl",
        "export PRECNB_MEGATRON_PYTHON=~/venvs/megatron/bin/python",
        "python -m precnb_samples --out data_samples --only megatron",
        "```",
        "",
        "Versions: " + ", ".join(f"{k} {v}" for k, v in versions.items() if k != "command") + ".",
        "All samples take about 12 minutes on 2 CPU cores (8 of them for the 4-rank `sdc*` jobs and the "
        "`spike_*` runs). Seeds, data and fault positions are "
        "fixed and every rank runs single-threaded with "
        "`torch.use_deterministic_algorithms(True)`, "
        "so a rerun reproduces the statistics bit for bit and the faults at the same step, rank "
        "and node; only `proc<PID>` folder names and monitor folder names (time + uuid) change. No file "
        "names a path of the machine that made it: the generator rewrites them "
        "(`precnb_samples.scrub`: `<venv>/site-packages/…`, `<python>/lib/python3.11/…`, paths relative to "
        "the repository, `<run>/…` for a temporary folder).",
        "",
        "Model: " + (first["model"] if first else "") + ". `healthy`, `dp_nan` and `monitor` use "
        "2 blocks; `divergence`, `dp_sum` and `tp` use 1 block (the same model otherwise); "
        "`renamed` uses 2 blocks (the same model, written twice with other names), `pp_local` "
        "4 blocks (2 per pipeline stage) and `tp_unsync` 1 block with hidden dropout, to keep "
        "all samples under 20 MB; `xfw` uses 2 blocks and `kernel_resume` a smaller 1-layer MindSpore "
        "configuration; the tensor-mode samples (`tensor_*`: every tensor saved as a file, 1 step) use "
        "2 blocks with vocab 32 and batch 1 to stay under 3 MB each; the faulty-device samples (`sdc*`, "
        "issue 28) run 1 MLP-only block as tp2 x dp2 on 4 ranks and dump forward records of 3 of 4 steps "
        "(`sdc_tensor`: task tensor, 3 ops at L1, 2 of 3 steps), and "
        "the loss-spike samples (`spike_*`, issue 29) run 1 MLP-only block with plain SGD and batch 16 on 2 ranks "
        "for 10 steps (TrainerMon every step, the dump on the 3 steps around the spike, every loss in "
        "`loss_log.csv`; `spike_data_mask`, issue 47, the same with causal self-attention, whose "
        "`masked_fill(-inf)` causal mask holds -inf at every step by design, and no absolute path in its "
        "files). Each `ground_truth.json` states its model.",
        "",
        f"Total size: {_mb(total)}.",
        "",
        "`ground_truth.json` common fields: `scenario`, `what`, `generated_by` (command and "
        "versions), `model`, `world_size`, `steps`, `dump_files` ([dump root ->] step -> rank -> "
        "dump.json path), "
        "`faults` (list of `{kind, role, step, rank, node | name, dump_json | csv, how, ...}`; "
        "`role` is `origin` for where the fault first shows and `spread` for where it reaches "
        "another rank), `checks` (facts re-derived from the dumps) and `losses` (per rank, per "
        "step; NaN where the loss was NaN).",
        "",
        "| sample | what | world size | steps | size | ground truth |",
        "|---|---|---|---|---|---|",
    ]
    for name, gt in gts.items():
        faults = (
            "; ".join(
                f"{f['kind']}{'/' + f['role'] if 'role' in f else ''} step {f['step']} rank "
                f"{f['rank']}"
                + (f" `{f.get('node') or f.get('name')}`" if f.get("node") or f.get("name") else "")
                for f in gt["faults"]
            )
            or "no fault"
        )
        if name == "tp":
            faults = "no fault; sharded / replicated / partial-sum tensors listed"
        ws = gt.get("world_size")
        ws = ", ".join(f"{k}: {v}" for k, v in ws.items()) if isinstance(ws, dict) else ws
        lines.append(
            f"| `{name}/` | {gt['what']} | {ws} | {len(gt['steps'])} | "
            f"{_mb(_size(out / name))} | {faults} |"
        )
    for name, gt in gts.items():
        lines += [
            "",
            f"## {name}",
            "",
            gt["what"] + ".",
            "",
            f"Regenerate: `{gt['generated_by']['command']}`",
            "",
        ]
        seen = set()
        for f in gt["faults"]:
            if "how" in f and f["how"] not in seen:
                seen.add(f["how"])
                lines.append(f"- how ({f['kind']}, step {f['step']}, rank {f['rank']}): {f['how']}")
        lines += ["", "Ground truth digest (full detail in `ground_truth.json`):", ""]
        lines += _digest(gt)
        lines += ["", "```", *_tree(out / name), "```"]
    lines += ["", _NOTES, _MS_NOTES]
    path = out / "README.md"
    path.write_text(scrub_paths("\n".join(lines).rstrip() + "\n", [(out, "data_samples")]), encoding="utf-8")
    return path
