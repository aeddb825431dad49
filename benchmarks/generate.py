"""Build large synthetic msprobe dump trees from the structure of a real dump.

The template is a real msprobe ``statistics`` dump (by default ``../shared``'s S1 baseline,
else the bundled ``data_samples/healthy``): every generated ``dump.json`` is the template's
text of the same step (steps cycle through the template's) with each float statistic
multiplied by a per-(step, rank) factor close to 1, so nodes, tensor names, dtypes, shapes,
``null`` and ``±Infinity`` tokens (the causal mask) and the JSON layout are msprobe's own.
``construct.json`` and ``stack.json`` are hard links to one copy per template step.

Three trees are written below ``OUT``:

``baseline/``
    healthy, ``stepS/rankR/{dump,construct,stack}.json``
``nan/``
    the baseline with NaN from the output of one node onward at one (step, rank) (hard links
    everywhere else)
``diverge/``
    the baseline with every float statistic ×2 from the output of one node onward at one
    (step, rank) (hard links everywhere else)

``OUT/manifest.json`` records the sizes and where the faults are. Deterministic: the same
arguments give byte-identical trees.

Usage::

    python benchmarks/generate.py --ranks 64 --steps 4 --out /tmp/precnb-bench/r64
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_NAN_NODE = "Functional.gelu.1.forward"
DEFAULT_DIVERGE_NODE = "Functional.gelu.0.forward"

# a statistic value in msprobe's indent=1 layout: "Max": 3.14,
_STAT = re.compile(r'("(?:Max|Min|Mean|Norm)": )([^,\n]+)')
_NODE = re.compile(r'^  "([^"]+)": \{$', re.MULTILINE)
_OUTPUT = re.compile(r'^   "output": ', re.MULTILINE)


def default_template() -> Path:
    """The S1 statistics dump of ``../shared`` when present, else ``data_samples/healthy``."""
    shared = Path(os.environ.get("PRECNB_SHARED", ROOT.parent / "shared"))
    s1 = shared / "data_samples" / "msprobe" / "S1_baseline" / "statistics"
    return s1 if s1.is_dir() else ROOT / "data_samples" / "healthy"


@dataclass
class StepTemplate:
    """One template step: dump text cut at every float statistic."""

    chunks: list[str]
    values: list[float]  # one per float slot (between chunks)
    slot_pos: list[int]  # text offset of each slot
    nodes: dict[str, tuple[int, int]]  # node -> (start offset, offset of its "output" section or -1)
    construct: Path
    stack: Path

    def render(self, factor: float, *, from_pos: int | None = None, mode: str = "") -> str:
        """The dump text with floats × *factor*; from *from_pos* on: NaN (``nan``) or ×2 (``diverge``)."""
        out = [self.chunks[0]]
        for i, v in enumerate(self.values):
            x = v * factor
            if from_pos is not None and self.slot_pos[i] >= from_pos:
                x = float("nan") if mode == "nan" else x * 2.0
            out.append(_fmt(x))
            out.append(self.chunks[i + 1])
        return "".join(out)

    def fault_pos(self, node: str) -> int:
        """Text offset from which a fault at *node* shows: its ``output`` section."""
        if node not in self.nodes:
            raise SystemExit(f"node {node!r} not in the template (try one of {list(self.nodes)[:8]}...)")
        start, out = self.nodes[node]
        return out if out >= 0 else start


def _fmt(x: float) -> str:
    if x != x:
        return "NaN"
    if x in (float("inf"), float("-inf")):
        return "Infinity" if x > 0 else "-Infinity"
    return repr(x)


_FLOAT = re.compile(r"-?\d+(?:\.\d+(?:[eE][+-]?\d+)?|[eE][+-]?\d+)")


def _is_float_literal(text: str) -> bool:
    return _FLOAT.fullmatch(text) is not None


def load_template(root: Path) -> list[StepTemplate]:
    """Read the template's steps (first rank folder of each ``stepN``)."""
    steps = sorted((p for p in root.iterdir() if re.fullmatch(r"step\d+", p.name)),
                   key=lambda p: int(p.name[4:]))
    out: list[StepTemplate] = []
    for sdir in steps:
        rdir = sorted(p for p in sdir.iterdir() if p.is_dir())[0]
        text = (rdir / "dump.json").read_text()
        chunks: list[str] = []
        values: list[float] = []
        pos: list[int] = []
        last = 0
        for m in _STAT.finditer(text):
            lit = m.group(2).strip()
            if not _is_float_literal(lit):
                continue
            chunks.append(text[last:m.start(2)])
            values.append(float(lit))
            pos.append(m.start(2))
            last = m.end(2)
        chunks.append(text[last:])
        nodes: dict[str, tuple[int, int]] = {}
        starts = [(m.group(1), m.start()) for m in _NODE.finditer(text)]
        for i, (name, start) in enumerate(starts):
            end = starts[i + 1][1] if i + 1 < len(starts) else len(text)
            o = _OUTPUT.search(text, start, end)
            nodes[name] = (start, o.start() if o else -1)
        out.append(StepTemplate(chunks, values, pos, nodes, rdir / "construct.json", rdir / "stack.json"))
    if not out:
        raise SystemExit(f"{root}: no stepN folders")
    return out


def factor(step: int, rank: int) -> float:
    """Deterministic per-(step, rank) scale, within ±0.1 % of 1."""
    h = (step * 1_000_003 + rank * 7919 + 12345) % 2001
    return 1.0 + (h - 1000) * 1e-6


def _link(src: Path, dst: Path) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copyfile(src, dst)


def generate(out: Path, *, ranks: int, steps: int, template: Path | None = None,
             nan_at: tuple[int, int, str] | None = None, diverge_at: tuple[int, int, str] | None = None,
             trees: tuple[str, ...] = ("baseline", "nan", "diverge"), quiet: bool = False) -> dict:
    """Write ``baseline/``, ``nan/`` and ``diverge/`` (or some of them) below *out*; return the manifest."""
    t0 = time.perf_counter()
    template = template or default_template()
    tpl = load_template(template)
    nan_at = nan_at or (min(2, steps - 1), (3 * ranks) // 4, DEFAULT_NAN_NODE)
    diverge_at = diverge_at or (min(1, steps - 1), max(ranks // 4, 0) + (1 if ranks > 1 else 0), DEFAULT_DIVERGE_NODE)
    diverge_at = (diverge_at[0], min(diverge_at[1], ranks - 1), diverge_at[2])
    if out.exists():
        shutil.rmtree(out)
    shared = out / "_shared"
    for k, t in enumerate(tpl):
        d = shared / f"template_step{k}"
        d.mkdir(parents=True)
        shutil.copyfile(t.construct, d / "construct.json")
        shutil.copyfile(t.stack, d / "stack.json")
    total = 0
    n_files = 0
    for tree in ("baseline", "nan", "diverge"):
        if tree not in trees:
            continue
        for s in range(steps):
            k = s % len(tpl)
            t = tpl[k]
            for r in range(ranks):
                rdir = out / tree / f"step{s}" / f"rank{r}"
                rdir.mkdir(parents=True)
                for side in ("construct.json", "stack.json"):
                    _link(shared / f"template_step{k}" / side, rdir / side)
                fault = nan_at if tree == "nan" else diverge_at if tree == "diverge" else None
                if fault is not None and (s, r) == fault[:2]:
                    text = t.render(factor(s, r), from_pos=t.fault_pos(fault[2]), mode=tree)
                    (rdir / "dump.json").write_text(text)
                elif tree == "baseline" or "baseline" not in trees:
                    (rdir / "dump.json").write_text(t.render(factor(s, r)))
                else:
                    _link(out / "baseline" / f"step{s}" / f"rank{r}" / "dump.json", rdir / "dump.json")
                if tree == trees[0]:
                    total += sum((rdir / f).stat().st_size for f in ("dump.json", "construct.json", "stack.json"))
                    n_files += 3
        if not quiet:
            print(f"  {tree}: {ranks} ranks × {steps} steps written ({time.perf_counter() - t0:.1f} s)")
    manifest = {
        "template": str(template), "ranks": ranks, "steps": steps,
        "bytes_per_tree": total, "files_per_tree": n_files,
        "nan": {"step": nan_at[0], "rank": nan_at[1], "node": nan_at[2]},
        "divergence": {"step": diverge_at[0], "rank": diverge_at[1], "node": diverge_at[2]},
        "seconds": round(time.perf_counter() - t0, 2),
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2))
    return manifest


def _renamer(k: int):
    """Node name of copy *k* of a template node: API call counters moved on, module paths under ``copy{k}``."""
    def rename(node: str) -> str:
        if not k:
            return node
        parts = node.split(".")
        if parts[0] in ("Module", "Cell") and len(parts) > 2:
            return ".".join([parts[0], f"copy{k}", *parts[1:]])
        if len(parts) >= 3 and parts[-2].isdigit():
            parts[-2] = str(int(parts[-2]) + 100_000 * k)
        return ".".join(parts)
    return rename


def generate_large(out: Path, size: int, *, template: Path | None = None) -> dict:
    """Write ``out/step0/rank0/{dump,construct,stack}.json``: one dump.json of about *size* bytes.

    The template's first dump.json (msprobe's own ``indent=1`` text: tokens, nulls, layout) is
    repeated record by record; copy k renames its nodes (:func:`_renamer`) and construct.json maps
    them to the renamed parents, so the file reads like one long run of a deeper model.
    Deterministic; an existing file of the same size is reused.
    """
    template = template or default_template()
    sdir = sorted(p for p in template.iterdir() if re.fullmatch(r"step\d+", p.name))[0]
    rdir = sorted(p for p in sdir.iterdir() if p.is_dir())[0]
    text = (rdir / "dump.json").read_text()
    head, _, rest = text.partition('"data": {\n')
    body = rest.rstrip()[:-1].rstrip()[:-1].rstrip()  # the records: without data's and the document's "}"
    construct = json.loads((rdir / "construct.json").read_text())
    dst = out / "step0" / "rank0"
    dump = dst / "dump.json"
    n_nodes = len(_NODE.findall(body))
    copies = max(1, -(-size // len(body)))
    manifest = {"template": str(rdir), "copies": copies, "nodes": n_nodes * copies}
    if dump.exists() and (out / "manifest.json").exists() and json.loads(
            (out / "manifest.json").read_text()).get("copies") == copies:
        return json.loads((out / "manifest.json").read_text())
    dst.mkdir(parents=True, exist_ok=True)
    big_construct, _ = _write_copies(dump, head, body, construct, None, copies)
    (dst / "construct.json").write_text(json.dumps(big_construct, indent=1))
    shutil.copyfile(rdir / "stack.json", dst / "stack.json")
    manifest["bytes"] = dump.stat().st_size
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2))
    return manifest


def _write_copies(dump: Path, head: str, body: str, construct: dict, stack: dict | None,
                  copies: int) -> tuple[dict, dict]:
    """Write *copies* copies of a dump.json's records (renamed, :func:`_renamer`) to *dump*.

    Returns the construct.json and stack.json tables of the copies (stack: empty when *stack* is None).
    """
    big_construct: dict = {}
    big_stack: dict = {}
    with dump.open("w") as fh:
        fh.write(head + '"data": {\n')
        for k in range(copies):
            rename = _renamer(k)
            if k:
                fh.write(",\n")
            fh.write(_NODE.sub(lambda m, r=rename: f'  "{r(m.group(1))}": {{', body))
            for node, parent in construct.items():
                big_construct[rename(node)] = ([rename(parent[0]), parent[1]] if isinstance(parent, list)
                                               else rename(parent) if isinstance(parent, str) else parent)
            if stack and "0" in stack:  # the grouped format: id -> [[nodes], [frames]]
                for sid, (nodes, frames) in stack.items():
                    big_stack[f"{k * len(stack) + int(sid)}"] = [[rename(n) for n in nodes], frames]
            elif stack:
                big_stack.update({rename(n): frames for n, frames in stack.items()})
        fh.write("\n }\n}")
    return big_construct, big_stack


def deepen(template: Path, copies: int, out: Path) -> Path:
    """A template dump root whose every step is *copies* copies of *template*'s (a deeper model).

    Each ``stepN`` folder of the first rank of *template* becomes ``out/stepN/rank0/`` with its
    dump.json records repeated; copy k renames its nodes (:func:`_renamer`: API call counters moved
    on, module paths under ``copy{k}``) in dump.json, construct.json and stack.json, so the result
    reads like one run of a model *copies* times as deep, with msprobe's own layout and tokens.
    Deterministic; an existing tree made with the same arguments is reused.
    """
    stamp = out / "deepened.json"
    want = {"template": str(template), "copies": copies}
    if stamp.exists() and json.loads(stamp.read_text()) == want:
        return out
    if out.exists():
        shutil.rmtree(out)
    steps = sorted((p for p in template.iterdir() if re.fullmatch(r"step\d+", p.name)), key=lambda p: int(p.name[4:]))
    for sdir in steps:
        rdir = sorted(p for p in sdir.iterdir() if p.is_dir())[0]
        text = (rdir / "dump.json").read_text()
        head, _, rest = text.partition('"data": {\n')
        body = rest.rstrip()[:-1].rstrip()[:-1].rstrip()
        construct = json.loads((rdir / "construct.json").read_text())
        stack = json.loads((rdir / "stack.json").read_text())
        dst = out / sdir.name / "rank0"
        dst.mkdir(parents=True)
        big_construct, big_stack = _write_copies(dst / "dump.json", head, body, construct, stack, copies)
        (dst / "construct.json").write_text(json.dumps(big_construct, indent=1))
        (dst / "stack.json").write_text(json.dumps(big_stack, indent=1))
    stamp.write_text(json.dumps(want))
    return out


def main(argv: list[str] | None = None) -> int:
    """Command line entry point."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--template", type=Path, help="a real msprobe statistics dump root (stepN/rank*/)")
    args = ap.parse_args(argv)
    m = generate(args.out, ranks=args.ranks, steps=args.steps, template=args.template)
    print(json.dumps(m, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
