"""Command-line start-up: the parser alone, as a ratio to a bare interpreter; and precnb's deferral of ``dask.array``.

``precnb --version``, ``--help`` and ``COMMAND --help`` import neither xarray nor pandas (issue #50: the
diagnosis registry, the readers' names and the options' defaults are read without them): their time is given as
a ratio to ``python -c pass``, alternating in fresh processes.

The deferral of ``dask.array`` (``precnb/io/_lazy_dask.py``):

xarray imports ``dask.array`` the first time it wraps an array, only to learn that a numpy array
is not a dask one; precnb answers that question without the import until dask.array is loaded.
This measures what that saves on a real command (``precnb info`` of a bundled sample, interpreter
start included): the two sides alternate, in fresh processes; medians.

Usage::

    python benchmarks/bench_startup.py --reps 9

writes ``benchmarks/RESULTS_startup.md`` and ``.json``.

The installed size (issue #53), ``--sizes``: fresh venvs from the wheel ``make dist`` built (``dist/``, or
``--wheel``), one with ``pip install <wheel>`` (the core install), one with ``'<wheel>[notebook]'``, and an empty one
for the floor (pip itself); ``du -s`` of each venv's site-packages, as pip leaves it (bytecode compiled). pip
resolves the dependencies from PyPI (or its cache). This replaces the "Installed size" section of the results only::

    make dist && python benchmarks/bench_startup.py --sizes
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SIZES = "## Installed size"  # the heading of the section --sizes writes (a timing run keeps it)


def one(cmd: list[str], env: dict[str, str]) -> float:
    t = time.perf_counter()
    subprocess.run(cmd, env=env, cwd=ROOT, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - t


def _du(path: Path) -> int:
    """Bytes on disk below ``path`` (``du -s``)."""
    return int(subprocess.run(["du", "-s", "--block-size=1", str(path)], check=True, capture_output=True,
                              text=True).stdout.split()[0])


def _venv(where: Path, spec: str | None) -> dict:
    """A fresh venv at ``where`` with ``pip install spec`` (None: nothing): its site-packages' size and contents."""
    subprocess.run([sys.executable, "-m", "venv", str(where)], check=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "PRECNB_", "PIP_REQUIRE"))}
    if spec is not None:
        subprocess.run([str(where / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                        spec], check=True, env=env)
    [site] = (where / "lib").glob("python*/site-packages")
    children = sorted(str(p) for p in site.iterdir())
    du = subprocess.run(["du", "-s", "--block-size=1", *children], check=True, capture_output=True, text=True).stdout
    sizes = {Path(path).name: int(size) for size, path in (ln.split("\t", 1) for ln in du.splitlines())}
    largest = dict(sorted(sizes.items(), key=lambda kv: -kv[1])[:6])
    samples = site / "precnb" / "data_samples"
    return {"site_packages_bytes": _du(site), "distributions": len(list(site.glob("*.dist-info"))),
            "precnb_bytes": sizes.get("precnb", 0), "precnb_samples_bytes": _du(samples) if samples.is_dir() else 0,
            "largest": largest}


def installed_sizes(wheel: Path) -> dict:
    """The core install's and ``[notebook]``'s site-packages, beside an empty venv's (pip alone)."""
    with tempfile.TemporaryDirectory(prefix="precnb_sizes_") as tmp:
        rows = {"empty venv": _venv(Path(tmp) / "empty", None),
                "core": _venv(Path(tmp) / "core", str(wheel)),
                "[notebook]": _venv(Path(tmp) / "notebook", f"{wheel}[notebook]")}
        pip = subprocess.run([str(Path(tmp) / "empty" / "bin" / "python"), "-m", "pip", "--version"],
                             capture_output=True, text=True, check=True).stdout.split()[1]
    return {"wheel": wheel.name, "wheel_bytes": wheel.stat().st_size, "python": platform.python_version(),
            "pip": pip, "date": time.strftime("%Y-%m-%d"), "installs": rows}


def sizes_section(res: dict) -> list[str]:
    """The markdown of ``--sizes``."""
    mb = 1e6
    floor = res["installs"]["empty venv"]["site_packages_bytes"]
    lines = [SIZES, "",
             f"Written by `benchmarks/bench_startup.py --sizes`: fresh venvs (Python {res['python']}, pip "
             f"{res['pip']}) from `{res['wheel']}` (`make dist`, {res['wheel_bytes'] / mb:.1f} MB); `du -s` of each "
             "venv's site-packages as pip leaves it (bytecode compiled); the dependencies pip resolved on "
             f"{res['date']}.",
             "", "| install | distributions | site-packages | beyond an empty venv | of which precnb |",
             "|---|---:|---:|---:|---:|"]
    labels = {"empty venv": "empty venv (what `python -m venv` installs)", "core": "`pip install precnb-….whl` (core)",
              "[notebook]": "`pip install 'precnb-….whl[notebook]'`"}
    for key, label in labels.items():
        r = res["installs"][key]
        beyond = "—" if key == "empty venv" else f"**{(r['site_packages_bytes'] - floor) / mb:.0f} MB**"
        own = f"{r['precnb_bytes'] / mb:.1f} MB" if r["precnb_bytes"] else "—"
        lines.append(f"| {label} | {r['distributions']} | {r['site_packages_bytes'] / mb:.0f} MB | {beyond} | {own} |")
    lines.append("")
    for key in ("core", "[notebook]"):
        top = ", ".join(f"{name} {size / mb:.0f} MB" for name, size in res["installs"][key]["largest"].items())
        lines.append(f"Largest folders of site-packages, {key}: {top}.")
    core = res["installs"]["core"]
    lines += ["", f"precnb itself is its code, the notebook templates and the bundled samples "
              f"({core['precnb_samples_bytes'] / mb:.1f} MB on disk of its {core['precnb_bytes'] / mb:.1f} MB: many "
              "small files, more on disk than in the wheel's zip)."]
    return lines


def _section(text: str, heading: str) -> list[str] | None:
    """The lines of ``text``'s ``heading`` section (to the next ``## `` heading), or None."""
    lines = text.split("\n")
    if heading not in lines:
        return None
    start = lines.index(heading)
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
    section = lines[start:end]
    while section and section[-1] == "":
        section.pop()
    return section


def _with_section(text: str, heading: str, section: list[str]) -> str:
    """``text`` (markdown) with its ``heading`` section replaced by ``section``, appended when it has none."""
    lines = text.rstrip("\n").split("\n") if text.strip() else []
    if heading in lines:
        start = lines.index(heading)
        end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
        rest = lines[end:]
        lines = lines[:start] + section + (["", *rest] if rest else [])
    else:
        lines += ["", *section] if lines else section
    return "\n".join(lines) + "\n"


def _json(path: Path) -> dict:
    old = json.loads(path.read_text()) if path.is_file() else {}
    return old if isinstance(old, dict) else {"dask_deferral": old}  # the first version wrote the list alone


def main_sizes(args: argparse.Namespace) -> int:
    wheel = args.wheel
    if wheel is None:
        wheels = sorted((ROOT / "dist").glob("precnb-*.whl"), key=lambda p: p.stat().st_mtime)
        if not wheels:
            print("bench_startup --sizes: no wheel in dist/: run `make dist` first (or give --wheel)", file=sys.stderr)
            return 2
        wheel = wheels[-1]
    res = installed_sizes(wheel.resolve())
    lines = sizes_section(res)
    text = args.results.read_text() if args.results.is_file() else ""
    args.results.write_text(_with_section(text, SIZES, lines))
    js = args.results.with_suffix(".json")
    js.write_text(json.dumps({**_json(js), "installed_size": res}, indent=1))
    print("\n".join(lines))
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--results", type=Path, default=ROOT / "benchmarks" / "RESULTS_startup.md")
    ap.add_argument("--sizes", action="store_true",
                    help="measure the installed size of the core install and of [notebook] from the wheel (fresh "
                         "venvs, pip from PyPI) instead of the start-up times; rewrites that section only")
    ap.add_argument("--wheel", type=Path, help="the wheel for --sizes (default: the newest dist/precnb-*.whl)")
    args = ap.parse_args(argv)
    if args.sizes:
        return main_sizes(args)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _bytecode import compile_precnb

    compile_precnb()  # an installed package's bytecode, not compiled inside what is timed (see _bytecode)
    base = {k: v for k, v in os.environ.items() if k != "PRECNB_NO_LAZY_DASK"}
    cmds = {"precnb info data_samples/healthy": [sys.executable, "-m", "precnb", "info", "data_samples/healthy"],
            "precnb nan data_samples/dp_nan": [sys.executable, "-m", "precnb", "nan", "data_samples/dp_nan"]}
    rows = []
    for label, cmd in cmds.items():
        with_t, without_t = [], []
        one(cmd, base)  # warm the page cache
        for i in range(args.reps):
            for side in (("with", "without") if i % 2 == 0 else ("without", "with")):
                if side == "with":
                    with_t.append(one(cmd, base))
                else:
                    without_t.append(one(cmd, {**base, "PRECNB_NO_LAZY_DASK": "1"}))
        w, wo = statistics.median(with_t), statistics.median(without_t)
        rows.append({"command": label, "with_s": w, "without_s": wo, "saved_s": wo - w, "saved_frac": (wo - w) / wo})
    lines = ["# Command-line start-up: the dask.array deferral", "",
             f"Written by `benchmarks/bench_startup.py`; medians of {args.reps} alternating runs per side "
             f"(fresh interpreter each, load average {os.getloadavg()[0]:.1f} on 2 shared cores).", "",
             "| command | with the deferral | without (PRECNB_NO_LAZY_DASK=1) | saved |", "|---|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| `{r['command']}` | {r['with_s']:.2f} s | {r['without_s']:.2f} s | "
                     f"**{r['saved_s']:.2f} s ({100 * r['saved_frac']:.0f} %)** |")
    keep = all(r["saved_frac"] >= 0.1 for r in rows)
    lines += ["", f"Verdict: {'keep' if keep else 'drop'} the deferral (kept while it saves at least 10 % of a "
              "command-line call)."]
    floor_cmd = [sys.executable, "-c", "pass"]
    parser_cmds = {"precnb --version": ["--version"], "precnb --help": ["--help"],
                   "precnb diff --help": ["diff", "--help"]}
    times: dict[str, list[float]] = {"python -c pass": [], **{k: [] for k in parser_cmds}}
    for _ in range(args.reps):
        times["python -c pass"].append(one(floor_cmd, base))
        for label, extra in parser_cmds.items():
            times[label].append(one([sys.executable, "-m", "precnb", *extra], base))
    floor = statistics.median(times["python -c pass"])
    startup = [{"command": k, "median_s": statistics.median(v), "ratio": statistics.median(v) / floor}
               for k, v in times.items()]
    lines += ["", "## The parser alone (no xarray, no pandas)", "",
              f"Medians of {args.reps} runs each, fresh interpreter, load average {os.getloadavg()[0]:.1f}.", "",
              "| command | median | ratio to `python -c pass` |", "|---|---:|---:|"]
    lines += [f"| `{r['command']}` | {r['median_s']:.2f} s | {r['ratio']:.1f}x |" for r in startup]
    # the installed sizes (--sizes) are kept as they are
    kept = _section(args.results.read_text(), SIZES) if args.results.is_file() else None
    text = "\n".join(lines) + "\n"
    args.results.write_text(_with_section(text, SIZES, kept) if kept else text)
    js = args.results.with_suffix(".json")
    kept = {k: v for k, v in _json(js).items() if k == "installed_size"}
    js.write_text(json.dumps({"dask_deferral": rows, "parser": startup, **kept}, indent=1))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
