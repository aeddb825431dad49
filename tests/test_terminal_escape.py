"""Control characters from the data never reach the terminal raw.

Node, module and folder names holding ANSI/OSC escape sequences (set the window title, clear the
screen), carriage returns, C1 controls and bidirectional overrides are printed escaped
(``\\u001b``...) by every command, in text and in ``--json`` (which stays valid JSON holding
the same strings). Every CLI printer goes through :mod:`precnb.cli._term`: a test reads the
CLI sources for any other way to print.
"""

from __future__ import annotations

import ast
import json
import re
import shutil
from pathlib import Path

import pytest

from precnb.cli import main
from precnb.cli._term import escape_controls
from tests.conftest import sample_path

OSC = "\x1b]0;pwned\x07"
CLEAR = "\x1b[2J\x1b[H"
EVIL = f"{OSC}{CLEAR}\r\x9b31m\u202e"
RAW = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069\u2028\u2029]")
CLI = Path(__file__).resolve().parents[1] / "precnb" / "cli"


@pytest.fixture(scope="module")
def hostile(tmp_path_factory):
    """dp_nan in a folder whose name holds escapes, with the NaN-origin node and a module renamed."""
    root = tmp_path_factory.mktemp("esc") / f"run{OSC}"
    shutil.copytree(sample_path("dp_nan"), root)
    for f in root.rglob("*.json"):
        text = f.read_text(encoding="utf-8")
        text = text.replace("Torch.sqrt.0.forward", "Torch.sqrt" + json.dumps(EVIL)[1:-1] + ".0.forward")
        text = text.replace("blocks.1.attn", "blocks.1" + json.dumps(EVIL)[1:-1] + ".attn")
        f.write_text(text, encoding="utf-8")
    return root


def _strings(obj):
    if isinstance(obj, str):
        yield obj
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield k
            yield from _strings(v)
    elif isinstance(obj, list):
        for v in obj:
            yield from _strings(v)


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main([*argv, "--workers", "1"])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("argv", [
    ["nan"], ["nan", "--json"], ["info"], ["info", "--json"], ["anomalies"], ["anomalies", "--json"],
    ["replicas", "--tp", "2"], ["merge", "--tp", "2"],
])
def test_commands_escape_control_characters(hostile, capsys, argv):
    code, out, err = _run(capsys, argv[0], str(hostile), *argv[1:])
    assert code in (0, 1), err
    assert not RAW.search(out) and not RAW.search(err), (out[:500], err[:500])
    if "--json" in argv:
        strings = list(_strings(json.loads(out)))  # still valid JSON, holding the original strings
        assert any(EVIL in t or f"run{OSC}" in t for t in strings)
    if argv == ["nan"]:
        assert "Torch.sqrt\\u001b]0;pwned\\u0007\\u001b[2J\\u001b[H\\u000d\\u009b31m\\u202e.0.forward" in out


def _renamed(src: Path, dst: Path, old: str) -> Path:
    shutil.copytree(src, dst)
    for f in dst.rglob("*.json"):
        text = f.read_text(encoding="utf-8")
        f.write_text(text.replace(old, old.replace(".0.forward", json.dumps(EVIL)[1:-1] + ".0.forward")),
                     encoding="utf-8")
    return dst


def test_diff_and_errors_escape_control_characters(hostile, capsys, tmp_path):
    base = _renamed(sample_path("divergence", "baseline"), tmp_path / f"b{CLEAR}", "Functional.gelu.0.forward")
    target = _renamed(sample_path("divergence", "target"), tmp_path / f"t{OSC}", "Functional.gelu.0.forward")
    for extra in ([], ["--json"]):
        code, out, err = _run(capsys, "diff", str(base), str(target), *extra)
        assert code == 0 and not RAW.search(out + err), (out[:300], err[:300])
        assert "Functional.gelu\\u001b]0;pwned\\u0007" in out  # the origin, named, escaped
    code, out, err = _run(capsys, "info", str(tmp_path / f"missing{OSC}"))
    assert code == 1 and not RAW.search(err) and "missing\\u001b]0;pwned\\u0007" in err
    code, out, err = _run(capsys, "anomalies", str(hostile), f"--stat={OSC}")
    assert code == 2 and not RAW.search(err)


def test_escape_controls_keeps_text_and_json():
    assert escape_controls("a\tb\nc") == "a\tb\nc"
    assert escape_controls("é ✓ 中文") == "é ✓ 中文"
    doc = json.dumps({"n": EVIL}, ensure_ascii=False)
    assert json.loads(escape_controls(doc)) == {"n": EVIL}


def test_every_cli_printer_goes_through_term():
    offenders = []
    for path in sorted(CLI.glob("*.py")):
        if path.name == "_term.py":
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                f = node.func
                name = ast.unparse(f)
                if name == "print" or re.fullmatch(r"sys\.(stdout|stderr|__stdout__|__stderr__)\.write", name):
                    offenders.append(f"{path.name}:{node.lineno}: {name}")
    assert offenders == [], "print through precnb.cli._term.out/err: " + ", ".join(offenders)
