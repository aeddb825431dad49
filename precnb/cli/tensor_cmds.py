"""Sub-commands over saved tensors (``task: tensor`` dumps): ``metrics`` and ``repro``.

``precnb metrics BASELINE TARGET`` prints msprobe compare's tensor metrics for every tensor pair
(``--json``: one strict JSON object; ``--csv``: a table; ``-o FILE`` writes it to a new file).
``precnb repro RUN NODE -o repro.py`` writes a standalone script that reruns one dumped op.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from precnb.cli import _term as term
from precnb.cli._args import MAX_INDEX, int_set, integer

__all__ = ["register", "write_output"]

_TEXT_COLUMNS = ("cosine", "max_abs_err", "max_rel_err", "one_thousandth_err_ratio", "rel_l2_err", "ulp_err")


def write_output(args: argparse.Namespace, text: str, kind: str, content: str = "text") -> Path:
    """Write a command's output through the project's write rules (:mod:`precnb._write`).

    *content* is what the text is: ``"json"`` (it gets a ``precnb_output`` key; the file must be
    named ``*.json``), ``"text"`` (a comment line, after a script's shebang; not ``*.json`` /
    ``*.html`` / ``*.ipynb``) or ``"csv"`` (a table: marked by a sidecar ``.NAME.precnb_output``,
    since any line inside would be read by ``pandas.read_csv`` as its header or a row). So
    ``--overwrite`` can later recognise and replace it; nothing else is ever replaced, and
    nothing is written inside an input.
    """
    from precnb._marks import marker, text_marker
    from precnb._write import check_output, write_text
    from precnb.cli._common import command_inputs

    out = Path(args.output)
    overwrite = bool(getattr(args, "overwrite", False))
    check_output(out, inputs=command_inputs(args), overwrite=overwrite, content="text" if content == "csv" else content)
    if content == "json":
        doc = json.loads(text)
        doc = {"precnb_output": marker(kind), **doc} if isinstance(doc, dict) else doc
        text = json.dumps(doc, indent=2, allow_nan=False) + "\n"
    elif content == "csv":
        return write_text(out, text, inputs=command_inputs(args), overwrite=overwrite, sidecar=kind)
    elif text.startswith("#!"):  # a script: the marker goes after its shebang line
        head, _, rest = text.partition("\n")
        text = head + "\n" + text_marker(kind) + "\n" + rest
    else:
        text = text_marker(kind) + "\n" + text
    return write_text(out, text, inputs=command_inputs(args), overwrite=overwrite)


def _clean(v: Any) -> Any:
    import numpy as np

    if isinstance(v, np.generic):
        v = v.item()
    if isinstance(v, float) and not math.isfinite(v):
        return None if math.isnan(v) else ("inf" if v > 0 else "-inf")
    return v


def _rows(frame: Any) -> list[dict[str, Any]]:
    return [{k: _clean(v) for k, v in rec.items()} for rec in frame.to_dict(orient="records")]


def _cmd_metrics(args: argparse.Namespace) -> int:
    from precnb.cli._common import UsageError, open_checked, parse_int_set
    from precnb.tensor_compare import tensor_metrics, to_frame

    if args.json and args.csv:
        raise UsageError("give --json or --csv, not both")
    content = "json" if args.json else ("csv" if args.csv else "text")
    if args.output:  # a bad -o is refused before the tensors are read
        from precnb._write import check_output
        from precnb.cli._common import command_inputs

        check_output(args.output, inputs=command_inputs(args), overwrite=bool(args.overwrite),
                     content="text" if content == "csv" else content)
    base = open_checked(args.baseline, args)
    target = open_checked(args.target, args)
    tensors: Any = args.tensors
    if tensors and "," in tensors and not any(c in tensors for c in "^$*+?()[]{}|\\"):
        tensors = [x.strip() for x in tensors.split(",") if x.strip()]
    try:
        m = tensor_metrics(base, target, tensors=tensors, steps=parse_int_set(args.steps, "steps"),
                           ranks=parse_int_set(args.ranks, "ranks"), step_offset=args.step_offset,
                           workers=args.workers if isinstance(args.workers, int) else None)
    except (KeyError, ValueError) as exc:
        raise UsageError(str(exc).strip("'\"")) from None
    frame = to_frame(m)
    from precnb.pipeline.tensors import unreadable_entries

    args.load_failures = [*(getattr(args, "load_failures", None) or []), *unreadable_entries(m)]  # exit 1
    if args.json:
        counts = frame["status"].value_counts().to_dict() if len(frame) else {}
        text = json.dumps({"schema": "precnb.tensor_metrics/1", "baseline": args.baseline, "target": args.target,
                           "steps": [int(s) for s in m["step"].values], "ranks": [int(r) for r in m["rank"].values],
                           "pairs": len(frame), "status_counts": {str(k): int(v) for k, v in counts.items()},
                           "rows": _rows(frame)}, indent=2, allow_nan=False) + "\n"
    elif args.csv:
        text = frame.to_csv(index=False, na_rep="")
    else:
        text = _text(frame, args.top)
    if args.output:
        out = write_output(args, text, "tensor-metrics", content)
        term.out(f"wrote {out} ({len(frame)} tensor pair(s))\n")
    else:
        term.out(text)
    return 0


def _text(frame: Any, top: int) -> str:
    lines = [f"{len(frame)} tensor pair(s); status: "
             + ", ".join(f"{k}={v}" for k, v in frame["status"].value_counts().items())]
    ok = frame[frame["status"].isin(["ok", "zero_d"])]
    worst = ok.sort_values(["cosine", "rel_l2_err"], ascending=[True, False], na_position="last").head(top)
    if len(worst):
        lines.append(f"lowest cosine first (top {len(worst)}):")
        lines.append(f"  {'step':>4} {'rank':>4}  " + "  ".join(f"{c:>12}" for c in _TEXT_COLUMNS) + "  tensor")
        for _, row in worst.iterrows():
            vals = "  ".join(f"{row[c]:>12.6g}" for c in _TEXT_COLUMNS)
            name = term.escape_controls(str(row["tensor"]))
            lines.append(f"  {int(row['step']):>4} {int(row['rank']):>4}  {vals}  {name}")
    bad = frame[~frame["status"].isin(["ok", "zero_d", "no_data"])]
    for _, row in bad.head(top).iterrows():
        lines.append(f"  {row['status']}: step {int(row['step'])} rank {int(row['rank'])} "
                     f"{term.escape_controls(str(row['tensor']))} {term.escape_controls(str(row['message']))}")
    return "\n".join(lines) + "\n"


def _cmd_repro(args: argparse.Namespace) -> int:
    from precnb.cli._common import open_checked
    from precnb.repro import repro_script

    if args.output:  # a bad -o is refused before the dump is read
        from precnb._write import check_output
        from precnb.cli._common import command_inputs

        check_output(args.output, inputs=command_inputs(args), overwrite=bool(args.overwrite), content="text")
    if args.replicas and args.rank is None:
        from precnb.cli._common import UsageError

        raise UsageError("--replicas needs --rank (the departing rank whose inputs the op is re-run on)")
    run = open_checked(args.run, args, steps=None if args.step is None else [args.step], use_steps_option=False)
    text = repro_script(run, args.node, step=args.step, rank=args.rank, replicas=args.replicas or ())
    if not args.output:
        term.out(text)
        return 0
    out = write_output(args, text, "repro-script")
    also = (f" and says whether it agrees with rank {args.rank}'s dumped output or with rank(s) "
            f"{', '.join(map(str, args.replicas))}'s" if args.replicas else "")
    term.out(f"wrote {out}: python {out} [--device cuda] reruns {args.node}{also}\n")
    return 0


def register(sub: Any, add_load_options: Callable[[argparse.ArgumentParser], None]) -> None:
    """Add ``metrics`` and ``repro`` to *sub*."""
    p = sub.add_parser("metrics", help="msprobe compare's tensor metrics for every saved tensor pair "
                                       "(task=tensor dumps)")
    p.add_argument("baseline")
    p.add_argument("target")
    p.add_argument("--tensors", help="tensor labels (comma list), a module path (blocks.1) or node, or a regex")
    p.add_argument("--step-offset", type=integer(-MAX_INDEX, MAX_INDEX, auto=True), default=None,
                   help="target step = baseline step + OFFSET, or 'auto'; default: 0 when both runs hold the "
                        "same steps, else auto")
    p.add_argument("--top", type=integer(1, 1_000_000), default=20, help="rows shown without --json/--csv (default 20)")
    p.add_argument("--json", action="store_true", help="print one strict JSON object (NaN as null)")
    p.add_argument("--csv", action="store_true", help="print a CSV table, one row per (step, rank, tensor)")
    p.add_argument("-o", "--output", help="write to this file instead of stdout")
    p.add_argument("--overwrite", action="store_true", help="replace an existing precnb output of this command")
    add_load_options(p)
    p.set_defaults(func=_cmd_metrics)

    p = sub.add_parser("repro", help="write a standalone script that reruns one dumped op and checks its outputs")
    p.add_argument("run", help="a tensor-mode dump (task=tensor)")
    p.add_argument("node", help="API node, e.g. Functional.linear.0.forward (or one of its tensor labels)")
    p.add_argument("--step", type=integer(0, MAX_INDEX), help="step of the record (default: the first)")
    p.add_argument("--rank", type=integer(0, MAX_INDEX), help="rank of the record (default: the first)")
    p.add_argument("--replicas", type=int_set("rank"), metavar="R[,R...]",
                   help="ranks holding replicas of the same call (a replica departure's other ranks): the script "
                        "also checks their inputs are bit-identical and says whose dumped output the recomputation "
                        "agrees with (the other side computed it wrongly)")
    p.add_argument("-o", "--output", help="script to write (default: print it)")
    p.add_argument("--overwrite", action="store_true", help="replace a repro script precnb wrote")
    add_load_options(p)
    p.set_defaults(func=_cmd_repro)
