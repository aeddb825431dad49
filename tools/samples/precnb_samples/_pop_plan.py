"""Planning helpers shared by the dense and the MoE population draws: run ids, a draw's run registry, healthy pairs.

:mod:`precnb_samples._population` (dense draws) and :mod:`precnb_samples._pop_moe` (MoE draws) both plan with them.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

__all__ = ["copy_run", "export_moe_subset", "fault_lines", "healthy_pairs", "run_id", "run_registry",
           "subset_main"]


def run_id(spec: dict[str, Any]) -> str:
    """Content hash of a run spec (the run's folder name)."""
    return "r" + hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:12]


def run_registry() -> tuple[dict[str, dict[str, Any]], Callable[[dict[str, Any]], str]]:
    """``(runs, add)``: a draw's runs by content hash, and ``add(spec) -> run id`` (each spec once).

    >>> runs, add = run_registry()
    >>> add({"seed": 1}) == add({"seed": 1}), len(runs)
    (True, 1)
    """
    runs: dict[str, dict[str, Any]] = {}

    def add(spec: dict[str, Any]) -> str:
        rid = run_id(spec)
        runs.setdefault(rid, spec)
        return rid

    return runs, add


def healthy_pairs(seeds: list[int], reference: str, layouts: Iterable[str],
                  spec_of: Callable[[int, str], dict[str, Any]], add: Callable[[dict[str, Any]], str],
                  **extra: Any) -> list[dict[str, Any]]:
    """Per model seed, every layout against the *reference* layout of that seed (each run added once)."""
    out = []
    for s in seeds:
        ref = add(spec_of(s, reference))
        for lay in layouts:
            if lay != reference:
                out.append({"name": f"{lay}@{s}", "seed": s, "layout": lay, "run": add(spec_of(s, lay)),
                            "reference": ref, **extra})
    return out


def fault_lines(faults: list[dict[str, Any]], truth: dict[str, Any], *, label: str = "kind",
                notes: bool = True) -> list[str]:
    """A committed subset README's fault list: each fault run, its twin, what was injected and its ground truth."""
    out = []
    for f in faults:
        t = truth[f["run"]]
        tail = f" {' '.join(t.get('notes', []))}" if notes else ""
        out.append(f"- **{f[label]}** `runs/{f['run']}` (twin `runs/{f['twin']}`): injected {f['injection']}; "
                   f"first difference step {t.get('step')}, rank {t.get('rank')}, node `{t.get('node')}`, "
                   f"global module `{t.get('module')}`.{tail}")
    return out


def subset_main(argv: list[str] | None, doc: str, pop: Path, plan: Callable[[], dict[str, Any]],
                generate: Callable[..., Any], export: Callable[[Path, Path], Any], *, no_export: bool = False) -> int:
    """A committed subset's command line: generate (or reuse) its runs under ``--pop``, export them to ``--dest``."""
    import argparse

    ap = argparse.ArgumentParser(description=doc.split("\n")[0])
    ap.add_argument("--pop", type=Path, default=pop)
    ap.add_argument("--dest", type=Path, required=True)
    if no_export:
        ap.add_argument("--no-export", action="store_true", help="generate only")
    args = ap.parse_args(argv)
    generate(plan(), args.pop, log=lambda m: print(m, flush=True))
    if not getattr(args, "no_export", False):
        export(args.pop, args.dest)
    return 0


def copy_run(src: Path, dst: Path, skip: Callable[[str, str], bool]) -> None:
    """Copy one population run into a committed subset: its dumps compact (same JSON values), spec, result, config.

    *skip(file_name, step_dir)* says which dump files stay out (``stack.json``, steps not kept); the config's
    ``dump_path`` becomes relative.
    """
    import shutil

    for f in sorted((src / "dump").rglob("*.json")):
        if skip(f.name, f.relative_to(src / "dump").parts[0]):
            continue
        target = dst / "dump" / f.relative_to(src / "dump")
        target.parent.mkdir(parents=True, exist_ok=True)
        with open(f, encoding="utf-8") as fh:  # msprobe's indent=1 JSON, compact (values unchanged)
            data = json.load(fh)
        target.write_text(json.dumps(data, separators=(",", ":")) + "\n", encoding="utf-8")
    shutil.copyfile(src / "spec.json", dst / "spec.json")
    shutil.copyfile(src / "result.json", dst / "result.json")
    cfg = json.loads((src / "config.json").read_text(encoding="utf-8"))
    cfg["dump_path"] = "./dump"
    (dst / "config.json").write_text(json.dumps(cfg, indent=1) + "\n", encoding="utf-8")


def export_moe_subset(pop: Path, dest: Path, p: dict[str, Any], *, draw: str, keep: list[int],
                      layouts: dict[str, str], readme: Callable[[dict[str, Any], dict[str, Any]], str]
                      ) -> dict[str, Any]:
    """Copy a committed MoE subset's runs of plan *p* from *pop* to *dest*: its steps *keep*, no stack.json, no logs.

    Writes ``ground_truth.json`` (the manifest's runs, the faults' truth, draw *draw*, each layout of *layouts*
    with its ``--target-layout`` text, the steps kept) and ``README.md`` (``readme(p, gt)``); returns the truth.
    """
    import shutil

    from . import _pop_moe as PM  # noqa: N812
    from . import _population as P  # noqa: N812
    from .scrub import scrub_tree

    manifest = P.load_manifest(pop)
    if dest.exists():
        shutil.rmtree(dest)
    steps = {f"step{s}" for s in keep}
    for rid in p["runs"]:
        copy_run(pop / "runs" / rid, dest / "runs" / rid, lambda name, step: name == "stack.json" or step not in steps)
    runs = {rid: {k: v for k, v in manifest["runs"][rid].items() if k != "seconds"} for rid in p["runs"]}
    truth = {f["run"]: manifest["truth"][f["run"]] for f in p["faults"]}
    gt = {"runs": runs, "draws": {draw: {k: p[k] for k in ("size", "seeds", "healthy", "faults")}},
          "truth": truth, "layouts": {k: {**PM.LAYOUTS[k], "text": v} for k, v in layouts.items()},
          "steps_kept": keep}
    (dest / "ground_truth.json").write_text(json.dumps(gt, indent=1) + "\n", encoding="utf-8")
    (dest / "README.md").write_text(readme(p, gt), encoding="utf-8")
    scrub_tree(dest)
    return gt
