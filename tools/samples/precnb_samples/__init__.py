"""Generator of the committed msprobe sample dumps (``data_samples/``).

Runs a tiny GPT-like model on CPU under the real MindStudio Probe (msprobe) and writes raw
msprobe output plus a ``ground_truth.json`` per sample that records exactly what was injected
and where (the node names are read back from the produced dumps)::

    python -m precnb_samples [--out data_samples] [--only NAME ...] [--megatron-moe-only]

Importing this package does not import torch or msprobe; they are imported when a sample is
generated (install them with ``pip install -e tools/samples``). The MindSpore samples (``xfw``,
``kernel_resume``) also need a MindSpore 2.10 interpreter in a venv of its own (MindSpore needs
numpy<2), named by ``PRECNB_MINDSPORE_PYTHON`` (see :data:`precnb_samples._ms_run.RECIPE`); the
``megatron`` sample runs Megatron-Core 0.19.2 (and Hugging Face ``transformers``) in an interpreter named by
``PRECNB_MEGATRON_PYTHON`` (see :data:`precnb_samples._mg_run.RECIPE`). Samples whose interpreter is not set
are skipped with a message unless named in ``--only``.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path

__all__ = [
    "CATALOG",
    "COMMAND",
    "INSTALL_HINT",
    "SAMPLE_NAMES",
    "generate",
    "main",
    "require_generator_deps",
]

from ._catalog import CATALOG, SAMPLE_NAMES

INSTALL_HINT = "pip install -e tools/samples"
COMMAND = "python -m precnb_samples --out data_samples"


def require_generator_deps() -> None:
    """Import torch and msprobe, raising an ImportError that names the install command."""
    missing = []
    for module in ("torch", "msprobe.pytorch"):
        try:
            __import__(module)
        except ImportError as exc:  # pragma: no cover - depends on the environment
            missing.append(f"{module} ({exc})")
    if missing:
        raise ImportError(
            "the sample generator needs torch==2.13.0 and mindstudio-probe==26.2.0; missing: "
            + ", ".join(missing)
            + f". Install them with: {INSTALL_HINT}"
        )


def generate(
    out: str | Path = "data_samples",
    only: Iterable[str] | None = None,
    log: Callable[[str], None] = print,
    write_readme: bool = True,
    log_dir: str | Path | None = None,
    megatron_moe_only: bool = False,
) -> list[Path]:
    """Generate samples into ``out`` (each sample folder is replaced) and return their paths.

    Parameters
    ----------
    out:
        Output folder (created if needed).
    only:
        Sample names to generate (default: all of :data:`SAMPLE_NAMES`; then samples whose extra
        requirement is missing, e.g. the MindSpore interpreter, are skipped with a message, while
        naming them in *only* makes that an error).
    log:
        Progress callback.
    write_readme:
        Rewrite ``out/README.md`` from every ``ground_truth.json`` found under ``out``.
    log_dir:
        Keep the worker processes' logs (msprobe's output) in this folder; by default they go
        to a temporary folder that is removed after a successful run.
    megatron_moe_only:
        Regenerate only the MoE roots (``moe_*``) of the ``megatron`` sample and their part of its
        ground truth and README; the other roots' files stay byte for byte (needs ``only=["megatron"]``
        and an existing ``megatron/ground_truth.json``).
    """
    names = list(only) if only else list(SAMPLE_NAMES)
    if megatron_moe_only and names != ["megatron"]:
        raise ValueError("--megatron-moe-only regenerates part of the megatron sample: use it with --only megatron")
    unknown = [n for n in names if n not in SAMPLE_NAMES]
    if unknown:
        raise ValueError(f"unknown sample(s) {unknown}; choose from {list(SAMPLE_NAMES)}")
    require_generator_deps()
    import importlib

    from . import _readme, _scenarios

    out_path = Path(out).resolve()
    out_path.mkdir(parents=True, exist_ok=True)
    keep_logs = log_dir is not None
    if keep_logs:
        log_dir = Path(log_dir).resolve()
        log_dir.mkdir(parents=True, exist_ok=True)
    else:
        log_dir = Path(tempfile.mkdtemp(prefix="precnb-samples-logs-"))
    ctx = _scenarios.Context(out=out_path, log_dir=log_dir, command=COMMAND, log=log)
    done = []
    for module_name in dict.fromkeys(CATALOG[n] for n in SAMPLE_NAMES if n in names):  # check before any run
        requires = getattr(importlib.import_module(f"{__name__}.{module_name}"), "REQUIRES", None)
        if requires is None:
            continue
        try:
            requires()
        except ImportError as exc:
            if only:  # asked for by name: an error
                raise
            skipped = [n for n in names if CATALOG[n] == module_name]
            log(f"[precnb_samples] skipping {', '.join(skipped)}: {exc}")
            names = [n for n in names if n not in skipped]
    try:
        for name in (n for n in SAMPLE_NAMES if n in names):
            t0 = time.monotonic()
            log(f"[precnb_samples] generating {name} ...")
            module = importlib.import_module(f"{__name__}.{CATALOG[name]}")
            if megatron_moe_only:  # part of the sample: no folder replaced, the other roots untouched
                gt = module.update_moe(ctx, out_path / name)
                _scenarios.write_json(out_path / name / "ground_truth.json", gt)
                _scenarios.scrub_sample(ctx, out_path / name)
                done.append(out_path / name)
            else:
                done.append(_scenarios.generate_one(ctx, name, module.GENERATORS[name]))
            log(f"[precnb_samples]   {name} done in {time.monotonic() - t0:.1f} s")
    except Exception:
        log(f"[precnb_samples] failed; worker logs kept in {log_dir}")
        raise
    if not keep_logs:
        shutil.rmtree(log_dir, ignore_errors=True)
    if write_readme:
        _readme.write_readme(out_path)
        log(f"[precnb_samples] wrote {out_path / 'README.md'}")
    return done


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point of ``python -m precnb_samples``."""
    import argparse

    from ._mg_run import ENV as MG_ENV
    from ._mg_run import RECIPE as MG_RECIPE
    from ._ms_run import ENV, RECIPE

    parser = argparse.ArgumentParser(
        prog="python -m precnb_samples",
        description="Generate msprobe sample dumps (real msprobe, tiny GPT on CPU).",
        epilog=f"The MindSpore samples (xfw, kernel_resume) run MindSpore 2.10 in its own interpreter, "
        f"named by ${ENV} (MindSpore needs numpy<2): {RECIPE}. The megatron sample runs Megatron-Core 0.19.2 "
        f"in the interpreter named by ${MG_ENV}: {MG_RECIPE}",
    )
    parser.add_argument(
        "--out", default="data_samples", help="output folder (default: %(default)s)"
    )
    parser.add_argument(
        "--only",
        nargs="+",
        choices=SAMPLE_NAMES,
        metavar="NAME",
        help=f"generate only these samples: {', '.join(SAMPLE_NAMES)}",
    )
    parser.add_argument("--megatron-moe-only", action="store_true",
                        help="with --only megatron: regenerate only its MoE roots (moe_*) and their ground truth; "
                        "the other roots stay byte for byte")
    parser.add_argument("--no-readme", action="store_true", help="do not rewrite README.md")
    parser.add_argument("--logs", metavar="DIR", help="keep the workers' msprobe logs in DIR")
    args = parser.parse_args(argv)
    try:
        generate(args.out, args.only, write_readme=not args.no_readme, log_dir=args.logs,
                 megatron_moe_only=args.megatron_moe_only)
    except ImportError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0
