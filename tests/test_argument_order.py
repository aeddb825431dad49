"""One argument order (issue #27): baseline first where both runs are required, ``baseline=`` elsewhere."""

from __future__ import annotations

import inspect

import pytest

import precnb
from tests._inprocess_cli import run_cli
from tests.conftest import ROOT

DIV = ROOT / "data_samples" / "divergence"


@pytest.mark.parametrize("func, positional", [
    ("first_divergence", ["baseline", "target"]),
    ("align", ["baseline", "target"]),
    ("tensor_metrics", ["baseline", "target"]),
    ("preflight", ["base", "target"]),
])
def test_both_runs_required_baseline_first(func, positional):
    params = [p.name for p in inspect.signature(getattr(precnb, func)).parameters.values()
              if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD]
    assert params[:2] == positional


def test_compare_runs_baseline_first():
    from precnb.analysis.compare import compare_runs

    assert list(inspect.signature(compare_runs).parameters)[:2] == ["baseline", "target"]


@pytest.mark.parametrize("call, message", [
    (lambda: precnb.diagnose(DIV / "target", DIV / "baseline"),
     r"diagnose\(\) takes the baseline as a keyword: diagnose\(target, baseline=\.\.\.\)"),
    (lambda: precnb.explore(DIV / "target", DIV / "baseline"),
     r"explore\(\) takes the baseline as a keyword: explore\(run_or_runs, baseline=\.\.\.\)"),
    (lambda: precnb.write_html(DIV / "target", "x.html", DIV / "baseline"),
     r"write_html\(\) takes the baseline as a keyword: write_html\(target, path, baseline=\.\.\.\)"),
])
def test_a_second_positional_run_is_a_type_error_naming_baseline(call, message):
    with pytest.raises(TypeError, match=message):
        call()


def test_accessor_takes_the_baseline_as_a_keyword():
    ds = precnb.open_run(DIV / "target", progress=False)
    with pytest.raises(TypeError):
        ds.prec.diagnose(DIV / "baseline")
    for func in (precnb.diagnose, precnb.explore, precnb.write_html):
        sig = inspect.signature(func)
        assert sig.parameters["baseline"].kind is inspect.Parameter.KEYWORD_ONLY, func


def test_keyword_baseline_gives_the_cli_answer():
    """``precnb.diagnose(T, baseline=B)`` is ``precnb diff B T``: the same first divergence, the real one."""
    import json

    t = precnb.diagnose(DIV / "target", baseline=DIV / "baseline", progress=False)
    f = t.finding
    # the sample's bug: block 0's GELU runs in bfloat16 on rank 0 from step 1 on
    assert (f.kind, f.step, f.rank, f.node) == ("first_divergence", 1, 0, "Functional.gelu.0.forward")
    assert f.module == "blocks.0.mlp"
    out = run_cli("diff", DIV / "baseline", DIV / "target", "--json")
    cli = json.loads(out.stdout)
    assert (cli["kind"], cli["step"], cli["rank"], cli["node"]) == (f.kind, f.step, f.rank, f.node)
    assert cli["values"]["baseline"]["max"] == f.values["baseline"]["max"]
