"""compare_runs holds the pair once (issue #30 item 3): no copy of runs already on the shared grid, and the
largest relative difference computed one step at a time gives the values of the whole-pair computation."""

from __future__ import annotations

import numpy as np
import xarray as xr

import precnb
from precnb.analysis import compare_runs, first_divergence
from precnb.analysis.compare.prep import largest_difference as _largest_difference
from precnb.analysis.compare.tolerance import relative_difference
from tests.conftest import sample_path, shared_path


def _pair() -> tuple[xr.Dataset, xr.Dataset]:
    return (precnb.open_run(sample_path("divergence", "baseline"), progress=False),
            precnb.open_run(sample_path("divergence", "target"), progress=False))


def test_runs_on_the_shared_grid_are_not_copied():
    b, t = _pair()
    cmp = compare_runs(b, t)
    assert cmp.ds.sizes["step"] > 1  # several steps: the step-by-step path is the one tested
    assert np.shares_memory(cmp.base["max"].values, b["max"].values)
    assert np.shares_memory(cmp.targ["norm"].values, t["norm"].values)
    one = compare_runs(b, t, steps=[int(b["step"].values[0])])  # a restriction still selects (and copies)
    assert one.base.sizes["step"] == 1 and not np.shares_memory(one.base["max"].values, b["max"].values)
    f = first_divergence(b, t)
    assert (f.kind, f.step, f.rank, f.node) == ("first_divergence", 1, 0, "Functional.gelu.0.forward")


def test_step_by_step_largest_difference_is_the_whole_pair_one():
    """Same values, NaN / -inf / absent entries included (S1's masked attention holds -inf)."""
    b = precnb.open_run(shared_path("data_samples", "msprobe", "S1_baseline", "statistics"), progress=False)
    t = b.copy(deep=True)
    mx = t["max"].values
    mx[1, 0, 3] = np.nan  # a NaN where the baseline has a number
    mx[-1, 0, 5] *= 1.5
    assert np.isinf(b["min"].values).any() and b.sizes["step"] > 1
    both = precnb.combine_runs({"a": b, "b": t})
    bb, tt = both.isel(run=0), both.isel(run=1)
    stats = ("max", "min", "mean", "norm")
    whole = relative_difference(bb, tt, stats).max("stat")
    xr.testing.assert_identical(_largest_difference(bb, tt, stats, 1e-30), whole)
    assert np.isinf(whole.values[1, 0, 3]) and whole.values[-1, 0, 5] > 0.3
