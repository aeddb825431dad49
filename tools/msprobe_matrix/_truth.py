"""Read a dump with one msprobe release's own compare (a standalone script, run in that release's venv).

Run by ``generate.py`` with the interpreter of the release's venv::

    /work/venvs/msprobe-<version>/bin/python tools/msprobe_matrix/_truth.py DUMP_ROOT OUT.json SCRATCH [SHIMS]

For every ``[tree/]step*/<rank folder>/dump.json`` under ``DUMP_ROOT`` (a tree folder: MindSpore's
``graph/`` and ``pynative/`` of a jit dump) it runs that release's compare of the
file against itself (the same file as target and golden, stack.json beside it), the way a user
would: ``msprobe compare -tp dump.json -gp dump.json -o DIR`` from 26.0.0 on,
``msprobe -f pytorch|mindspore compare -i input.json -o DIR -s`` from 1.0.3 to 8.3.3, and the Python
function ``msprobe.pytorch.compare(input_param, DIR, stack_mode=True)`` in 1.0.1 (its command line
has no compare). Each runs in a subprocess of the release's interpreter (``_BOOT``: the shims of
``_pt_worker.apply_shims``, then the release's own ``msprobe.msprobe.main`` or ``compare``).

The result file the release wrote (``compare_result_*.csv`` or ``.xlsx``) is read back: a csv as
written (cells as text; pandas writes floats as their ``repr``, which is exact), an xlsx as the
cells msprobe put into the workbook (captured at ``openpyxl`` ``Workbook.save``: numbers as numbers,
text as text; the file itself holds floats rounded to 16 significant digits by openpyxl, which would
lose the last digit of a float32 statistic). The columns that describe the target side are kept:
name, dtype, shape, requires_grad, max/min/mean/l2norm and MD5 (``NPU ...`` columns; the golden side
is the same file). It imports msprobe (and openpyxl), never precnb.
"""

from __future__ import annotations

import csv
import json
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path

#: result-file columns kept (case-insensitive header match) -> the key in the truth file
KEEP = {"npu name": "name", "npu dtype": "dtype", "npu tensor dtype": "dtype", "npu tensor shape": "shape",
        "npu requires_grad": "requires_grad", "npu max": "max", "npu min": "min", "npu mean": "mean",
        "npu l2norm": "norm", "npu md5": "md5"}
_RANK = re.compile(r"^(rank\d*|proc\d+)$")


def _version() -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", metadata.version("mindstudio-probe"))[:3])


def _framework(dump_json: Path) -> str:
    """``mindspore`` for a dump under a matrix ``ms_*`` folder or one that says so in its head, else ``pytorch``.

    (Before 1.2.1 a dump has no ``framework`` key, and a mix dump's head can be cells only.)
    """
    if any(p.name.startswith("ms_") for p in dump_json.parents):
        return "mindspore"
    head = dump_json.read_text(encoding="utf-8")[:4000]
    return "mindspore" if '"mindspore' in head or '"framework": "mindspore"' in head else "pytorch"


_BOOT = """
import json, sys
sys.path.insert(0, sys.argv[1])
from _pt_worker import apply_shims
apply_shims([s for s in sys.argv[2].split(",") if s])
import openpyxl.workbook.workbook as _wb
_save = _wb.Workbook.save
def _save_and_keep(self, filename):  # the cells msprobe put into the workbook, before openpyxl rounds them
    sheets = [[[c.value for c in row] for row in ws.iter_rows()] for ws in self.worksheets]
    path = getattr(filename, "name", filename)  # pandas' ExcelWriter saves to an open file
    with open(str(path) + ".cells.json", "w", encoding="utf-8") as fh:
        json.dump([[[v if v is None or isinstance(v, (bool, int, float)) else str(v) for v in r] for r in sh]
                   for sh in sheets], fh)
    return _save(self, filename)
_wb.Workbook.save = _save_and_keep
mode, args = sys.argv[3], json.loads(sys.argv[4])
if mode == "cli":
    sys.argv = ["msprobe", *args]
    from msprobe.msprobe import main
    sys.exit(main())
if mode == "ms_function":
    from msprobe.mindspore.compare.ms_compare import ms_compare
    sys.exit(ms_compare(args[0], args[1], stack_mode=True))
from msprobe.pytorch import compare
compare(args[0], args[1], stack_mode=True)
"""


def _run_compare(dump_json: Path, out_dir: Path, shims: list[str]) -> tuple[str, int, str]:
    """Run the release's compare of *dump_json* against itself; (how, exit code, log tail)."""
    stack = dump_json.with_name("stack.json")
    out_dir.mkdir(parents=True, exist_ok=True)
    version = _version()
    fw = _framework(dump_json)
    if version >= (26, 0, 0):
        mode, args = "cli", ["compare", "-tp", str(dump_json), "-gp", str(dump_json), "-o", str(out_dir)]
        how = "msprobe compare -tp dump.json -gp dump.json -o OUT"
    elif version == (1, 0, 3) and fw == "mindspore":  # its command line imports torch for MindSpore's run_ut
        param = {"npu_json_path": str(dump_json), "bench_json_path": str(dump_json), "stack_json_path": str(stack),
                 "is_print_compare_log": True}
        mode, args = "ms_function", [param, str(out_dir)]
        how = ("python: msprobe.mindspore.compare.ms_compare.ms_compare(input_param, OUT, stack_mode=True), what "
               "`msprobe -f mindspore compare -i` calls (msprobe/core/compare/compare_cli.py); 1.0.3's command line "
               "imports torch (msprobe/mindspore/api_accuracy_checker/compute_element.py): ModuleNotFoundError "
               "without PyTorch")
    elif version >= (1, 0, 3):
        spec = out_dir / "input.json"
        spec.write_text(json.dumps({"npu_path": str(dump_json), "bench_path": str(dump_json),
                                    "stack_path": str(stack), "is_print_compare_log": True}), encoding="utf-8")
        mode, args = "cli", ["-f", fw, "compare", "-i", str(spec), "-o", str(out_dir), "-s"]
        how = f"msprobe -f {fw} compare -i input.json -o OUT -s"
    else:
        param = {"npu_json_path": str(dump_json), "bench_json_path": str(dump_json), "stack_json_path": str(stack),
                 "is_print_compare_log": True}
        mode, args = "function", [param, str(out_dir)]
        how = "python: msprobe.pytorch.compare(input_param, OUT, stack_mode=True)"
    cmd = [sys.executable, "-c", _BOOT, str(Path(__file__).resolve().parent), ",".join(shims), mode, json.dumps(args)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, check=False)
    tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-15:])
    return how, proc.returncode, tail


def _read_result(path: Path) -> tuple[list[str], list[list[object]]]:
    if path.suffix == ".csv":
        with open(path, newline="", encoding="utf-8") as fh:
            rows = list(csv.reader(fh))
        return rows[0], rows[1:]
    cells = Path(str(path) + ".cells.json")  # what msprobe put into the workbook (see _BOOT)
    rows = json.loads(cells.read_text(encoding="utf-8"))[0]
    return [str(h) for h in rows[0]], rows[1:]


def _cell(value: object) -> object:
    if isinstance(value, float) and value != value:
        return "nan (xlsx NaN cell)"
    return value


def _dumps(doc: dict) -> str:  # type: ignore[type-arg]
    """JSON with one result row per line (small, and a diff shows the rows that changed)."""
    lines = ["{", f' "mindstudio-probe": {json.dumps(doc["mindstudio-probe"])},', ' "files": {']
    items = list(doc["files"].items())
    for n, (rel, entry) in enumerate(items):
        head = {k: v for k, v in entry.items() if k != "rows"}
        body = json.dumps(head, ensure_ascii=False)[:-1]
        rows = entry.get("rows")
        if rows is None:
            lines.append(f"  {json.dumps(rel)}: {body}}}" + ("," if n < len(items) - 1 else ""))
            continue
        lines.append(f'  {json.dumps(rel)}: {body}, "rows": [')
        lines.extend("   " + json.dumps(r, ensure_ascii=False) + ("," if i < len(rows) - 1 else "")
                     for i, r in enumerate(rows))
        lines.append("  ]}" + ("," if n < len(items) - 1 else ""))
    lines += [" }", "}"]
    return "\n".join(lines) + "\n"


def main(root: str, out: str, scratch: str, shims_arg: str = "") -> int:
    """Write the truth JSON of every rank file under *root* to *out* (*shims_arg*: ``_pt_worker.apply_shims``)."""
    shims = [s for s in shims_arg.split(",") if s]
    root_p, scratch_p = Path(root), Path(scratch)
    files: dict[str, object] = {}
    # step*/<rank>/dump.json, also below a tree folder (MindSpore jit dumps: graph/ and pynative/)
    rank_dirs = sorted(p.parent for p in root_p.rglob("dump.json")
                       if _RANK.match(p.parent.name) and re.match(r"^step\d+$", p.parent.parent.name))
    for rank_dir in rank_dirs:
        rel = rank_dir.relative_to(root_p).as_posix()
        work = scratch_p / rel.replace("/", "_")
        how, code, tail = _run_compare(rank_dir / "dump.json", work, shims)
        found = sorted(work.glob("compare_result*.csv")) + sorted(work.glob("compare_result*.xlsx"))
        if not found:
            files[rel] = {"how": how, "exit_code": code, "error": "no compare_result file written", "log": tail}
            continue
        header, rows = _read_result(found[0])
        cols = [(i, KEEP[h.strip().lower()]) for i, h in enumerate(header) if h.strip().lower() in KEEP]
        files[rel] = {"how": how, "exit_code": code, "result_file": re.sub(r"\d{8,}", "<time>", found[0].name),
                      "header": header, "columns": [key for _, key in cols],
                      "rows": [[_cell(row[i]) if i < len(row) else None for i, _ in cols] for row in rows]}
    Path(out).write_text(_dumps({"mindstudio-probe": metadata.version("mindstudio-probe"), "files": files}),
                         encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:5]))
