"""The bundled samples and the test fixtures name no path of the machine that made them (issue #53, item 7).

msprobe writes absolute paths into its output (every ``stack.json`` frame, a tensor dump's
``dump_data_dir``, MindSpore's graphs); the generator rewrites them with
:func:`precnb_samples.scrub.scrub_paths` whenever it writes a sample, and ``python -m precnb_samples.scrub
data_samples`` applied the same function to the committed ones. No exception is needed: nothing in a
sample has to name an absolute path (the install recipes of ``data_samples/README.md`` write
``~/venvs/...``, a folder of whoever follows them, which the pattern below does not take for an
absolute path).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.conftest import ROOT, SAMPLES

#: the test fixtures: the msprobe release matrix (tools/msprobe_matrix/generate.py scrubs what it writes), the
#: hand-written section fixtures, the TensorBoard records
FIXTURES = ROOT / "tests" / "fixtures"

# an absolute POSIX path (``/work/...``, ``/root/...``, ``/usr/...``: a ``/`` starting a token, then a name and a
# ``/``), a Windows drive (``C:\``, in JSON ``C:\\``) or a UNC share (``\\host\``)
ABSOLUTE = re.compile(r"(?:^|[\s\"'`(=\[,])(?:/[\w.+-]+/|[A-Za-z]:\\|\\\\\\\\?[\w.-]+\\)")
TEXT = {".json", ".md", ".ir", ".csv", ".yaml", ".yml", ".txt", ".log"}
# what the machines that made the samples would leave, looked for in the binary files too (.npy, .pt, .zip)
MACHINE = (b"/work/", b"/root/", b"/home/", b"/tmp/", b"/Users/", b"site-packages")


def _files(root: Path = SAMPLES):
    return sorted(p for p in root.rglob("*") if p.is_file())


@pytest.mark.slow
@pytest.mark.parametrize("root", [SAMPLES, FIXTURES], ids=["data_samples", "tests/fixtures"])
def test_no_sample_file_names_an_absolute_path(root):
    """Every text file of data_samples/ and tests/fixtures/ is free of absolute paths; binary files of the
    machines' folders."""
    found = []
    for p in _files(root):
        raw = p.read_bytes()
        if p.suffix in TEXT:
            text = raw.decode("utf-8")
            found += [f"{p.relative_to(root)}: {m.group(0)!r}" for m in ABSOLUTE.finditer(text)][:1]
        elif any(m in raw for m in MACHINE[:-1]):
            found.append(f"{p.relative_to(root)} (binary)")
    assert len(_files(root)) > 100
    assert not found, "absolute paths (run `PYTHONPATH=tools/samples python -m precnb_samples.scrub " \
        f"{root.relative_to(ROOT)}`; the release matrix: `tools/msprobe_matrix/generate.py --scrub`): {found[:10]}"


def test_the_pattern_finds_what_it_must():
    """The check above would see the paths the samples held before they were scrubbed."""
    for text in ('"File /work/venvs/megatron/lib/python3.11/site-packages/megatron/core/x.py, line 1"',
                 '"dump_path": "/tmp/mgfinal/megatron/tp2sp"', "# In file /root/x/y.py:42", 'C:\\Users\\me',
                 '"dump_data_dir": "C:\\\\data\\\\x"'):
        assert ABSOLUTE.search(text), text
    for text in ('"File <venv>/site-packages/torch/nn/modules/module.py, line 1811"',
                 '"File tools/samples/precnb_samples/_model.py, line 2"', "python3 -m venv ~/venvs/ms",
                 '"dump_path": "data_samples/tp/tp2"', "see https://gitee.com/ascend/mstt/ and step0/rank1/"):
        assert not ABSOLUTE.search(text), text


@pytest.mark.slow
@pytest.mark.parametrize("root", [SAMPLES, FIXTURES / "msprobe_releases"], ids=["data_samples", "msprobe_releases"])
def test_the_samples_are_what_the_generator_scrub_writes(root):
    """The committed text files are fixed points of the generator's scrub: regenerating changes no path form,
    and library frames keep the ``/site-packages/`` and ``/lib/python3`` markers precnb's frame classifiers use."""
    from precnb_samples.scrub import TEXT_SUFFIXES, scrub_paths

    changed, frames = [], 0
    for p in _files(root):
        if p.suffix not in TEXT_SUFFIXES:
            continue
        text = p.read_text(encoding="utf-8")
        if scrub_paths(text) != text:
            changed.append(str(p.relative_to(root)))
        if p.name == "stack.json":
            frames += text.count("File <venv>/site-packages/")
            assert not re.search(r"File (?:site|dist)-packages/|File lib/python", text), p
    assert not changed, changed[:10]
    # msprobe's frames of torch, megatron, msprobe ... are there, in the scrubbed form
    assert frames > (100_000 if root == SAMPLES else 10_000), frames
