"""MkDocs hooks of precnb's documentation site (``mkdocs.yml``, issue #52).

The reference pages are generated when the site is built, never written by hand:

* ``reference/cli.md`` from the argparse parser of the command line (:func:`precnb.cli.build_parser`):
  every subcommand, argument and help text, and the exit codes (``precnb.cli``'s docstring);
* ``reference/api.md`` from ``precnb.__all__``: one mkdocstrings block per public name, at the module
  that defines it (``precnb._LAZY``); mkdocstrings reads the docstrings statically.

``reference/finding-schema.md`` is written by hand; the build fails when a field of
:class:`precnb.analysis.findings.Finding` (or the ``schema`` key) has no row in its field table.

The gallery (``gallery.md``, generated) and the incident guides link HTML reports (``reports/*.html``, one per
guide: :data:`REPORTS`) exported here from the bundled samples with ``precnb report``; ``PRECNB_DOCS_REPORTS=0``
puts a placeholder page there instead (a faster build). The screenshots ``make docs-screenshots`` takes
(``tools/docs_screenshots.py``, into :data:`SHOTS`) are shown on the guides and the gallery when they are there.

The repository root is put first on ``sys.path`` so the checkout being documented is the one imported.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

#: the gallery: one report per incident guide, exported from a bundled sample by ``precnb report`` (run from the
#: repository root): site path of the report -> (the guide that links it, its title, the ``precnb report`` arguments)
REPORTS: dict[str, tuple[str, str, list[str]]] = {
    "reports/dp_nan.html": ("incidents/nan-one-rank.md", "NaN on one rank", ["data_samples/dp_nan"]),
    "reports/divergence.html": ("incidents/divergence.md", "First divergence between two runs",
                                ["data_samples/divergence/target", "--baseline", "data_samples/divergence/baseline"]),
    "reports/tp_unsync.html": ("incidents/tp-layouts.md", "TP layouts vs one device",
                               ["data_samples/tp_unsync/tp2", "--baseline", "data_samples/tp_unsync/tp1",
                                "--target-layout", "tp=2"]),
    "reports/megatron_tp2pp2_scaled.html": ("incidents/megatron.md", "Megatron-Core",
                                            ["data_samples/megatron/tp2pp2_scaled", "--baseline",
                                             "data_samples/megatron/tp1pp1"]),
    "reports/xfw.html": ("incidents/framework-port.md", "A framework port: PyTorch vs MindSpore",
                         ["data_samples/xfw/ms_bug", "--baseline", "data_samples/xfw/pt"]),
    "reports/unsync.html": ("incidents/unsynced-seeds.md", "Unsynchronised seeds: replicas that depart",
                            ["data_samples/megatron/tp2pp1_dropout_unsync", "--baseline",
                             "data_samples/megatron/tp1pp1_dropout"]),
    "reports/sdc.html": ("incidents/faulty-device.md", "A faulty device (silent data corruption)",
                         ["data_samples/sdc/job1", "--layout", "tp=2,dp=2", "--rank-table",
                          "data_samples/sdc/rank_tables/job1.json"]),
    "reports/spike.html": ("incidents/loss-spikes.md", "Loss spikes",
                           ["data_samples/spike_data/dump", "--monitor", "data_samples/spike_data/monitor_output",
                            "--loss", "data_samples/spike_data/loss_log.csv"]),
    "reports/frozen.html": ("incidents/preflight.md", "Pre-flight checks",
                            ["data_samples/preflight/frozen/target", "--baseline",
                             "data_samples/preflight/frozen/baseline"]),
    "reports/custom_op_gap.html": ("incidents/what-to-dump-next.md", "What to dump next",
                                   ["data_samples/custom_op_gap"]),
    "reports/dp_sum.html": ("incidents/dp-grad-sync.md", "DP gradient sync: summed, not averaged",
                            ["data_samples/dp_sum/target", "--baseline", "data_samples/dp_sum/baseline"]),
    "reports/tensor_bug.html": ("incidents/tensor-metrics-repro.md", "Tensor-mode metrics and repro",
                                ["data_samples/tensor_bug/target", "--baseline", "data_samples/tensor_bug/baseline"]),
}

#: where ``make docs-screenshots`` (tools/docs_screenshots.py) writes its PNGs, outside ``docs/``: the pages show
#: them only when they are there (a build without the screenshot step has no image and no broken link)
SHOTS = Path(os.environ.get("PRECNB_DOCS_SHOTS", ROOT / "build" / "docs-screenshots"))


# -- the command line ------------------------------------------------------------------------------------------
def _cell(text: Any) -> str:
    """Text for one Markdown table cell."""
    return " ".join(str(text).split()).replace("|", "\\|")


def _code(text: str) -> str:
    return f"`{text}`" if "`" not in text else f"`` {text} ``"


def _argument_rows(parser: argparse.ArgumentParser) -> list[str]:
    formatter = parser._get_formatter()
    rows = ["| argument | what it is | default |", "|---|---|---|"]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction) or action.help == argparse.SUPPRESS:
            continue
        if action.option_strings:
            metavar = "" if action.nargs == 0 else " " + formatter._format_args(
                action, formatter._get_default_metavar_for_optional(action))
            name = ", ".join(f"{o}{metavar}" for o in action.option_strings)
        else:
            name = formatter._format_args(action, formatter._get_default_metavar_for_positional(action))
        text = formatter._expand_help(action) if action.help else ""
        if action.choices is not None and not isinstance(action, argparse._SubParsersAction):
            text += f" (one of: {', '.join(map(str, action.choices))})"
        if getattr(action, "required", False) and action.option_strings:
            text += " (required)"
        default = action.default
        shown = "" if default in (None, False, argparse.SUPPRESS) or action.nargs == 0 else _code(repr(default))
        rows.append(f"| {_code(name)} | {_cell(text)} | {shown} |")
    return rows


def cli_page() -> str:
    """The command-line reference (Markdown) rendered from :func:`precnb.cli.build_parser`."""
    import precnb.cli
    from precnb.cli import build_parser

    old = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "110"  # usage lines wrapped as on a wide terminal, the same on every machine
    try:
        parser = build_parser()
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        helps = {a.dest: a.help for a in sub._choices_actions}
        out = ["# Command line reference", "",
               "Generated from the command line's own parser (`precnb.cli.build_parser`) when this site is built: "
               "every verb, argument and help text, as `precnb VERB --help` prints them.", "",
               "```text", parser.format_help().rstrip(), "```", "", "## Exit codes", ""]
        doc = (precnb.cli.__doc__ or "").split("\n\n", 1)[1].strip()
        out += [" ".join(doc.split()), "", "## Verbs", ""]
        out += [f"- [`precnb {name}`](#precnb-{name}): {_cell(helps.get(name, ''))}" for name in sub.choices]
        for name, p in sub.choices.items():
            out += ["", f"## precnb {name}", "", _cell(p.description or helps.get(name) or ""), "",
                    "```text", p.format_usage().rstrip(), "```", "", *_argument_rows(p)]
            if p.epilog:
                out += ["", p.epilog]
        return "\n".join(out) + "\n"
    finally:
        if old is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = old


# -- the Python API --------------------------------------------------------------------------------------------
def api_page() -> str:
    """The Python API reference: a mkdocstrings block for each name of ``precnb.__all__``."""
    import precnb

    names = [n for n in precnb.__all__ if n != "__version__"]
    out = ["# Python API reference", "",
           "Generated when this site is built: one entry for each public name of `precnb` (`precnb.__all__`), "
           "documented where it is defined. `import precnb` is light: each name is imported on first use.", "",
           "```python", "import precnb", "precnb.__version__   # " + repr(precnb.__version__), "```", ""]
    out += [", ".join(f"[`{n}`](#{precnb._LAZY[n]}.{n})" for n in names), ""]
    for name in names:
        out += [f"::: {precnb._LAZY[name]}.{name}", "    options:", f"      heading: \"precnb.{name}\"",
                "      show_root_toc_entry: true", ""]
    return "\n".join(out)


# -- the finding schema ----------------------------------------------------------------------------------------
def check_finding_schema(markdown: str) -> None:
    """Raise unless every field of the finding (and ``schema``) has a row in the schema page's field table."""
    from precnb.analysis.findings import Finding

    documented = set(re.findall(r"^\| `([a-z_]+)` \|", markdown, flags=re.MULTILINE))
    fields = {"schema", *(f.name for f in dataclasses.fields(Finding))}
    missing, extra = fields - documented, documented - fields
    if missing or extra:
        raise ValueError(f"reference/finding-schema.md: fields not documented {sorted(missing)}, "
                         f"documented but not fields {sorted(extra)}")


# -- the incident guides' reports ------------------------------------------------------------------------------
def _reports(out: Path, only: list[str] | None = None) -> dict[str, Path]:
    """Export the reports of :data:`REPORTS` (*only* these site paths) into *out*, two at a time; {site: file}."""
    files = {site: out / Path(site).name for site in REPORTS if only is None or site in only}
    if only is None and os.environ.get("PRECNB_DOCS_REPORTS", "1") == "0":
        for site, path in files.items():
            path.write_text(f"<!doctype html><title>{site}</title><p>Not built (PRECNB_DOCS_REPORTS=0): run "
                            f"<code>precnb report {' '.join(REPORTS[site][2])} -o {Path(site).name}</code>.</p>\n",
                            encoding="utf-8")
        return files
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    items = [(site, args) for site, (_guide, _title, args) in REPORTS.items() if site in files]
    for i in range(0, len(items), 2):
        procs = [(site, subprocess.Popen([sys.executable, "-m", "precnb", "report", *args, "-o", str(files[site])],
                                         cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                         text=True)) for site, args in items[i:i + 2]]
        for site, proc in procs:
            _, err = proc.communicate(timeout=600)
            if proc.returncode not in (0,) or not files[site].is_file():
                raise RuntimeError(f"precnb report for {site} failed ({proc.returncode}): {err[-2000:]}")
    return files


# -- the gallery and the screenshots -----------------------------------------------------------------------------
def shot_name(kind: str, site: str) -> str:
    """Site path of a screenshot: *kind* ``explorer`` or ``report`` of the report at *site* (``reports/x.html``)."""
    return f"screenshots/{kind}-{Path(site).stem}.png"


def shots_present() -> dict[str, Path]:
    """{site path: PNG} of the screenshots ``make docs-screenshots`` wrote (none on a machine that did not run it)."""
    out = {}
    for site in REPORTS:
        for kind in ("explorer", "report"):
            name = shot_name(kind, site)
            if (SHOTS / Path(name).name).is_file():
                out[name] = SHOTS / Path(name).name
    return out


def gallery_page(shots: dict[str, Path]) -> str:
    """The gallery: every incident guide's exported report (and its screenshots when they were made)."""
    out = ["# Gallery", "",
           "Each incident guide's HTML report, exported from its bundled sample by `precnb report` when this site is "
           "built (self-contained: it opens offline). The command is the one on the guide's page.", ""]
    if not shots:
        out += ["(No screenshots in this build: `make docs-screenshots` takes them, headless Chromium against a real "
                "JupyterLab and the reports, then `make docs` shows them.)", ""]
    for site, (guide, title, args) in REPORTS.items():
        out += [f"## {title}", "", f"[The guide]({guide}) · [the report]({site})", "",
                "```bash", f"precnb report {' '.join(args)} -o {Path(site).name}", "```", ""]
        for kind, what in (("explorer", "The explorer's first screen"), ("report", "The report")):
            if shot_name(kind, site) in shots:
                out += [f"[![{what}: {title}]({shot_name(kind, site)})]({site if kind == 'report' else guide})", ""]
    return "\n".join(out)


def guide_with_shots(markdown: str, site: str, shots: dict[str, Path]) -> str:
    """An incident guide with its screenshots: the explorer's before "## The report", the report's at the end."""
    explorer, report = shot_name("explorer", site), shot_name("report", site)
    if explorer in shots:
        picture = (f"![The explorer's first screen on this sample, in JupyterLab](../{explorer})\n\n"
                   "*The explorer's first screen in JupyterLab (`make docs-screenshots`).*\n\n")
        head, sep, tail = markdown.partition("\n## The report\n")
        markdown = head + "\n" + picture + sep.lstrip("\n") + tail if sep else markdown + "\n" + picture
    if report in shots:
        markdown = (markdown.rstrip("\n") + f"\n\n[![The report of this sample](../{report})](../{site})\n\n"
                    "*The exported report (`make docs-screenshots`).*\n")
    return markdown


_TMP: list[tempfile.TemporaryDirectory[str]] = []


def on_files(files: Any, config: Any) -> Any:
    """Add the generated pages and the exported reports to the site's files."""
    from mkdocs.structure.files import File

    files.append(File.generated(config, "reference/cli.md", content=cli_page()))
    files.append(File.generated(config, "reference/api.md", content=api_page()))
    check_finding_schema((Path(config["docs_dir"]) / "reference" / "finding-schema.md").read_text(encoding="utf-8"))
    tmp = tempfile.TemporaryDirectory(prefix="precnb-docs-reports-")
    _TMP.append(tmp)
    for site, path in _reports(Path(tmp.name)).items():
        files.append(File.generated(config, site, abs_src_path=str(path)))
    shots = shots_present()
    for site, path in shots.items():
        files.append(File.generated(config, site, abs_src_path=str(path)))
    files.append(File.generated(config, "gallery.md", content=gallery_page(shots)))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """Show an incident guide's screenshots when ``make docs-screenshots`` made them."""
    for site, (guide, _title, _args) in REPORTS.items():
        if page.file.src_uri == guide:
            return guide_with_shots(markdown, site, shots_present())
    return markdown


def on_post_build(config: Any) -> None:
    """Remove the reports' temporary folder."""
    while _TMP:
        _TMP.pop().cleanup()
