"""The msprobe release conformance matrix: every release's dump, read as that release's compare reads it.

The fixtures under ``tests/fixtures/msprobe_releases/<release>/`` were written by
``tools/msprobe_matrix/generate.py`` (``make msprobe-matrix``): the same tiny training (2 steps, fixed
seeds) dumped by each ``mindstudio-probe`` release in modes L0, L1, mix and md5 (+ a 2-rank gloo L1 run
for some releases), with the release's own compare of each rank file against itself stored beside it
(``pt_<mode>.truth.json``). The checks are in ``tools/msprobe_matrix/conformance.py`` (see its docstring
for what "read exactly" means).

Every mode every release was run in is a case, and so is a release that did not install: a failed
install, run or compare fails its case naming the release. A genuine gap is an ``xfail(strict=True)``
naming the release and the reason (:data:`READ_GAPS`, :data:`DIFF_GAPS`); closing it turns the case into
a failure ("XPASS(strict)") until its mark is removed.
"""

from __future__ import annotations

import hashlib
import json
import math
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools" / "msprobe_matrix"))

import conformance as cf  # noqa: E402


def _load(name: str, path: Path):
    """Import *path* under a name of its own (benchmarks/ has a generate.py too: tests/test_scale.py)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


gen = _load("msprobe_matrix_generate", ROOT / "tools" / "msprobe_matrix" / "generate.py")

FIXTURES = ROOT / "tests" / "fixtures" / "msprobe_releases"

# --- every release and mode, and the genuine gaps -----------------------------------------------------------------

#: (release, mode) -> why ``test_read_exactly`` cannot pass there (an ``xfail(strict=True)`` naming the release and
#: the reason; mode ``install`` for a release that did not install). Every PyTorch mode of every release installed,
#: ran, was read by its own compare and is read exactly by precnb; the gaps are MindSpore runs that cannot dump (or
#: whose dump the release's own compare cannot read) here, and why: ``conformance.MS_GAPS`` (the README table's text)
READ_GAPS: dict[tuple[str, str], str] = dict(cf.MS_GAPS)
#: (release, mode) -> why ``test_diff_against_reference_is_clean`` cannot pass there
DIFF_GAPS: dict[tuple[str, str], str] = {
    (v, m): "the release's dump is empty (nothing to compare: precnb diff says NOTHING COMPARED, exit 1): "
            + cf.MS_GAPS[(v, m)] for v in ("1.0.3", "1.0.4") for m in ("ms_mix", "ms_md5")}


def _params(gaps: dict[tuple[str, str], str], cases: list[tuple[str, str]]) -> list[object]:
    return [pytest.param(v, m, id=f"{v}-{m}",
                         marks=[pytest.mark.xfail(strict=True, reason=f"{v} {m}: {gaps[(v, m)]}")]
                         if (v, m) in gaps else [])
            for v, m in cases]


def _cases() -> list[tuple[str, str]]:
    """(release, mode) of every mode each committed release ran in, ``(release, "install")`` where it did not
    install: nothing the generator tried is left out of the test (a failed run or compare fails its case)."""
    out = []
    for v in cf.releases(FIXTURES):
        rec = cf.release_record(v, FIXTURES)
        for key, label in (("install", "install"), ("install_ms", "ms_install")):
            if key in rec and not rec[key]["ok"]:
                out.append((v, label))
        out.extend((v, mode) for mode in rec["runs"])
    return out


_CASES = _cases()
_FIXTURES = cf.fixtures(FIXTURES)
#: PyTorch modes: every release; MindSpore modes: the runs that wrote a dump (a failed run is a READ_GAPS case) and
#: whose mode the reference dumped
_DIFF_CASES = [(v, m) for v, m in _CASES if v != cf.REFERENCE and (
    m in gen.MODES or (m in gen.MS_MODES and cf.release_record(v, FIXTURES)["runs"][m]["ok"]
                       and (FIXTURES / cf.REFERENCE / gen.fixture_name(m)).is_dir()))]


def _ran(release: str, mode: str) -> None:
    """Fail naming the release when it did not install, run, or read with its own compare in *mode*."""
    rec = cf.release_record(release, FIXTURES)
    if mode in ("install", "ms_install"):
        inst = rec["install" if mode == "install" else "install_ms"]
        pytest.fail(f"{release} did not install ({inst['command']}): {inst.get('error', '?').strip()[-300:]}")
    run = rec["runs"][mode]
    assert run["ok"], f"{release} {mode}: the training under the release failed: {run.get('error', '?')[-300:]}"
    truth = run["truth"]
    assert truth["ok"], f"{release} {mode}: the release's own compare failed: {truth}"


def test_every_release_is_accounted_for() -> None:
    """Each release of the registry has a record; one that did not install or run says why."""
    assert cf.releases(FIXTURES) == sorted(gen.RELEASES, key=cf.version_key)
    for v in gen.RELEASES:
        rec = cf.release_record(v, FIXTURES)
        assert rec["release"] == v
        if not rec["install"]["ok"]:
            assert rec["install"]["error"].strip(), f"{v}: install failed without a recorded error"
            continue
        assert rec["install"]["versions"]["mindstudio-probe"] == v
        for mode, run in rec["runs"].items():
            assert run["ok"] or run["error"].strip(), f"{v} {mode}: failed without a recorded error"
            if run["ok"]:
                assert run["truth"]["ok"] or run["truth"].get("error") or run["truth"].get("errors"), (v, mode)


def test_every_gap_is_a_case() -> None:
    """No stale gap: each strict xfail names a (release, mode) the fixtures hold."""
    assert set(READ_GAPS) <= set(_CASES) and set(DIFF_GAPS) <= set(_DIFF_CASES)


def test_every_mindspore_gap_is_the_recorded_failure() -> None:
    """Each MindSpore strict xfail names the failure the run recorded (its error holds the gap's evidence)."""
    for (v, m), why in cf.MS_GAPS.items():
        run = cf.release_record(v, FIXTURES)["runs"][m]
        assert not (run["ok"] and run["truth"]["ok"]), (v, m)
        assert cf.MS_GAP_EVIDENCE[why] in cf.recorded_failure(v, m, FIXTURES), (v, m)


@pytest.mark.parametrize("release", ["1.0.3", "1.0.4"])
@pytest.mark.parametrize("mode", ["ms_mix", "ms_md5", "ms_jit"])
def test_1_0_x_mindspore_mix_dumps_are_empty(release: str, mode: str) -> None:
    """1.0.3/1.0.4 hook nothing at MindSpore level mix (ms_jit is at mix too): the dump has no record, and precnb
    says so, per file; against 26.2.0's dump of the mode (none for ms_jit: its diff is not tried) nothing compares."""
    import precnb

    files = sorted((FIXTURES / release / mode).glob("step*/*/dump.json"))
    assert len(files) == 2 and all(_json(f)["data"] == {} and _json(f)["level"] == "mix" for f in files)
    ds = precnb.open_run(FIXTURES / release / mode, workers=1, progress=False)
    report = precnb.load_report(ds)
    assert ds.sizes["tensor"] == 0 and ds.sizes["step"] == 2 and not report.unread and not report.skipped
    assert sorted(w.split(": ")[0] for w in report.warnings if "'data' is empty" in w) == [str(f) for f in files]
    if not (FIXTURES / cf.REFERENCE / mode).is_dir():
        return
    res = cf.check_diff(release, mode, FIXTURES)  # nothing in common with 26.2.0's dump: nothing compared
    assert res.exit_code == 1 and res.finding["kind"] == "none" and res.finding["stats"]["compared_records"] == 0


def test_the_reference_and_all_modes_are_there() -> None:
    """26.2.0 (the diff reference) has every PyTorch mode, read and compared; every release has L0, L1, mix, md5."""
    modes = {m for v, m in _FIXTURES if v == cf.REFERENCE}
    assert modes >= set(gen.MODES)
    for v in cf.releases(FIXTURES):
        assert {m for r, m in _CASES if r == v} >= {"L0", "L1", "mix", "md5"} or (v, "install") in _CASES, v


def test_losses_are_bit_identical_across_releases() -> None:
    """The same training in every release (the dumps differ only by what each release writes), per framework."""
    seen: dict[tuple[str, str, str], list[float]] = {}
    for v in cf.releases(FIXTURES):
        for mode, run in cf.release_record(v, FIXTURES)["runs"].items():
            if run.get("ok"):
                world = "2rank" if mode.endswith("2rank") else "1rank"
                for rank, losses in run["losses"].items():
                    key = (run.get("framework", "pytorch"), world, rank)
                    assert seen.setdefault(key, losses) == losses, (v, mode, rank)
    assert seen


@pytest.mark.parametrize(("release", "mode"), _params(READ_GAPS, _CASES))
def test_read_exactly(release: str, mode: str) -> None:
    """precnb reads every tensor of the fixture as the release's own compare does (names, values, CRC, order)."""
    _ran(release, mode)
    res = cf.check_read(release, mode, FIXTURES)
    assert res.tensors > 0
    assert res.ok, res.summary()


def _tree_digest(path: Path) -> str:
    """SHA-256 of every file below *path* (relative names and bytes): equal digests, byte-identical dumps."""
    h = hashlib.sha256()
    for p in sorted(path.rglob("*")):
        if p.is_file():
            h.update(str(p.relative_to(path)).encode() + b"\0")
            h.update(p.read_bytes())
    return h.hexdigest()


#: (mode, digest of the release's dump) -> the diff of that dump against the reference's (same mode): releases
#: that wrote byte-identical dumps (many patch releases do) are diffed once per test worker, not once each
_DIFFED: dict[tuple[str, str], cf.DiffResult] = {}


@pytest.mark.parametrize(("release", "mode"), _params(DIFF_GAPS, _DIFF_CASES))
def test_diff_against_reference_is_clean(release: str, mode: str) -> None:
    """``precnb diff 26.2.0-dump release-dump`` (same training, same mode) reports no divergence."""
    assert cf.release_record(release, FIXTURES)["runs"][mode]["ok"], f"{release} {mode}: no dump (the run failed)"
    key = (mode, _tree_digest(FIXTURES / release / cf.fixture_name(mode)))
    if key not in _DIFFED:
        _DIFFED[key] = cf.check_diff(release, mode, FIXTURES)
    res = _DIFFED[key]
    same = "" if res.release == release else f" (its dump is byte-identical to {res.release}'s, diffed)"
    assert res.ok, f"{release} {mode}{same}: {res.summary()}"


# --- the checker itself -------------------------------------------------------------------------------------------

def _copy_fixture(tmp_path: Path, version: str, mode: str) -> Path:
    root = tmp_path / "fx"
    (root / version).mkdir(parents=True)
    shutil.copytree(FIXTURES / version / f"pt_{mode}", root / version / f"pt_{mode}")
    shutil.copy(FIXTURES / version / f"pt_{mode}.truth.json", root / version / f"pt_{mode}.truth.json")
    shutil.copy(FIXTURES / version / "release.json", root / version / "release.json")
    return root


def _edit_truth(path: Path, edit) -> None:  # type: ignore[no-untyped-def]
    doc = json.loads(path.read_text(encoding="utf-8"))
    edit(doc)
    path.write_text(json.dumps(doc), encoding="utf-8")


def test_checker_finds_a_changed_value_a_missing_row_and_a_wrong_crc(tmp_path: Path) -> None:
    """check_read fails on a truth that differs from the file (it is not a test that cannot fail)."""
    ref = cf.REFERENCE
    root = _copy_fixture(tmp_path, ref, "mix")
    assert cf.check_read(ref, "mix", root).ok

    def change(doc: dict) -> None:  # type: ignore[type-arg]
        f = doc["files"]["step1/proc1"]
        i_max = f["columns"].index("max")
        row = next(r for r in f["rows"] if r[1] == "torch.float32")
        row[i_max] = repr(float(row[i_max]) + 2 ** -20)
        f["rows"].pop()  # the last tensor row disappears from the truth

    _edit_truth(root / ref / "pt_mix.truth.json", change)
    res = cf.check_read(ref, "mix", root)
    assert set(res.problems) == {"value", "tensor not in compare"}, res.summary()
    assert len(res.problems["value"]) == 1 and "step1 rank0" in res.problems["value"][0]

    root = _copy_fixture(tmp_path / "b", ref, "md5")

    def crc(doc: dict) -> None:  # type: ignore[type-arg]
        f = doc["files"]["step0/proc1"]
        i = f["columns"].index("md5")
        row = next(r for r in f["rows"] if r[1] == "torch.float32")
        row[i] = "00000000"

    _edit_truth(root / ref / "pt_md5.truth.json", crc)
    assert set(cf.check_read(ref, "md5", root).problems) == {"crc"}


def test_parse_stat_conventions() -> None:
    """The compare outputs' spellings of non-finite and null statistics."""
    assert cf.parse_stat(" inf") == math.inf and cf.parse_stat(" -inf") == -math.inf
    assert cf.parse_stat("inf\t") == math.inf and cf.parse_stat("-inf\t") == -math.inf
    assert math.isnan(cf.parse_stat("Nan")) and math.isnan(cf.parse_stat("nan\t"))  # type: ignore[arg-type]
    assert cf.parse_stat("N/A") == "null"  # 1.3.0's MindSpore compare of a Bool's Mean (None in the dump)
    assert cf.parse_stat("None") == "null" and cf.parse_stat(True) == 1.0 and cf.parse_stat("False") == 0.0
    assert cf.parse_stat("0.913090705871582") == 0.913090705871582


def test_1_0_1_names_map_to_the_later_naming() -> None:
    """1.0.1's compare row names, mapped to precnb's labels (forward as is, backward sections swapped)."""
    assert cf.expected_label("1.0.1", "Functional.linear.0.forward_input.1") == "Functional.linear.0.forward.input.1"
    assert cf.expected_label("1.0.1", "Module.fc1.Linear.forward.0_output.0") == "Module.fc1.Linear.forward.0.output.0"
    assert cf.expected_label("1.0.1", "Functional.linear.0.backward_input.0") == "Functional.linear.0.backward.output.0"
    assert cf.expected_label("1.0.1", "Module.fc2.Linear.backward.0_output.0") == "Module.fc2.Linear.backward.0.input.0"
    assert cf.expected_label("26.2.0", "Functional.linear.0.backward.input.0") == "Functional.linear.0.backward.input.0"


def _json(path: Path) -> dict:  # type: ignore[type-arg]
    return json.loads(path.read_text(encoding="utf-8"))


def _stats(leaf: dict) -> tuple:  # type: ignore[type-arg]
    return tuple(leaf.get(k) for k in ("Max", "Min", "Mean", "Norm"))


def test_1_0_1_backward_sections_mean_what_later_releases_write() -> None:
    """By value (raw JSON, no precnb): 1.0.1's ``grad_input`` is 26.2.0's backward ``output``, and so on.

    Same training, same step: the module backward records of both releases hold the same tensors, under
    swapped names. (This is what :func:`conformance.expected_label` relies on.)
    """
    old = _json(FIXTURES / "1.0.1" / "pt_L0" / "step0" / "rank" / "dump.json")["data"]
    new_dir = next((FIXTURES / cf.REFERENCE / "pt_L0" / "step0").iterdir())
    new = _json(new_dir / "dump.json")["data"]
    checked = 0
    for node, rec in old.items():
        if ".backward." not in node or node not in new:
            continue
        for old_key, new_key in (("grad_input", "output"), ("grad_output", "input")):
            olds = [_stats(x) for x in rec[old_key] if isinstance(x, dict)]
            news = [_stats(x) for x in new[node][new_key] if isinstance(x, dict)]
            assert olds == news, (node, old_key, new_key)
            checked += len(olds)
    assert checked >= 4


def test_release_fits() -> None:
    """precnb's release text is a single release, a range of consecutive releases, or a list."""
    assert cf.release_fits("8.2.0", "8.1.0–8.3.3") and not cf.release_fits("26.0.0", "8.1.0–8.3.3")
    assert cf.release_fits("26.1.0.post1", "26.1.0–26.2.0") and not cf.release_fits("26.0.0", "26.1.0–26.2.0")
    assert cf.release_fits("1.0.1", "1.0.1") and cf.release_fits("8.1.0", "1.0.1, 8.1.0")
    assert not cf.release_fits("1.0.3", "1.0.1, 8.1.0") and cf.release_fits("1.0.3", "")


def test_1_0_1_expected_order_puts_a_backward_input_first() -> None:
    """1.0.1's compare lists grad_input (-> .output) before grad_output (-> .input); precnb's seq the other way."""
    rows = [cf.TruthRow(n, cf.expected_label("1.0.1", n), "torch.float32", "[1]") for n in (
        "Module.fc2.Linear.forward.0_input.0", "Module.fc2.Linear.forward.0_output.0",
        "Module.fc2.Linear.backward.0_input.0", "Module.fc2.Linear.backward.0_output.0")]
    assert [r.label for r in cf.expected_order("1.0.1", rows)] == [
        "Module.fc2.Linear.forward.0.input.0", "Module.fc2.Linear.forward.0.output.0",
        "Module.fc2.Linear.backward.0.input.0", "Module.fc2.Linear.backward.0.output.0"]
    assert cf.expected_order("26.2.0", rows) == rows


def test_put_table_replaces_only_what_is_between_the_markers(tmp_path: Path) -> None:
    """``generate.py --table --readme`` keeps the README around the table; without markers it stops."""
    readme = tmp_path / "README.md"
    readme.write_text(f"intro\n{gen.TABLE_START}\nold\n{gen.TABLE_END}\nafter\n", encoding="utf-8")
    gen.put_table(readme, "| a |\n|---|")
    assert readme.read_text(encoding="utf-8") == f"intro\n{gen.TABLE_START}\n| a |\n|---|\n{gen.TABLE_END}\nafter\n"
    readme.write_text("no markers\n", encoding="utf-8")
    with pytest.raises(SystemExit, match="markers are missing"):
        gen.put_table(readme, "| a |")


def test_error_tail_keeps_the_exception_line() -> None:
    """A run's recorded error keeps the exception line when a long listing follows it (MindSpore compile errors)."""
    text = "Traceback (most recent call last):\nValueError: The key x does not exist\n" + "\n".join(
        f"# {i} In file cell_processor.py" for i in range(30))
    tail = gen._tail(text, 20)
    assert tail.splitlines()[0] == "ValueError: The key x does not exist"
    assert tail.endswith("# 29 In file cell_processor.py") and len(tail.splitlines()) == 22
    assert gen._tail("a\nRuntimeError: b\nc", 20) == "a\nRuntimeError: b\nc"
