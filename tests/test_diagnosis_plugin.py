"""A diagnosis is one module plus its test (issue #27 item 2).

The diagnosis below is registered from this file only (no other file of precnb names it) and shows up
everywhere a built-in one does: ``precnb.diagnose``, its generated CLI subcommand (text and ``--json``),
the HTML report (its finding and its own section), the explorer (its finding and the records it flags),
its dump plan and its not-applicable text. On the bundled ``dp_nan`` sample (NaN injected on rank 1 at
step 1, spread to rank 0 by the all-reduce) it names step 1 and rank 1: the rank with the most
non-finite maxima at the first step that has any (367 against rank 0's 76). Its own option (``min_bad``,
declared here as a frozen dataclass, issue #50 item 2) is a ``diagnose()`` keyword and a flag of its
generated subcommand (``--min-bad``), with no other file touched.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

import precnb
from precnb.analysis.findings import Finding
from precnb.analysis.options import option
from precnb.analysis.registry import Context, Diagnosis, register, unregister
from tests.conftest import sample_path

KIND = "toy_nonfinite_rank"
NOTE = "toy: dump the rank that went bad first"


def _bad(ds: Any) -> np.ndarray:
    mx = ds["max"].transpose("step", "rank", "tensor").values.astype(float)
    return ds["present"].transpose("step", "rank", "tensor").values & ~np.isfinite(mx)


@dataclass(frozen=True)
class ToyOptions:
    min_bad: int = option(1, help="toy: non-finite maxima a rank needs at one step to count", type=int)


def _run(ctx: Context) -> Finding:
    bad = _bad(ctx.target)
    need = ctx.options[KIND].min_bad if KIND in ctx.options else 1
    steps = np.flatnonzero((bad.sum(axis=2) >= need).any(axis=1))
    if not len(steps):
        return Finding(kind="none", reason=f"no rank with {need} non-finite maxima at one step")
    s = int(steps[0])
    counts = bad[s].sum(axis=1)
    r = int(np.argmax(counts))
    per_rank = {int(ctx.target["rank"].values[i]): int(c) for i, c in enumerate(counts)}
    return Finding(kind=KIND, reason=f"most non-finite maxima at the first step that has any ({counts[r]})",
                   step=int(ctx.target["step"].values[s]), rank=int(ctx.target["rank"].values[r]),
                   stats={"per_rank": per_rank})


def _flags(ds: Any, finding: Any, *, triage: Any) -> list[dict[str, Any]]:
    """The records that go bad, one step before (finite there: only this diagnosis flags them)."""
    bad = _bad(ds)
    si = list(ds["step"].values).index(finding.step)
    ri = list(ds["rank"].values).index(finding.rank)
    if si == 0:
        return []
    return [{"step": int(ds["step"].values[si - 1]), "rank": finding.rank, "tensor": str(t)}
            for t in ds["tensor"].values[bad[si, ri]]]


def _section(finding: Any, *, rows: int) -> dict[str, Any]:
    return {"title": "Toy: non-finite maxima by rank", "columns": ["rank", "non-finite maxima"],
            "rows": [[k, v] for k, v in sorted(finding.stats["per_rank"].items())][:rows]}


def _plan(finding: Any, ds: Any, *, dump_path: str, task: str | None = None) -> Any:
    from precnb.analysis.findings.plan import generic_plan

    plan = generic_plan(finding, ds, dump_path=dump_path, task=task or "tensor", module="blocks.1")
    assert plan is not None
    plan["notes"].append(NOTE)
    return plan


TOY = Diagnosis(kind=KIND, title="Toy non-finite rank", priority=35, mode="single", run=_run,
                description="toy: the rank with the most non-finite maxima", command="toy-nonfinite",
                applies=lambda ctx: ctx.target.sizes["rank"] > 1, not_applicable="toy: needs two ranks or more",
                flags=_flags, flag_text="toy precursors", section=_section, plan=_plan, options=ToyOptions)


@pytest.fixture
def toy():
    register(TOY)
    yield TOY
    unregister(KIND)


def test_diagnose_runs_it(toy):
    t = precnb.diagnose(sample_path("dp_nan"))
    f = t.result(KIND)
    assert (f.kind, f.step, f.rank) == (KIND, 1, 1) and f.stats["per_rank"] == {0: 76, 1: 367}
    assert f in t.findings and t.finding.kind == "nan_origin"  # priority 35: after the NaN origin (30)
    assert {"kind": KIND, "status": "found"}.items() <= next(c for c in t.checks if c["kind"] == KIND).items()
    one = precnb.diagnose(sample_path("dp_nan"), options=precnb.Options(ranks=[0]))
    check = next(c for c in one.checks if c["kind"] == KIND)
    assert check["status"] == "not applicable" and check["message"] == "toy: needs two ranks or more"
    from precnb.analysis.findings.plan import plan_dump

    plan = plan_dump(f, t.target)
    assert NOTE in plan["notes"] and (plan["steps"], plan["ranks"]) == ([1], [1])
    assert plan["selects"]["modules"] == ["blocks.1"]


def test_its_option_is_a_diagnose_keyword(toy):
    assert precnb.diagnose(sample_path("dp_nan"), min_bad=367).result(KIND).step == 1
    assert precnb.diagnose(sample_path("dp_nan"), min_bad=368).result(KIND).step == 2  # 579 there
    clean = precnb.diagnose(sample_path("dp_nan"), min_bad=100000).result(KIND)
    assert not clean.found and "100000" in clean.reason
    assert precnb.Options(min_bad=5).of(KIND) == ToyOptions(min_bad=5)
    assert precnb.Options(min_bad=5).describe()["min_bad"] == 5
    with pytest.raises(TypeError, match="min_bad"):  # the valid keywords are listed
        precnb.Options(min_badd=5)


def test_unknown_keyword_without_it(capsys):
    with pytest.raises(TypeError, match="unknown option"):
        precnb.Options(min_bad=5)


def test_cli_flag_is_generated(toy, capsys):
    from precnb.cli import main

    assert main(["toy-nonfinite", str(sample_path("dp_nan")), "--min-bad", "100000", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["kind"] == "none" and "100000" in d["reason"]
    assert main(["toy-nonfinite", "--help"]) == 0
    out = capsys.readouterr().out
    assert "--min-bad" in out and "non-finite maxima a rank needs" in out and "(default 1)" in out


def test_cli_subcommand_is_generated(toy, capsys):
    from precnb.cli import main

    assert main(["toy-nonfinite", str(sample_path("dp_nan")), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert (d["kind"], d["step"], d["rank"]) == (KIND, 1, 1)
    assert main(["toy-nonfinite", str(sample_path("dp_nan"))]) == 0
    assert "step 1" in capsys.readouterr().out
    assert main(["toy-nonfinite", "--help"]) == 0
    assert "the rank with the most non-finite maxima" in capsys.readouterr().out


def test_gone_when_unregistered(capsys):
    from precnb.cli import main

    assert main(["toy-nonfinite", str(sample_path("dp_nan"))]) == 2
    assert KIND not in {c["kind"] for c in precnb.diagnose(sample_path("dp_nan")).checks}


def test_report_has_its_finding_and_section(toy, tmp_path):
    from precnb.report import write_html

    html = write_html(sample_path("dp_nan"), tmp_path / "r.html").read_text(encoding="utf-8")
    assert "Toy non-finite rank" in html and "Toy: non-finite maxima by rank" in html
    section = html[html.index("Toy: non-finite maxima by rank"):]
    assert ">367<" in section[:2000] and ">76<" in section[:2000]


def test_explorer_shows_and_flags_it(toy):
    pytest.importorskip("ipywidgets")
    pytest.importorskip("anywidget")
    from precnb.pipeline.tensors import flagged
    from precnb.widgets import explore

    ex = explore(sample_path("dp_nan"))
    f = next(f for f in ex.findings() if f.kind == KIND)
    fl = flagged(ex.triage)
    assert "toy precursors" in fl.what
    ds = fl.ds
    pre = _flags(ds, f, triage=ex.triage)
    assert pre and all(r["step"] == 0 and r["rank"] == 1 for r in pre)
    ti = [list(ds["tensor"].values).index(r["tensor"]) for r in pre]
    assert np.isfinite(fl.positions[0, 1, ti]).all()  # flagged only by the toy diagnosis: finite at step 0
    ex.show_finding(f)
    assert (ex.step, ex.rank) == (1, 1)


def test_flags_of_the_first_form_still_work():
    """A ``flags(ds, finding)`` hook (before ``triage=`` was passed) is called without it."""
    from precnb.pipeline.tensors import _call_flags

    old = Diagnosis(kind="x", title="X", priority=1, mode="any", run=_run, description="x",
                    flags=lambda ds, f: [{"step": 0, "rank": 0, "tensor": "t"}])
    assert _call_flags(old, None, None, object()) == [{"step": 0, "rank": 0, "tensor": "t"}]
    seen = []
    new = Diagnosis(kind="y", title="Y", priority=1, mode="any", run=_run, description="y",
                    flags=lambda ds, f, *, triage: seen.append(triage) or [])
    marker = object()
    assert _call_flags(new, None, None, marker) == [] and seen == [marker]


def test_core_is_small_and_hooks_are_groups():
    """A diagnosis is a core of at most eight fields plus optional hook groups (issue #50 item 2)."""
    from dataclasses import fields

    from precnb.analysis.hooks import GROUPS, LEGACY, ExplorerHooks, ReportHooks

    core = [f.name for f in fields(Diagnosis) if f.name not in GROUPS]
    assert core == ["kind", "title", "priority", "mode", "run", "description", "applies", "options"]
    hooks = [f.name for cls in GROUPS.values() for f in fields(cls)]
    assert len(hooks) == len(LEGACY) and not set(LEGACY) & {*core, *GROUPS}  # each hook's own name says its group
    assert TOY.explorer == ExplorerHooks(flags=_flags, flag_text="toy precursors")  # hooks given by their own name
    assert TOY.report == ReportHooks(section=_section, not_applicable="toy: needs two ranks or more")
    assert TOY.cli.command == "toy-nonfinite" and TOY.finding.plan is _plan
    with pytest.raises(TypeError, match="flag_txt"):
        Diagnosis(kind="x", title="X", priority=1, mode="any", run=_run, description="x", flag_txt="y")


def test_accessor_method_comes_from_the_registry(toy):
    ds = precnb.open_run(sample_path("dp_nan"), progress=False)
    f = ds.prec.toy_nonfinite_rank(min_bad=368)  # its option too
    assert (f.kind, f.step) == (KIND, 2)
    with pytest.raises(AttributeError, match="no attribute 'toy_nonfinite_rankk'"):
        ds.prec.toy_nonfinite_rankk  # noqa: B018
