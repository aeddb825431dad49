"""Peak memory of reading one large dump.json in every layout a tool writes (issue #30 item 2).

One real-structured dump.json (``generate.generate_large``: the real S1 dump's records, with their
``-Infinity`` causal-mask tokens and ``null`` statistics, repeated until the file reaches the size
asked) is written in four layouts, the same records each time:

``indented``
    msprobe's own ``indent=1`` text.
``one line``
    the same text with every line break and indentation removed (what ``json.dump`` without
    ``indent`` writes, the literals kept).
``records shuffled``
    ``indent=1``, the records of each copy of the template in a shuffled (fixed) order.
``a record per line``
    every record on one line (about 1-10 kB each), its closing brace included: no line of
    msprobe's layout.

Each is read in a fresh interpreter (``benchmarks/bench_large.py``'s child: ``precnb.open_run`` with
orjson, without it, and ``json.loads`` of the file as the floor), alternating; the child reports
its own peak RSS (``ru_maxrss``). Medians.

    python benchmarks/bench_memory.py --size 1.5e8 --reps 3 --out /tmp/precnb-memory
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_large  # noqa: E402
import generate  # noqa: E402
import run  # noqa: E402

_BREAK = re.compile(rb"\n[ \t]*")
LAYOUTS = ("indented", "one line", "records shuffled", "a record per line")
MODES = ("precnb", "precnb_no_orjson", "floor")


def _sides(src: Path, dst: Path) -> None:
    for name in ("construct.json", "stack.json"):
        shutil.copyfile(src / name, dst / name)


def one_line(src: Path, dst: Path) -> None:
    """*src*'s text without line breaks and indentation (strings never hold a raw line break)."""
    with src.open("rb") as fi, dst.open("wb") as fo:
        carry = b""
        while True:
            block = fi.read(1 << 20)
            if not block:
                fo.write(_BREAK.sub(b"", carry))
                return
            text = carry + block
            cut = text.rfind(b"\n")  # keep a line break and its indentation whole across blocks
            carry, text = text[cut:], text[:cut]
            fo.write(_BREAK.sub(b"", text))


def record_per_line(src: Path, dst: Path) -> None:
    """Each record of ``data`` (msprobe's indentation 2) on a line of its own, its closing brace included."""
    with src.open() as fi, dst.open("w") as fo:
        first = True
        for line in fi:
            body = line.rstrip("\n")
            stripped = body.lstrip(" ")
            indent = len(body) - len(stripped)
            if indent >= 3 or (indent == 2 and stripped.startswith("}")):
                fo.write(" " + stripped)
            else:
                fo.write(("" if first else "\n") + body)
                first = False


def shuffled(template: Path, size: int, dst: Path) -> None:
    """:func:`generate.generate_large` with the records of each copy in a shuffled (fixed) order."""
    sdir = sorted(p for p in template.iterdir() if re.fullmatch(r"step\d+", p.name))[0]
    rdir = sorted(p for p in sdir.iterdir() if p.is_dir())[0]
    text = (rdir / "dump.json").read_text()
    head, _, rest = text.partition('"data": {\n')
    body = rest.rstrip()[:-1].rstrip()[:-1].rstrip()
    starts = [m.start() for m in generate._NODE.finditer(body)]
    records = [body[a:b].rstrip().rstrip(",") for a, b in zip(starts, [*starts[1:], len(body)], strict=True)]
    random.Random(0).shuffle(records)
    body = ",\n".join(records)
    construct = json.loads((rdir / "construct.json").read_text())
    copies = max(1, -(-size // len(body)))
    generate._write_copies(dst / "dump.json", head, body, construct, None, copies)


def build(out: Path, size: int) -> dict[str, Path]:
    base = out / "indented"
    generate.generate_large(base, size)
    src = base / "step0" / "rank0"
    folders = {"indented": base}
    for name, make in (("one line", lambda d: one_line(src / "dump.json", d / "dump.json")),
                       ("a record per line", lambda d: record_per_line(src / "dump.json", d / "dump.json")),
                       ("records shuffled", lambda d: shuffled(generate.default_template(), size, d))):
        folder = out / name.replace(" ", "_")
        d = folder / "step0" / "rank0"
        stamp = folder / "made.json"
        want = {"from": (src / "dump.json").stat().st_size, "size": size}
        if not (stamp.exists() and json.loads(stamp.read_text()) == want):
            if folder.exists():
                shutil.rmtree(folder)
            d.mkdir(parents=True)
            make(d)
            _sides(src, d)
            stamp.write_text(json.dumps(want))
        folders[name] = folder
    return folders


def write_markdown(path: Path, res: dict, argv: list[str]) -> None:
    mach = res["machine"]
    lines = [
        "# Peak memory of one large dump.json in every layout (benchmarks/bench_memory.py)", "",
        f"Written on {res['date']} by `python benchmarks/bench_memory.py {' '.join(argv)}` in {res['minutes']:.1f} "
        f"min: {res['reps']} repetitions, one fresh interpreter per run, runs alternating; **medians**. Template "
        f"`{res['template']}` ({res['manifest']['nodes']} node records, `-Infinity` tokens kept).", "",
        f"Machine: {mach['cpu']}, {mach['cores']} cores shared with other jobs (load average at start "
        f"{', '.join(f'{x:.1f}' for x in mach['load_average_at_start'] or ())}, at the end "
        f"{', '.join(f'{x:.1f}' for x in res['load_end'])}), RAM {mach['ram_gib']} GiB, {mach['os']}, Python "
        f"{mach['python']}, orjson {mach['orjson']}.", "",
        "| layout | file | precnb.open_run peak RSS / file | time | without orjson: RSS / file | time "
        "| json.loads: RSS / file | time | open_run vs json.loads (time) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for layout, row in res["layouts"].items():
        m = row["medians"]
        cells = [f"{m[k]['rss'] / row['bytes']:.2f}× ({m[k]['rss'] / 1e9:.2f} GB) | {m[k]['seconds']:.2f} s"
                 if k in m else "– | –" for k in MODES]
        speed = (f"{m['floor']['seconds'] / m['precnb']['seconds']:.2f}×" if "floor" in m and "precnb" in m
                 else "–")
        lines.append(f"| {layout} | {row['bytes'] / 1e6:.0f} MB | " + " | ".join(cells) + f" | {speed} |")
    worst = max(row["medians"][k]["rss"] / row["bytes"] for row in res["layouts"].values()
                for k in ("precnb", "precnb_no_orjson") if k in row["medians"])
    lines += ["", f"Target: peak RSS ≤ 3× the file in every layout: **{'met' if worst <= 3 else 'NOT met'}** "
              f"(worst {worst:.2f}×).", ""]
    path.write_text("\n".join(lines))
    path.with_suffix(".json").write_text(json.dumps(res, indent=1))


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", type=float, default=1.5e8, help="bytes of the indented dump.json (default 1.5e8)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out", type=Path, default=Path("/tmp/precnb-memory"))
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--markdown", type=Path, help="write the results here (and the JSON beside it)")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _bytecode import compile_precnb

    compile_precnb()  # an installed package's bytecode, not compiled inside what is timed (see _bytecode)
    t0 = time.time()
    mach = run.machine()
    folders = build(args.out, int(args.size))
    modes = args.modes.split(",")
    jobs = [(layout, m) for layout in LAYOUTS for m in modes]
    runs: dict[tuple[str, str], list[dict]] = {j: [] for j in jobs}
    for i in range(args.reps):
        for layout, m in jobs if i % 2 == 0 else list(reversed(jobs)):
            folder = folders[layout]
            dump = folder / "step0" / "rank0" / "dump.json"
            r = bench_large.run_child(m, folder, dump)
            runs[(layout, m)].append(r)
            print(f"rep {i} {layout:18s} {m:17s} {r['seconds']:6.2f} s  peak RSS {r['rss'] / dump.stat().st_size:.2f}x "
                  "the file", flush=True)
    layouts = {}
    for layout in LAYOUTS:
        size = (folders[layout] / "step0" / "rank0" / "dump.json").stat().st_size
        med = {m: {"seconds": statistics.median(r["seconds"] for r in runs[(layout, m)]),
                   "rss": statistics.median(r["rss"] for r in runs[(layout, m)])} for m in modes}
        layouts[layout] = {"bytes": size, "medians": med}
    manifest = json.loads((folders["indented"] / "manifest.json").read_text())
    res = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "machine": mach, "reps": args.reps,
           "template": manifest["template"], "manifest": manifest, "layouts": layouts,
           "minutes": (time.time() - t0) / 60, "load_end": os.getloadavg()}
    print(json.dumps(res["layouts"], indent=1))
    if args.markdown:
        write_markdown(args.markdown, res, argv)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
