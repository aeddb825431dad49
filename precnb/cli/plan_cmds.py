"""``precnb plan``: the msprobe config.json that confirms the first finding (or closes its gap) next run.

Without ``-o`` the config is printed on stdout and what it selects on stderr; with ``-o`` the
config is written (atomically; an existing file is never replaced unless it is a plan precnb
wrote and ``--overwrite`` is given; never inside an input) and the summary printed. ``--json``
prints one object: the finding, the config, what it selects and the size estimate.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

__all__ = ["MARKER_KEY", "register", "write_config"]

MARKER_KEY = "precnb_output"
"""Top-level key marking a config precnb wrote (msprobe ignores keys it does not know)."""
MARKER = "precnb dump plan"


def _inside(path: Path, root: Path) -> bool:
    try:
        path.relative_to(root)
        return True
    except ValueError:
        return False


def write_config(config: dict[str, Any], path: str | os.PathLike[str], *, inputs: list[str],
                 overwrite: bool = False) -> Path:
    """Write *config* as JSON to *path* atomically; refuse what precnb must not replace.

    Raises
    ------
    precnb.errors.PrecnbError
        When *path* is inside (or is) an input, exists and is not a precnb plan, exists and
        *overwrite* is false, or its folder does not exist.
    """
    from precnb.errors import PrecnbError

    target = Path(path)
    real = Path(os.path.realpath(target))
    for inp in inputs:
        root = Path(os.path.realpath(inp))
        if _inside(real, root) or _inside(root, real):
            raise PrecnbError(f"refusing to write {target}: it is inside the input {inp} (dumps are read-only)")
    if target.is_symlink():
        raise PrecnbError(f"refusing to write {target}: it is a symbolic link")
    if target.exists():
        if not overwrite:
            raise PrecnbError(f"refusing to write {target}: it exists (pass --overwrite to replace a plan precnb "
                              "wrote)")
        try:
            old = json.loads(target.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            old = None
        if not (isinstance(old, dict) and old.get(MARKER_KEY) == MARKER):
            raise PrecnbError(f"refusing to replace {target}: it is not a dump plan precnb wrote")
    folder = target.parent if str(target.parent) else Path(".")
    if not folder.is_dir():
        raise PrecnbError(f"cannot write {target}: folder {folder} does not exist")
    body = json.dumps({**config, MARKER_KEY: MARKER}, indent=4, allow_nan=False) + "\n"
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".partial", dir=folder)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(body)
            fh.flush()
            os.fsync(fh.fileno())
        if overwrite:
            os.replace(tmp, target)
        else:
            os.link(tmp, target)  # fails if something appeared meanwhile: never replaced
            os.unlink(tmp)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return target


def safe_text(text: str) -> str:
    r"""*text* with control characters (terminal escapes) shown as ``\xNN``."""
    return "".join(c if c == "\n" or (c.isprintable() and c != "\x1b") else f"\\x{ord(c):02x}" for c in str(text))


def _summary_lines(f: Any, plan: dict[str, Any]) -> list[str]:
    from precnb.analysis.registry import title

    lines = [f"# {title(f.kind)}: {f.reason}",
             f"# plan: {plan['summary']}"]
    sel = plan["selects"]
    shown = ", ".join(sel["nodes"][:8]) + (" ..." if sel["node_count"] > 8 else "")
    if shown:
        lines.append(f"# selects {sel['node_count']} recorded node(s): {shown}")
    lines.append(f"# estimated dump size: {plan['estimate']} ({plan['estimated_bytes']} bytes of tensors)")
    if plan.get("register_custom_api"):
        lines.append(f"# add to the training script: {plan['register_custom_api']}")
    for n in plan.get("notes", []):
        lines.append(f"# note: {n}")
    lines.append("# use: PrecisionDebugger(config_path=<this file>)")
    return lines


def _cmd_plan(args: argparse.Namespace) -> int:
    from precnb.analysis.plan import plan_dump
    from precnb.cli.analysis_cmds import run_triage

    kinds = [args.kind] if args.kind else None
    triage = run_triage(args, args.run, args.baseline, **({"kinds": kinds} if kinds else {}))
    found = triage.found
    if not found:
        msg = "nothing found: no finding to confirm (" + "; ".join(f.reason for f in triage.findings) + ")"
        if args.json:
            sys.stdout.write(json.dumps({"plan": None, "reason": msg}, indent=2) + "\n")
        else:
            sys.stdout.write(safe_text(msg) + "\n")
        return 0
    f = found[0]
    plan = plan_dump(f, triage.target, dump_path=args.dump_path, task=args.task)
    if plan is None:
        sys.stdout.write(safe_text(f"no dump plan for this finding ({f.kind}: {f.reason})") + "\n")
        return 0
    written = None
    if args.output:
        inputs = [p for p in (args.run, args.baseline) if isinstance(p, str)]
        written = str(write_config(plan["config"], args.output, inputs=inputs, overwrite=args.overwrite))
    if args.json:
        from precnb.analysis.findings import to_json

        out = {"finding": {k: f.to_dict()[k] for k in ("kind", "step", "rank", "node", "tensor", "module", "reason")},
               **plan, "output": written}
        sys.stdout.write(to_json(out, indent=2) + "\n")
        return 0
    lines = _summary_lines(f, plan)
    if written:
        sys.stdout.write("\n".join(safe_text(x) for x in lines) + f"\nwrote {safe_text(written)}\n")
    else:
        sys.stderr.write("\n".join(safe_text(x) for x in lines) + "\n")
        sys.stdout.write(json.dumps(plan["config"], indent=4) + "\n")
    return 0


def register(sub: Any, add_load_options: Any) -> None:
    """Add ``plan`` to the sub-commands."""
    from precnb.analysis.plan import DEFAULT_DUMP_PATH

    p = sub.add_parser("plan", help="the msprobe config.json that confirms the first finding (or closes its gap)")
    p.add_argument("run", help="the run that shows the finding")
    p.add_argument("--baseline", help="a baseline run (plans the first divergence against it)")
    p.add_argument("-o", "--output", help="write the config here (default: print it)")
    p.add_argument("--overwrite", action="store_true", help="replace a plan precnb wrote before")
    p.add_argument("--json", action="store_true", help="print one JSON object (finding, config, selection, size)")
    p.add_argument("--dump-path", default=DEFAULT_DUMP_PATH,
                   help="dump_path written into the config (default %(default)s)")
    p.add_argument("--task", choices=["tensor", "statistics"], default="tensor",
                   help="tensor (default: save the selected tensors) or statistics")
    p.add_argument("--kind", help="plan for the first finding of this kind (e.g. nan_origin, anomaly)")
    add_load_options(p)
    p.set_defaults(func=_cmd_plan)
