"""Pre-flight samples (issue 18): a configuration mistake made before any layer is compared.

Two-rank data-parallel runs of the one-block TinyGPT under the real msprobe, two steps each:

* ``preflight/healthy`` — baseline and target with the same configuration (no failing check);
* ``preflight/frozen`` — the target freezes ``blocks.0.attn.q_proj.weight`` (``requires_grad_(False)``);
* ``preflight/extra_param`` — the target's ``lm_head`` has a bias the baseline lacks;
* ``preflight/same_batch`` — one run in which every DP rank reads rank 0's batch;
* ``preflight/lr10`` — the target's learning rate is ten times the baseline's;
* ``preflight/packs`` — msprobe ``config_check`` packs (zip files written by ``ConfigChecker``): a
  healthy pair and a pair of runs whose ranks all read the same batch (msprobe's own comparison,
  rank R against rank R, passes that pair).

Every fact in ``ground_truth.json`` is read back from the produced dumps and packs with
:mod:`precnb_samples._dumps` (not with precnb's readers).
"""

from __future__ import annotations

import json
import zipfile
from dataclasses import replace
from pathlib import Path
from typing import Any

from . import _dumps as D  # noqa: N812
from ._scenarios import ONE_BLOCK, Context, _check, _expect_layout, _header, _layout, _load_all, write_json
from ._train import RunSpec, launch

__all__ = ["GENERATORS"]

STEPS = 2
WORLD = 2
FROZEN = "blocks.0.attn.q_proj.weight"
LR_FACTOR = 10.0
# the environment a config_check pack records (the generator's own environment is never packed)
PACK_ENV = (("NCCL_DETERMINISTIC", "1"), ("CUDA_LAUNCH_BLOCKING", "0"), ("CUBLAS_WORKSPACE_CONFIG", ":4096:8"),
            ("PYTHONHASHSEED", "0"))


def _config(sample: Path, root: Path, name: str, level: str, data_mode: tuple[str, ...] = ("all",)) -> Path:
    cfg = {"task": "statistics", "dump_path": str(root), "rank": [], "step": [], "level": level,
           "async_dump": False,
           "statistics": {"scope": [], "list": [], "data_mode": list(data_mode), "summary_mode": "statistics"}}
    path = sample / "configs" / name
    write_json(path, cfg)
    return path


def _run(ctx: Context, sample: Path, variant: str, level: str, tag: str, data_mode: tuple[str, ...] = ("all",),
         **kw: Any) -> dict[str, list[float]]:
    root = sample / variant if variant else sample
    cfg = _config(sample, root, f"config_{variant or 'run'}.json", level, data_mode)
    spec = RunSpec("dump", str(cfg), WORLD, STEPS, str(ctx.log_dir), tag=tag, **{"model": ONE_BLOCK, **kw})
    losses = {str(r): v for r, v in launch(spec).items()}
    _expect_layout(root, STEPS, WORLD, "rank")
    return losses


# ------------------------------------------------------------------------- reading the dumps back
def _params(data: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """``{module.param: {shape, dtype, requires_grad, stats, grad}}`` of one dump.json."""
    out: dict[str, dict[str, Any]] = {}
    for node, rec in data.items():
        if not node.startswith("Module.") or not isinstance(rec, dict):
            continue
        parts = node.split(".")
        if ".forward." in node and isinstance(rec.get("parameters"), dict):
            module = ".".join(parts[1:parts.index("forward") - 1])
            for pname, leaf in rec["parameters"].items():
                out.setdefault(f"{module}.{pname}", {}).update(
                    shape=leaf["shape"], dtype=leaf["dtype"], requires_grad=leaf.get("requires_grad"),
                    stats=[leaf[k] for k in D.STAT_KEYS])
        elif ".parameters_grad" in node:
            module = ".".join(parts[1:parts.index("parameters_grad") - 1])
            for pname in rec:
                out.setdefault(f"{module}.{pname}", {})["grad"] = True
    return out


def _all_params(root: Path) -> dict[tuple[int, int], dict[str, dict[str, Any]]]:
    return {key: _params(d) for key, d in _load_all(root).items()}


def _lr_values(data: dict[str, Any]) -> dict[str, float]:
    """``{node: lr}`` of the fused AdamW records of one dump.json."""
    out = {}
    for node, rec in data.items():
        if "_fused_adam" in node and isinstance(rec, dict):
            out[node] = rec["input_kwargs"]["lr"]["value"]
    return out


def _model_input(data: dict[str, Any]) -> dict[str, Any]:
    """The first module's forward input and output leaves (the batch entering the model)."""
    node = next(n for n in data if n.startswith("Module.") and ".forward." in n and "embed" in n)
    leaves = D.node_leaves(data[node])
    return {"node": node, **{p: [leaf.get(k) for k in ("shape", *D.STAT_KEYS)] for p, leaf in leaves.items()
                             if p.startswith(("input_args", "output"))}}


def _pair_facts(sample: Path) -> dict[str, Any]:
    """Parameter inventories, gradient records and learning rates of baseline and target, per run."""
    facts: dict[str, Any] = {}
    for variant in ("baseline", "target"):
        params = _all_params(sample / variant)
        p0 = params[(0, 0)]
        grads = sorted({n for ps in params.values() for n, v in ps.items() if v.get("grad")})
        changed = sorted(n for n in p0 if n in params[(1, 0)] and p0[n]["stats"] != params[(1, 0)][n]["stats"])
        data = _load_all(sample / variant)
        facts[variant] = {
            "parameters": {n: {"shape": v["shape"], "dtype": v["dtype"], "requires_grad": v["requires_grad"]}
                           for n, v in p0.items()},
            "parameter_count": len(p0),
            "parameter_elements": sum(_numel(v["shape"]) for v in p0.values()),
            "with_gradient_record": grads,
            "changed_from_step0_to_step1": changed,
            "fused_adamw_lr": {f"step{s}/rank{r}": _lr_values(d) for (s, r), d in sorted(data.items())},
        }
    return facts


def _numel(shape: list[int]) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


def _same_inputs(root: Path) -> dict[str, bool]:
    """Per step: whether both ranks' model inputs (the embedding's input and output) are identical."""
    data = _load_all(root)
    return {f"step{s}": _model_input(data[(s, 0)]) == _model_input(data[(s, 1)]) for s in range(STEPS)}


def _pair(ctx: Context, sample: Path, scenario: str, what: str, level: str, target_kw: dict[str, Any],
          faults: list[dict[str, Any]], model: Any = ONE_BLOCK, target_model: Any = None,
          data_mode: tuple[str, ...] = ("all",)) -> dict[str, Any]:
    tag = scenario.replace("/", "_")
    losses = {"baseline": _run(ctx, sample, "baseline", level, f"{tag}_baseline", data_mode, model=model),
              "target": _run(ctx, sample, "target", level, f"{tag}_target", data_mode, model=target_model or model,
                             **target_kw)}
    facts = _pair_facts(sample)
    return _header(
        ctx, scenario, what, target_model or model, task="statistics", level=level, world_size=WORLD,
        distributed_initialised=True, steps=list(range(STEPS)), dump_roots={"baseline": "baseline",
                                                                           "target": "target"},
        dump_files={v: _layout(sample / v, sample) for v in ("baseline", "target")},
        faults=faults, checks={**facts, "same_model_input_on_both_ranks": {
            v: _same_inputs(sample / v) for v in ("baseline", "target")}},
        losses=losses)


# ------------------------------------------------------------------------------------- scenarios
def gen_healthy(ctx: Context, sample: Path) -> dict[str, Any]:
    """Baseline and target: the same job twice (no failing pre-flight check)."""
    gt = _pair(ctx, sample, "preflight/healthy", "baseline vs target, 2-rank data parallel, the same job twice "
               "(same parameters, same frozen set, same hyper-parameters, distinct batches per rank); no "
               "pre-flight check fails", "L0", {}, [])
    c = gt["checks"]
    _check(c["baseline"]["parameters"] == c["target"]["parameters"], "parameter inventories differ")
    _check(c["baseline"]["with_gradient_record"] == c["target"]["with_gradient_record"], "grad records differ")
    _check(c["baseline"]["fused_adamw_lr"] == c["target"]["fused_adamw_lr"], "learning rates differ")
    _check(not any(c["same_model_input_on_both_ranks"]["target"].values()), "ranks read the same batch")
    return gt


def gen_frozen(ctx: Context, sample: Path) -> dict[str, Any]:
    """The target freezes one parameter (no gradient, requires_grad false, weights never change)."""
    gt = _pair(ctx, sample, "preflight/frozen", f"baseline vs target, 2-rank data parallel; the target sets "
               f"requires_grad=False on {FROZEN} (the baseline trains it)", "L0", {"freeze": (FROZEN,)}, [])
    c = gt["checks"]
    no_grad = sorted(set(c["baseline"]["with_gradient_record"]) - set(c["target"]["with_gradient_record"]))
    unchanged = sorted(set(c["baseline"]["changed_from_step0_to_step1"])
                       - set(c["target"]["changed_from_step0_to_step1"]))
    _check(no_grad == [FROZEN] and unchanged == [FROZEN], f"frozen: no grad {no_grad}, unchanged {unchanged}")
    _check(c["target"]["parameters"][FROZEN]["requires_grad"] is False, "requires_grad not recorded false")
    gt["faults"] = [{"kind": "frozen_parameter", "step": 0, "rank": r, "name": FROZEN, "run": "target",
                     "how": f"model.{FROZEN}.requires_grad_(False) after the model is built: no parameters_grad "
                     "record, requires_grad false in the module's parameters record, weights identical at "
                     "steps 0 and 1 (the baseline trains it)"} for r in range(WORLD)]
    return gt


def gen_extra_param(ctx: Context, sample: Path) -> dict[str, Any]:
    """The target's lm_head has a bias (one more parameter)."""
    target_model = replace(ONE_BLOCK, lm_head_bias=True)
    gt = _pair(ctx, sample, "preflight/extra_param", "baseline vs target, 2-rank data parallel; the target's "
               "lm_head is nn.Linear(bias=True) (zero-initialised bias): one parameter more", "L0", {}, [],
               target_model=target_model)
    c = gt["checks"]
    extra = sorted(set(c["target"]["parameters"]) - set(c["baseline"]["parameters"]))
    _check(extra == ["lm_head.bias"] and not set(c["baseline"]["parameters"]) - set(c["target"]["parameters"]),
           f"extra parameters {extra}")
    gt["faults"] = [{"kind": "extra_parameter", "step": 0, "rank": r, "name": extra[0], "run": "target",
                     "shape": c["target"]["parameters"][extra[0]]["shape"],
                     "how": "TinyGPT(lm_head_bias=True): lm_head = nn.Linear(16, 64, bias=True), created last so "
                     "every other parameter is initialised as in the baseline"} for r in range(WORLD)]
    return gt


def _adam_args(data: dict[str, Any]) -> dict[str, list[float]]:
    """The distinct single-tensor AdamW arguments recorded in one dump.json.

    ``Tensor.addcdiv_`` value = -lr / (1 - beta1^t); ``Tensor.lerp_`` weight = 1 - beta1.
    """
    out: dict[str, set[float]] = {"addcdiv_value": set(), "lerp_weight": set()}
    for node, rec in data.items():
        if node.startswith("Tensor.addcdiv_.") and isinstance(rec, dict):
            out["addcdiv_value"].add(rec["input_kwargs"]["value"]["value"])
        elif node.startswith("Tensor.lerp_.") and isinstance(rec, dict):
            out["lerp_weight"].add(rec["input_args"][2]["value"])
    return {k: sorted(v) for k, v in out.items()}


def gen_lr10(ctx: Context, sample: Path) -> dict[str, Any]:
    """The target's learning rate is LR_FACTOR times the baseline's (single-tensor AdamW, forward dump)."""
    model = replace(ONE_BLOCK, fused_adamw=False)
    target_model = replace(model, lr=model.lr * LR_FACTOR)
    gt = _pair(ctx, sample, "preflight/lr10", f"baseline vs target, 2-rank data parallel, torch's single-tensor "
               f"AdamW (foreach=False), forward-only mix dump; the target's learning rate is {LR_FACTOR:g}x the "
               f"baseline's ({model.lr:g} vs {target_model.lr:g})", "mix", {}, [], model=model,
               target_model=target_model, data_mode=("forward",))
    args = {v: {f"step{s}/rank{r}": _adam_args(d) for (s, r), d in sorted(_load_all(sample / v).items())}
            for v in ("baseline", "target")}
    ratios = {}
    for key, b in args["baseline"].items():
        t = args["target"][key]
        _check(len(b["addcdiv_value"]) == 1 and len(t["addcdiv_value"]) == 1, f"{key}: step sizes {b} {t}")
        _check(b["lerp_weight"] == t["lerp_weight"], f"{key}: beta1 differs {b} {t}")
        ratios[key] = t["addcdiv_value"][0] / b["addcdiv_value"][0]
    _check(all(abs(x - LR_FACTOR) < 1e-9 for x in ratios.values()), f"step size ratios {ratios}")
    gt["checks"]["single_tensor_adamw_args"] = args
    gt["checks"]["step_size_ratio_target_over_baseline"] = ratios
    gt["faults"] = [{"kind": "learning_rate", "step": 0, "rank": r, "node": "Tensor.addcdiv_", "run": "target",
                     "baseline_step_size": args["baseline"][f"step0/rank{r}"]["addcdiv_value"][0],
                     "target_step_size": args["target"][f"step0/rank{r}"]["addcdiv_value"][0],
                     "lr_ratio": LR_FACTOR,
                     "how": f"torch.optim.AdamW(lr={target_model.lr:g}, foreach=False) in the target, lr="
                     f"{model.lr:g} in the baseline; msprobe records each parameter's update "
                     "param.addcdiv_(exp_avg, denom, value=-lr / (1 - beta1^t)) and exp_avg.lerp_(grad, 1 - beta1)"}
                    for r in range(WORLD)]
    return gt


def gen_same_batch(ctx: Context, sample: Path) -> dict[str, Any]:
    """One run: every DP rank reads rank 0's batch."""
    losses = _run(ctx, sample, "", "L0", "preflight_same_batch", same_batch=True)
    same = _same_inputs(sample)
    _check(all(same.values()), f"ranks' model inputs differ: {same}")
    data = _load_all(sample)
    node = _model_input(data[(0, 0)])["node"]
    return _header(
        ctx, "preflight/same_batch", "one 2-rank data-parallel run in which every rank reads rank 0's batch "
        "(a data-sharding bug: the gradient all-reduce then averages two copies of one batch)", ONE_BLOCK,
        task="statistics", level="L0", world_size=WORLD, distributed_initialised=True, steps=list(range(STEPS)),
        dump_files=_layout(sample, sample),
        faults=[{"kind": "same_batch", "step": s, "rank": 1, "node": node, "same_as_rank": 0,
                 "how": "make_batch(cfg, step, data_rank=0) on every rank: the embedding's input and output "
                 "records are identical on both ranks at every step"} for s in range(STEPS)],
        checks={"same_model_input_on_both_ranks": same,
                "model_input": {f"step{s}/rank{r}": _model_input(d) for (s, r), d in sorted(data.items())}},
        losses=losses)


# ------------------------------------------------------------------------------ config_check packs
HPARAMS = "train_hparams.yaml"


def _pack(ctx: Context, sample: Path, name: str, same_batch: bool, tag: str) -> Path:
    zip_path = sample / name
    hp = sample / "configs" / HPARAMS
    spec = RunSpec("config_check", "", WORLD, STEPS, str(ctx.log_dir), tag=tag, model=ONE_BLOCK,
                   same_batch=same_batch, config_check_zip=str(zip_path), config_check_inputs=(str(hp),),
                   config_check_env=PACK_ENV)
    launch(spec)
    _check(zip_path.is_file(), f"no pack {zip_path}")
    return zip_path


def _pack_facts(zip_path: Path) -> dict[str, Any]:
    with zipfile.ZipFile(zip_path) as zf:
        names = sorted(zf.namelist())
        data = {n: zf.read(n) for n in names}
    dataset = {n: json.loads(data[n]) for n in names if n.startswith("dataset/")}
    same = {}
    for step in range(STEPS):
        a, b = (dataset.get(f"dataset/step{step}/rank{r}/dataset.json") for r in range(WORLD))
        same[f"step{step}"] = a is not None and a == b
    hp = json.loads(data["hyperparameters/hyperparameters_static.json"]) \
        if "hyperparameters/hyperparameters_static.json" in data else {}
    return {"entries": names, "same_dataset_features_on_both_ranks": same, "hyperparameters_static": hp,
            "env": json.loads(data["env"]) if "env" in data else None,
            "weights_entries": sorted(n for n in names if n.startswith("weights/"))}


def gen_packs(ctx: Context, sample: Path) -> dict[str, Any]:
    """config_check packs: a healthy pair and a pair whose ranks all read the same batch."""
    (sample / "configs").mkdir(parents=True, exist_ok=True)
    write_json(sample / "configs" / "config_check.json", {
        "api": "msprobe.core.config_check.ConfigChecker(model=model, shell_path=[configs/" + HPARAMS + "], "
               "output_zip_path=<pack>, fmk='pytorch') after ConfigChecker.apply_patches('pytorch')",
        "env": dict(PACK_ENV), "world_size": WORLD, "steps": STEPS})
    (sample / "configs" / HPARAMS).write_text(
        f"lr: {ONE_BLOCK.lr}\nweight_decay: {ONE_BLOCK.weight_decay}\nmicro_batch_size: {ONE_BLOCK.batch}\n"
        f"seq_length: {ONE_BLOCK.seq}\nseed: {ONE_BLOCK.seed}\n", encoding="utf-8")
    made = {}
    for pair, same in (("healthy", False), ("same_data", True)):
        for variant in ("baseline", "target"):
            rel = f"{pair}/{variant}.zip"
            (sample / pair).mkdir(exist_ok=True)
            made[rel] = _pack_facts(_pack(ctx, sample, rel, same, f"pack_{pair}_{variant}"))
    for rel, f in made.items():
        want = rel.startswith("same_data/")
        _check(all(v == want for v in f["same_dataset_features_on_both_ranks"].values()),
               f"{rel}: same dataset features {f['same_dataset_features_on_both_ranks']}")
        _check(f["env"] == dict(PACK_ENV), f"{rel}: unexpected env {f['env']}")
    return _header(
        ctx, "preflight/packs", "msprobe config_check packs (ConfigChecker(model, shell_path=[yaml]) in a 2-rank "
        "data-parallel run, 2 steps): healthy/ = the same job twice; same_data/ = two runs in which every rank "
        "reads rank 0's batch (msprobe's own comparison, rank R against rank R, passes it)", ONE_BLOCK,
        task="config_check", world_size=WORLD, distributed_initialised=True, steps=list(range(STEPS)),
        packs={rel: f"{rel}" for rel in made},
        faults=[{"kind": "same_batch", "step": s, "rank": 1, "name": "dataset", "same_as_rank": 0,
                 "pack": f"same_data/{v}.zip", "how": "every rank reads rank 0's batch: the pack's "
                 f"dataset/step{s}/rank0 and rank1 features are identical"}
                for v in ("baseline", "target") for s in range(STEPS)],
        checks={"packs": made, "env_note": "the packs' env entry holds only the variables listed in "
                "PACK_ENV: the generator swaps os.environ for them while ConfigChecker packs"})


GENERATORS = {
    "preflight/healthy": gen_healthy,
    "preflight/frozen": gen_frozen,
    "preflight/extra_param": gen_extra_param,
    "preflight/same_batch": gen_same_batch,
    "preflight/lr10": gen_lr10,
    "preflight/packs": gen_packs,
}
