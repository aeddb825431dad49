"""precnb's reading of the release fixtures, checked against each release's own compare reading.

Used by ``tests/test_msprobe_releases.py`` and by ``generate.py --table`` (needs precnb; reads only the
committed fixtures under ``tests/fixtures/msprobe_releases``).

What "read exactly" means here, per fixture (release x mode) and per rank file (step, rank folder):

- **the truth** is the release's compare result of the file against itself (``<mode>.truth.json``,
  written by ``_truth.py``): one row per argument, tensor or not. Rows whose dtype is a tensor dtype
  (``torch.*``; MindSpore's ``Float32``, ``Int64``, ``Bool``, ...) are the tensors; rows for scalars
  (dtype ``<class 'int'>``...) and for ``None`` arguments (dtype ``N/A``) are not tensors and precnb
  does not keep them as tensors (scalars are in ``attrs["scalar_args"]``).
- **names**: the compare's row name, mapped by :func:`expected_label` to precnb's tensor label. The
  mapping is the identity except where a release's compare names differ (see its docstring: 1.0.1's
  ``_input``/``_output`` separators and its backward sections).
- **checked per tensor**: present at that (step, rank); the label set equal both ways (no tensor
  missing, none extra); dtype (:func:`precnb.schema.entry_dtype`) and shape equal to the compare's
  text; Max/Min/Mean/Norm exactly equal as float64 (NaN == NaN, ±inf kept; the compare's ``None`` is
  a ``null`` statistic, which precnb marks in ``null_stats``; ``True``/``False`` of bool tensors are
  1.0/0.0); the CRC (``md5`` column) equal in md5 mode; the role (``input``/``output``/``parameter``/
  ``grad``) the one the section means; and the execution order (``seq``) the compare's row order
  (:func:`expected_order`: 1.0.1's backward rows are in its file order ``grad_input``, ``grad_output``,
  precnb's seq puts what a backward consumes, ``grad_output`` = ``.input``, before what it produces).
- tensors a release writes but its own compare does not read (:data:`COMPARE_DOES_NOT_READ`: 1.2.0's
  compare skips the ``parameters`` section and the ``parameters_grad`` records 1.2.0 writes) are checked
  the same way against the REFERENCE compare's row for the same tensor of the same (bit-identical) training.
- nothing is in ``load_report(ds).unread`` or skipped, and ``attrs["msprobe_release"]`` (the releases the
  dump's own evidence allows) includes the release that wrote it (:func:`release_fits`).
- not checked: ``requires_grad`` (precnb keeps it for parameters only, in a side table).
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

FIXTURES = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "msprobe_releases"
REFERENCE = "26.2.0"

# --- the MindSpore runs that cannot dump on this CPU machine, and why (the test's strict xfails, the table's text) ---
_GRAPH_CPU = ("no dump on CPU: msprobe dumps jit cells and GRAPH_MODE networks through MindSpore's graph dump, and "
              "MindSpore 2.10 refuses statistics there on CPU ('storing statistic dump is only supported on GPU and "
              "Ascend, please set saved_data to tensor'); the PyNative modes ms_L0/ms_L1/ms_mix/ms_md5 ran")
_V101_CELL = ("1.0.1's MindSpore debugger has no cell (L0) dump: msprobe/mindspore/debugger/debugger_config.py maps "
              "L0 to 'cell' and msprobe/mindspore/dump/dump_tool_factory.py DumpToolFactory.create raises "
              "'Exception: Cell dump in not supported now.' (line 35) at debugger.start()")
_V101_KBK = ("1.0.1 dumps MindSpore APIs (L1) only through MindSpore's kernel-by-kernel dump "
             "(msprobe/mindspore/dump/api_kbk_dump.py ApiKbkDump: api_kbk_dump.json with saved_data 'statistic', "
             "MINDSPORE_DUMP_CONFIG set), which MindSpore 2.10 refuses on CPU at the first op: 'RuntimeError: Dump "
             "Json parse failed, storing statistic dump is only supported on GPU and Ascend, please set saved_data "
             "to tensor' (dump_json_parser.cc ParseSavedData)")
_V101_MIX = ("1.0.1 has no level mix for MindSpore (ms_md5 is md5 at mix, ms_jit is at mix): "
             "msprobe/mindspore/debugger/debugger_config.py DebuggerConfig.convert_map knows L0/L1/L2 only "
             "(line 18): KeyError: 'mix' in "
             "PrecisionDebugger(config_path=...); md5 at L1 would be the kernel dump above, refused on CPU")
_V10X_MIX = ("1.0.3 and 1.0.4 accept level mix for MindSpore but hook nothing there (msprobe/mindspore/service.py "
             "Service.register_hook_new: API hooks for level 'L1', cell hooks for 'L0' only), so they write dump.json "
             "with 'data': {} (precnb reads it as empty and says so: test_1_0_x_mindspore_mix_dumps_are_empty), and "
             "their own compare of it fails with no row to compare (msprobe/core/compare/highlight.py "
             "find_compare_result_error_rows, 'if state:': UnboundLocalError: cannot access local variable 'state')")
_GRAPH_CELL = ("GRAPH_MODE at level L0 is refused: msprobe/mindspore/dump/dump_tool_factory.py DumpToolFactory.create "
               "(1.0.3-1.3.0) has no cell tool for execution mode graph_kbyk: 'Data dump is not supported in "
               "graph_kbyk mode when dump level is cell.' (an Exception; 1.3.0 logs it and raises ValueError)")
_JIT_HOOKS = ("the cells inside the jit cell get this release's PyNative cell hooks, which MindSpore 2.10 compiles "
              "into the jit graph: msprobe/mindspore/cell_processor.py set_cell_count ('return "
              "CellProcessor.cell_count[cell_name]') reads a dict the graph holds as a constant, without the key the "
              "hook adds at run time: 'ValueError: The key Cell.head.fc2.Dense.forward does not exist in the dict' "
              "(MindSpore's graph compile, at the first step)")
_V810_RANK = ("8.1.0 hands jit cells and GRAPH_MODE networks to MindSpore's graph dump and fails writing its config "
              "when RANK_ID is unset: msprobe/mindspore/dump/cell_dump_process.py create_kbyk_json sets rank_id = 0 "
              "(an int) and joins rank_id + 'kernel_kbyk_dump.json': 'TypeError: unsupported operand type(s) for +: "
              "'int' and 'str''; 8.1.1 fixed it, and then meets MindSpore's refusal of statistics on CPU (as 8.1.1 on)")
#: short text (README table) -> long text (the strict xfail's reason)
MS_GAP_TEXTS: dict[str, str] = {
    "1.0.1: no MindSpore cell dump ('Cell dump in not supported now.')": _V101_CELL,
    "1.0.1: L1 only through MindSpore's kernel dump, statistics need GPU/Ascend": _V101_KBK,
    "1.0.1: no level mix for MindSpore (KeyError: 'mix')": _V101_MIX,
    "level mix hooks nothing: empty dump.json, its compare fails (UnboundLocalError)": _V10X_MIX,
    "GRAPH_MODE L0: 'Data dump is not supported in graph_kbyk mode when dump level is cell.'": _GRAPH_CELL,
    "jit: cell hooks compiled into the jit graph fail ('The key ... does not exist in the dict')": _JIT_HOOKS,
    "jit/graph: create_kbyk_json int + str (RANK_ID unset), fixed in 8.1.1": _V810_RANK,
    "graph/jit statistics need GPU/Ascend": _GRAPH_CPU,
}
_SHORT = {long: short for short, long in MS_GAP_TEXTS.items()}
#: long text -> what the failed run's recorded error must contain (the reason is checked, not only the failure)
MS_GAP_EVIDENCE: dict[str, str] = {_GRAPH_CPU: "only supported on GPU and Ascend",
                                   _V101_CELL: "Exception: Cell dump in not supported now.",
                                   _V101_KBK: "only supported on GPU and Ascend",
                                   _V101_MIX: "KeyError: 'mix'",
                                   _V10X_MIX: "UnboundLocalError: cannot access local variable 'state'",
                                   _GRAPH_CELL: "not supported in graph_kbyk mode when dump level is cell.",
                                   _JIT_HOOKS: "ValueError: The key Cell.head.fc2.Dense.forward does not exist",
                                   _V810_RANK: "rank_id + \"kernel_kbyk_dump.json\""}
#: (release, mode) -> why the MindSpore run cannot dump here (long text of MS_GAP_TEXTS)
_OLD_1X = ("1.1.0", "1.1.1", "1.2.0", "1.2.1", "1.2.2", "1.3.0")
_GRAPH_DUMP = ("8.1.1", "8.1.2", "8.2.0", "8.2.1", "8.3.0", "8.3.1", "8.3.2", "8.3.3", "26.0.0", "26.1.0",
               "26.1.0.post1", "26.2.0")
MS_GAPS: dict[tuple[str, str], str] = {
    ("1.0.1", "ms_L0"): _V101_CELL, ("1.0.1", "ms_L1"): _V101_KBK, ("1.0.1", "ms_graph"): _V101_CELL,
    **{("1.0.1", m): _V101_MIX for m in ("ms_mix", "ms_md5", "ms_jit")},
    **{(v, m): _V10X_MIX for v in ("1.0.3", "1.0.4") for m in ("ms_mix", "ms_md5", "ms_jit")},
    **{(v, "ms_graph"): _GRAPH_CELL for v in ("1.0.3", "1.0.4", *_OLD_1X)},
    **{(v, "ms_jit"): _JIT_HOOKS for v in _OLD_1X},
    ("8.1.0", "ms_jit"): _V810_RANK, ("8.1.0", "ms_graph"): _V810_RANK,
    **{(v, m): _GRAPH_CPU for v in _GRAPH_DUMP for m in ("ms_jit", "ms_graph")},
}
STATS = ("max", "min", "mean", "norm")
_NULL = "null"
_TORCH_DTYPE = re.compile(r"^torch\.\w+$")
_MS_DTYPE = re.compile(r"^(Float|BFloat|Int|UInt)\d+$|^Bool$|^Complex\d+$")
_RANK_NUM = re.compile(r"^(?:rank(\d*)|proc\d+)$")


def recorded_failure(version: str, mode: str, root: Path = FIXTURES) -> str:
    """What a run recorded of its failure: the run's error, else the logs of its release's failed compare."""
    run = release_record(version, root)["runs"][mode]
    if not run["ok"]:
        return str(run.get("error") or "")
    truth = root / version / f"{fixture_name(mode)}.truth.json"
    if run.get("truth", {}).get("ok") or not truth.is_file():
        return ""
    files = json.loads(truth.read_text(encoding="utf-8"))["files"].values()
    return "\n".join(str(f.get("log", "")) for f in files if "rows" not in f)


def version_key(version: str) -> tuple[int, ...]:
    """Sortable release number (``26.1.0.post1`` after ``26.1.0``)."""
    return tuple(int(p) for p in re.findall(r"\d+", version))


def releases(root: Path = FIXTURES) -> list[str]:
    """The releases with a ``release.json`` under *root*, oldest first."""
    return sorted((p.name for p in root.iterdir() if (p / "release.json").is_file()), key=version_key)


def release_record(version: str, root: Path = FIXTURES) -> dict[str, Any]:
    """The ``release.json`` of one release."""
    return json.loads((root / version / "release.json").read_text(encoding="utf-8"))


def fixtures(root: Path = FIXTURES) -> list[tuple[str, str]]:
    """(release, mode) of every fixture whose dump and truth were both written."""
    out = []
    for v in releases(root):
        for mode, run in release_record(v, root)["runs"].items():
            if run.get("ok") and run.get("truth", {}).get("ok"):
                out.append((v, mode))
    return out


def fixture_name(mode: str) -> str:
    """The folder of a mode's dump under a release (``pt_<mode>``; MindSpore modes are named ``ms_*``)."""
    return mode if mode.startswith("ms_") else f"pt_{mode}"


def rank_of(folder: str) -> int:
    """The rank a rank folder means (``proc<PID>`` and a bare ``rank`` are rank 0)."""
    m = _RANK_NUM.match(folder)
    if m is None:
        raise ValueError(f"not a rank folder: {folder}")
    return int(m.group(1)) if m.group(1) else 0


def is_tensor_dtype(dtype: Any) -> bool:
    """Whether a compare row's dtype text names a tensor dtype (not a scalar, not ``N/A``)."""
    text = str(dtype).strip()
    return bool(_TORCH_DTYPE.match(text) or _MS_DTYPE.match(text))


def parse_stat(cell: Any) -> float | str:
    r"""A compare statistic cell as float64, or ``"null"`` for a statistic written as ``null``.

    Conventions of the compare outputs: csv text is Python ``repr`` of the float (exact); ``" inf"``/
    ``" -inf"`` (26.x, leading space) and ``"inf\t"`` (1.x xlsx, trailing tab) are infinities; ``Nan``/
    ``nan`` is NaN; ``None`` (``N/A`` in 1.x's MindSpore compare) is a ``null`` statistic; ``True``/``False``
    (bool tensors' Max/Min) are 1/0.
    """
    if isinstance(cell, bool):
        return float(cell)
    if isinstance(cell, (int, float)):
        return float(cell)
    if cell is None:
        return _NULL
    text = str(cell).strip()
    low = text.lower()
    if low in ("none", "null", "n/a"):  # "N/A": 1.x's MindSpore compare of a null statistic (a Bool's Mean)
        return _NULL
    if low == "true":
        return 1.0
    if low == "false":
        return 0.0
    if low.startswith("nan"):
        return math.nan
    return float(text)


def expected_label(version: str, name: str) -> str:
    """The precnb tensor label for a compare row name of *version*.

    From 1.0.3 on the compare names rows as precnb does (``{node}.input.0``, ``{node}.output.0``,
    ``{node}.parameters.weight``, ``{node}.{param}`` for parameters_grad): the identity.

    1.0.1's compare joins the node and the section with ``_`` (``Functional.linear.0.forward_input.0``),
    and names the sections of a backward record after the dump's keys ``grad_input``/``grad_output``:
    its ``{node}_input.N`` is ``grad_input`` — the gradients with respect to the forward's *inputs*,
    which later releases write as the backward record's ``output`` — and its ``{node}_output.N`` is
    ``grad_output`` (later: ``input``). precnb follows the later naming, so the mapping is
    forward ``_input``/``_output`` -> ``.input``/``.output`` and backward ``_input`` -> ``.output``,
    ``_output`` -> ``.input`` (checked by value against the 26.2.0 dump of the same training:
    ``test_msprobe_releases.py::test_1_0_1_backward_sections_mean_what_later_releases_write``).
    """
    if version_key(version) >= (1, 0, 3):
        return name
    m = re.match(r"^(?P<node>.+?\.(?:forward|backward)(?:\.\d+)?)_(?P<sec>input|output)(?P<rest>(?:\..*)?)$", name)
    if m is None:
        return name
    node, sec, rest = m.group("node"), m.group("sec"), m.group("rest")
    if ".backward" in node:
        sec = {"input": "output", "output": "input"}[sec]
    return f"{node}.{sec}{rest}"


def expected_order(version: str, rows: list[TruthRow]) -> list[TruthRow]:
    """The compare's rows in the order precnb's ``seq`` has them (the compare's own order from 1.0.3 on).

    1.0.1's dump (and compare) list a backward record's ``grad_input`` before its ``grad_output``; precnb reads
    a record's sections in execution order, what the op consumes (``.input`` = ``grad_output``) before what it
    produces (``.output`` = ``grad_input``), as later releases write them. So for 1.0.1 the rows of each
    backward record are stably reordered ``.input`` first; record order and order within a section stay.
    """
    if version_key(version) >= (1, 0, 3):
        return rows
    out: list[TruthRow] = []
    k = 0
    while k < len(rows):
        node = node_of(rows[k].label)
        j = k
        while j < len(rows) and node_of(rows[j].label) == node:
            j += 1
        group = rows[k:j]
        if ".backward" in node:
            group = sorted(group, key=lambda r: r.label[len(node):].startswith(".output"))
        out.extend(group)
        k = j
    return out


def expected_role(label: str, node: str) -> str:
    """The role the section of *label* means (``grad`` for a parameters_grad record)."""
    if "parameters_grad" in node:
        return "grad"
    rest = label[len(node):]
    for section, role in ((".parameters", "parameter"), (".input", "input"), (".output", "output")):
        if rest.startswith(section):
            return role
    return ""


def node_of(label: str) -> str:
    """The node record of a (precnb-style) tensor label."""
    m = re.match(r"^(.+?\.(?:forward|backward)(?:\.\d+)?)\.(?:input|output|parameters)(?:\.|$)", label)
    if m:
        return m.group(1)
    m = re.match(r"^(.+?\.parameters_grad(?:\.\d+)?)\.", label)
    return m.group(1) if m else label


@dataclass
class TruthRow:
    """One tensor row of a release's compare output."""

    name: str
    label: str
    dtype: str
    shape: str
    stats: dict[str, float | str] = field(default_factory=dict)
    md5: str | None = None


def load_truth(version: str, mode: str, root: Path = FIXTURES) -> dict[tuple[str, int, int], list[TruthRow]]:
    """The tensor rows of one fixture's truth file, per (tree, step, rank), in the compare's row order.

    *tree* is ``""`` for a dump root with ``step*`` folders, else the folder they are in (``graph``,
    ``pynative``: MindSpore jit dumps).
    """
    doc = json.loads((root / version / f"{fixture_name(mode)}.truth.json").read_text(encoding="utf-8"))
    out: dict[tuple[str, int, int], list[TruthRow]] = {}
    for rel, entry in doc["files"].items():
        *tree, step_dir, rank_dir = rel.split("/")
        key = ("/".join(tree), int(step_dir[4:]), rank_of(rank_dir))
        cols = entry["columns"]
        rows = []
        for raw in entry["rows"]:
            cell = dict(zip(cols, raw, strict=True))
            if not is_tensor_dtype(cell.get("dtype")):
                continue
            row = TruthRow(name=str(cell["name"]), label=expected_label(version, str(cell["name"])),
                           dtype=str(cell["dtype"]).strip(), shape=str(cell.get("shape", "")).strip())
            row.stats = {s: parse_stat(cell[s]) for s in STATS if s in cell}
            if "md5" in cell:
                row.md5 = str(cell["md5"]).strip()
            rows.append(row)
        out[key] = rows
    return out


def _same(a: float, b: float | str, null: bool) -> bool:
    if b == _NULL:
        return null
    if null:
        return False
    assert isinstance(b, float)
    return (math.isnan(a) and math.isnan(b)) or a == b


@dataclass
class ReadResult:
    """What differs between precnb's reading of one fixture and the release's compare reading."""

    release: str
    mode: str
    tensors: int = 0  # truth tensor rows checked (all steps and ranks)
    cross_checked: int = 0  # tensors the release's compare does not read, checked against REFERENCE's
    problems: dict[str, list[str]] = field(default_factory=dict)  # kind -> examples

    def add(self, kind: str, text: str) -> None:
        """Record one difference of *kind*."""
        self.problems.setdefault(kind, []).append(text)

    @property
    def ok(self) -> bool:
        """True when precnb reads every tensor as the release's compare does."""
        return not self.problems

    def summary(self) -> str:
        """One line: ``✓`` or the kinds of differences with their counts and one example each."""
        if self.ok:
            return "✓"
        return "; ".join(f"{kind}: {len(v)} (e.g. {v[0]})" for kind, v in sorted(self.problems.items()))


#: sections a release writes but its own compare does not read: release -> (kind of label, what it is).
#: precnb's reading of these tensors is checked against the REFERENCE compare's values for the same tensor of
#: the same training (the trainings are bit-identical), matched by :func:`reference_key`.
COMPARE_DOES_NOT_READ: dict[str, tuple[str, ...]] = {
    "1.2.0": ("parameters", "parameters_grad"),
}


def section_kind(label: str) -> str:
    """``parameters`` (a forward record's parameter), ``parameters_grad`` (a param-grad record) or ``""``."""
    if ".parameters_grad" in label:
        return "parameters_grad"
    return "parameters" if re.search(r"\.forward\.\d+\.parameters\.", label) else ""


def reference_key(label: str) -> str:
    """A label with the parameters_grad counter removed (1.x writes ``...parameters_grad.w``, 26.x ``.0.w``)."""
    return re.sub(r"\.parameters_grad(?:\.\d+)?\.", ".parameters_grad.", label)


def check_read(version: str, mode: str, root: Path = FIXTURES) -> ReadResult:
    """Read ``<version>/<fixture>`` with precnb and compare it tensor by tensor with the truth (per tree)."""
    res = ReadResult(version, mode)
    truth = load_truth(version, mode, root)
    unread = COMPARE_DOES_NOT_READ.get(version, ())
    ref: dict[tuple[str, int, int], dict[str, TruthRow]] = {}
    if unread:
        ref = {k: {reference_key(r.label): r for r in rows} for k, rows in load_truth(REFERENCE, mode, root).items()}
    for tree in sorted({k[0] for k in truth}):
        rows_of = {(s, r): rows for (t, s, r), rows in truth.items() if t == tree}
        ref_of = {(s, r): rows for (t, s, r), rows in ref.items() if t == tree}
        _check_tree(res, root / version / fixture_name(mode) / tree, rows_of, tree, unread, ref_of)
    return res


class _Entries:
    """precnb's values at one (step, rank) of a dataset, by tensor label."""

    def __init__(self, ds: Any, si: int, ri: int) -> None:
        self.ds = ds
        self.step, self.rank = int(ds["step"].values[si]), int(ds["rank"].values[ri])
        self.present = ds["present"].values[si, ri]
        self.cols = {s: ds[s].values[si, ri] for s in STATS}
        self.nulls = ds["null_stats"].values[si, ri]
        self.seqs = ds["seq"].values[si, ri]
        self.crcs = ds["crc"].values[si, ri] if "crc" in ds else None
        self.shapes = [str(x) for x in ds["shape"].values]

    def check(self, res: ReadResult, i: int, label: str, row: TruthRow, where: str, against: str) -> None:
        """Record every difference between precnb's entry *i* and *row* (dtype, shape, statistics, CRC)."""
        from precnb.schema import entry_dtype

        dt = entry_dtype(self.ds, label, self.step, self.rank)
        if dt != row.dtype:
            res.add("dtype", f"{label} ({where}): {dt!r} vs {against} {row.dtype!r}")
        if self.shapes[i].replace(" ", "") != row.shape.replace(" ", ""):
            res.add("shape", f"{label}: {self.shapes[i]} vs {against} {row.shape}")
        for bit, s in enumerate(STATS):
            if s in row.stats:
                got = float(self.cols[s][i])
                if not _same(got, row.stats[s], bool(int(self.nulls[i]) >> bit & 1)):
                    res.add("value", f"{label} {s} ({where}): {got!r} vs {against} {row.stats[s]!r}")
        if row.md5 is not None and row.md5 not in ("N/A", ""):
            got_crc = str(self.crcs[i]) if self.crcs is not None else ""
            if got_crc != row.md5:
                res.add("crc", f"{label} ({where}): {got_crc!r} vs {against} {row.md5!r}")


def release_fits(version: str, said: str) -> bool:
    """Whether precnb's ``attrs["msprobe_release"]`` allows *version*.

    The text is ``"8.1.0"``, ``"8.1.0–8.3.3"`` (consecutive releases), ``"1.0.1, 8.1.0"`` or ``""`` (no
    evidence either way: every release).
    """
    if not said:
        return True
    if "–" in said:
        lo, hi = said.split("–")
        return version_key(lo) <= version_key(version) <= version_key(hi)
    return version in [p.strip() for p in said.split(",")]


def _check_tree(res: ReadResult, path: Path, truth: dict[tuple[int, int], list[TruthRow]], tree: str,
                unread: tuple[str, ...], ref: dict[tuple[int, int], dict[str, TruthRow]]) -> None:
    import numpy as np

    import precnb

    ds = precnb.open_run(path, workers=1, progress=False)
    report = precnb.load_report(ds)
    for s in report.skipped:
        res.add("file skipped", str(s))
    for u in report.unread:
        res.add("unread", " / ".join(map(str, u)))
    said = str(ds.attrs.get("msprobe_release", ""))
    evidence = json.loads(str(ds.attrs.get("msprobe_release_evidence") or "{}"))
    # "" is both "no evidence" and "the evidence contradicts itself": the candidates say which
    if not release_fits(res.release, said) or res.release not in evidence.get("candidates", [res.release]):
        res.add("release", f"precnb says the dump is from {said!r} ({evidence})")
    labels = [str(t) for t in ds["tensor"].values]
    index = {t: i for i, t in enumerate(labels)}
    roles = [str(r) for r in ds["role"].values]
    steps = [int(s) for s in ds["step"].values]
    ranks = [int(r) for r in ds["rank"].values]
    prefix = f"{tree}/" if tree else ""
    for (step, rank), rows in sorted(truth.items()):
        if step not in steps or rank not in ranks:
            res.add("step/rank not read", f"{prefix}step {step} rank {rank}")
            continue
        at = _Entries(ds, steps.index(step), ranks.index(rank))
        where = f"{prefix}step{step} rank{rank}"
        seen = set()
        order = []
        for row in expected_order(res.release, rows):
            res.tensors += 1
            seen.add(row.label)
            i = index.get(row.label)
            if i is None or not at.present[i]:
                res.add("tensor missing", f"{row.name} ({where})" + ("" if row.label == row.name
                                                                       else f" as {row.label}"))
                continue
            order.append(int(at.seqs[i]))
            node = node_of(row.label)
            if roles[i] != expected_role(row.label, node):
                res.add("role", f"{row.label}: {roles[i]!r}, its section means {expected_role(row.label, node)!r}")
            at.check(res, i, row.label, row, where, "compare")
        if order != sorted(order):
            first = next(k for k in range(1, len(order)) if order[k] < order[k - 1])
            res.add("order", f"{where}: precnb's seq is not the compare's row order (first at row {first})")
        for i in np.flatnonzero(at.present):
            label = labels[i]
            if not roles[i]:
                res.add("role empty", f"{label} ({where})")
            if label in seen:
                continue
            if section_kind(label) in unread:  # the release's compare skips it: the reference compare's values
                ref_row = ref.get((step, rank), {}).get(reference_key(label))
                if ref_row is None:
                    res.add("tensor not in compare", f"{label} ({where}; not in {REFERENCE}'s compare either)")
                else:
                    res.cross_checked += 1
                    at.check(res, int(i), label, ref_row, where, f"{REFERENCE} compare")
                continue
            res.add("tensor not in compare", f"{label} ({where})")


def roles_summary(ds: Any) -> Counter[str]:
    """Counts of the ``role`` coordinate (an empty role is a tensor precnb could not place)."""
    return Counter(str(r) for r in ds["role"].values)


@dataclass
class DiffResult:
    """What ``precnb diff`` says of REFERENCE's dump (baseline) against a release's (target)."""

    release: str
    mode: str
    exit_code: int
    finding: dict[str, Any]

    @property
    def ok(self) -> bool:
        """No divergence: exit 0, kind ``none``, something compared."""
        stats = self.finding.get("stats") or {}
        return self.exit_code == 0 and self.finding.get("kind") == "none" and stats.get("compared_records", 0) > 0

    def summary(self) -> str:
        """``✓`` or what precnb reports instead."""
        if self.ok:
            return "✓"
        f = self.finding
        where = f.get("tensor") or f.get("node") or ""
        stats = f.get("stats") or {}
        return (f"exit {self.exit_code}, {f.get('kind')}: {str(f.get('reason', ''))[:160]}"
                + (f" at {where}" if where else "") + f" (compared {stats.get('compared_records', 0)})")


def diff_mode(mode: str) -> str:
    """The REFERENCE fixture a mode is diffed against (the same mode)."""
    return mode


def check_diff(version: str, mode: str, root: Path = FIXTURES) -> DiffResult:
    """``precnb diff REFERENCE/pt_<mode> <version>/pt_<mode> --json`` in this process."""
    import contextlib
    import io

    from precnb.cli import main

    out, err = io.StringIO(), io.StringIO()
    base = root / REFERENCE / fixture_name(diff_mode(mode))
    target = root / version / fixture_name(mode)
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["diff", str(base), str(target), "--json", "--workers", "1"])
    text = out.getvalue().strip()
    try:
        finding = json.loads(text) if text else {}
    except json.JSONDecodeError:
        finding = {"kind": "unparsable output", "reason": text[:200]}
    if not finding:
        finding = {"kind": "no output", "reason": err.getvalue().strip()[-300:]}
    return DiffResult(version, mode, code, finding)


def _install_text(rec: dict[str, Any]) -> str:
    inst = rec["install"]
    if not inst.get("ok"):
        return "not installed: " + (inst.get("error") or "?").strip().splitlines()[-1][:120]
    v = inst["versions"]
    return f"torch {v['torch']}, numpy {v['numpy']}"


def _error_line(text: str) -> str:
    """The exception line of a traceback (the last ``...Error: ...``/``...Exception: ...``), else its last line."""
    lines = text.strip().splitlines() or ["?"]
    found = [ln.strip() for ln in lines if re.match(r"^\s*[\w.]*(?:Error|Exception)\b", ln)]
    return found[-1] if found else lines[-1].strip()


def _notes(rec: dict[str, Any]) -> str:
    """What the release needed beside torch 2.13.0 (pins, shims) and its MindSpore install, if tried."""
    notes = []
    pins = rec["install"].get("pins", {}).get("requirements")
    if pins:
        notes.append("pins " + ", ".join(f"`{p}`" for p in pins))
    shims = rec.get("shims", {}).get("names")
    if shims:
        notes.append("shim " + ", ".join(f"`{s}`" for s in shims))
    ms_shims = rec.get("shims_ms", {}).get("names")
    if ms_shims:
        notes.append("MindSpore shim " + ", ".join(f"`{s}`" for s in ms_shims))
    ms = rec.get("install_ms")
    if ms is not None:
        notes.append(f"MindSpore {ms['versions']['mindspore']} installed" if ms.get("ok") else
                     "MindSpore not installed: " + (ms.get("error") or "?").strip().splitlines()[-1][:100])
    return "; ".join(notes) or "—"


def readme_table(root: Path = FIXTURES) -> str:
    """The README's "msprobe releases" table, computed from the committed fixtures (needs precnb).

    Per release: how it installed; the modes whose every tensor precnb reads as the release's own compare
    does (or what differs); the modes whose ``precnb diff`` against the REFERENCE dump of the same mode is
    clean (or what it reports); notes (pins, shims, MindSpore).
    """
    lines = ["| release | installs with | read exactly (vs the release's own compare) | "
             f"compared: `precnb diff` vs {REFERENCE} | notes |", "|---|---|---|---|---|"]
    for v in releases(root):
        rec = release_record(v, root)
        good, bad, diff_good, diff_bad = [], [], [], []
        failed: dict[str, list[str]] = {}  # the last line of a failed run's error -> its modes
        for mode, run in rec["runs"].items():
            if not run.get("ok"):
                why = _SHORT.get(MS_GAPS.get((v, mode), ""), "") or _error_line(run.get("error") or "?")[:110]
                failed.setdefault(why, []).append(mode)
                continue
            if not run.get("truth", {}).get("ok"):
                why = _SHORT.get(MS_GAPS.get((v, mode), ""), "") or "its compare failed"
                failed.setdefault(why, []).append(mode)
                continue
            r = check_read(v, mode, root)
            if r.ok:
                good.append(mode)
            else:
                bad.append(f"{mode}: " + ", ".join(f"{k} {len(x)}" for k, x in sorted(r.problems.items())))
            if v != REFERENCE and (root / REFERENCE / fixture_name(mode)).is_dir():
                d = check_diff(v, mode, root)
                if d.ok:
                    diff_good.append(mode)
                else:
                    diff_bad.append(f"{mode}: {d.finding.get('kind')} — {str(d.finding.get('reason', ''))[:90]}")
        bad += [f"{' '.join(modes)}: no dump ({why})" for why, modes in failed.items()]
        if not rec["install"].get("ok"):
            read_text = diff_text = "—"
        else:
            read_text = "; ".join(([f"✓ {' '.join(good)}"] if good else []) + bad)
            diff_text = "(reference)" if v == REFERENCE else "; ".join(
                ([f"✓ {' '.join(diff_good)}"] if diff_good else []) + diff_bad)
        lines.append(f"| {v} | {_install_text(rec)} | {_escape(read_text)} | {_escape(diff_text)} | "
                     f"{_escape(_notes(rec))} |")
    return "\n".join(lines)


def _escape(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")
