"""The bundled samples name no path of the machine that made them (issue #53, item 7).

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

from tests.conftest import SAMPLES

# an absolute POSIX path (``/work/...``, ``/root/...``, ``/usr/...``: a ``/`` starting a token, then a name and a
# ``/``), a Windows drive (``C:\``, in JSON ``C:\\``) or a UNC share (``\\host\``)
ABSOLUTE = re.compile(r"(?:^|[\s\"'`(=\[,])(?:/[\w.+-]+/|[A-Za-z]:\\|\\\\\\\\?[\w.-]+\\)")
TEXT = {".json", ".md", ".ir", ".csv", ".yaml", ".yml", ".txt", ".log"}
# what the machines that made the samples would leave, looked for in the binary files too (.npy, .pt, .zip)
MACHINE = (b"/work/", b"/root/", b"/home/", b"/tmp/", b"/Users/", b"site-packages")


def _files():
    return sorted(p for p in SAMPLES.rglob("*") if p.is_file())


def test_no_sample_file_names_an_absolute_path():
    """Every text file of data_samples/ is free of absolute paths; binary files of the machines' folders."""
    found = []
    for p in _files():
        raw = p.read_bytes()
        if p.suffix in TEXT:
            text = raw.decode("utf-8")
            found += [f"{p.relative_to(SAMPLES)}: {m.group(0)!r}" for m in ABSOLUTE.finditer(text)][:1]
        elif any(m in raw for m in MACHINE[:-1]):
            found.append(f"{p.relative_to(SAMPLES)} (binary)")
    assert not found, "absolute paths in the samples (run `PYTHONPATH=tools/samples python -m " \
        f"precnb_samples.scrub data_samples`): {found[:10]}"


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


def test_the_samples_are_what_the_generator_scrub_writes():
    """The committed text files are fixed points of the generator's scrub: regenerating changes no path form,
    and library frames keep the ``/site-packages/`` and ``/lib/python3`` markers precnb's frame classifiers use."""
    from precnb_samples.scrub import TEXT_SUFFIXES, scrub_paths

    changed, frames = [], 0
    for p in _files():
        if p.suffix not in TEXT_SUFFIXES:
            continue
        text = p.read_text(encoding="utf-8")
        if scrub_paths(text) != text:
            changed.append(str(p.relative_to(SAMPLES)))
        if p.name == "stack.json":
            frames += text.count("File <venv>/site-packages/")
            assert not re.search(r"File (?:site|dist)-packages/|File lib/python", text), p
    assert not changed, changed[:10]
    assert frames > 100_000  # msprobe's frames of torch, megatron, msprobe ... are there, in the scrubbed form
