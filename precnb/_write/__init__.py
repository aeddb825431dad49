r"""Every file or folder precnb writes goes through here: nothing a user owns is ever lost.

Rules (each refusal raises :class:`~precnb.errors.OutputRefusedError`, one line naming the
path and why; the CLI prints it and exits 1):

* **Inputs are read-only.** An output inside an input, equal to it, or holding it is refused.
  An input is protected with the dump it belongs to: ``RUN/step0/rank0/dump.json`` protects
  ``RUN`` (the folder above its ``step*``/``rank*``/``proc*`` folders). Paths are compared
  after resolving symlinks and by (device, inode), so links, ``..``, trailing slashes,
  relative paths and case-insensitive file systems do not get around it.
* **Nothing is replaced that precnb did not create.** An existing output is refused unless
  ``overwrite`` is given, and even then only a precnb output (:mod:`precnb._marks`) of the same
  shape (file or folder) is replaced. A symlink is never written through.
* **No folder is created.** A missing parent folder is an error (create it first).
* **Atomic.** A file is written to a temporary sibling, flushed, then renamed over the target
  (never over something that appeared meanwhile). A folder (zarr store) is built in the sibling
  ``.NAME.precnb-partial`` that one writer at a time holds locked: a second concurrent writer
  fails at once ("another precnb process is writing it"); the store appears complete or not at
  all. A partial folder left by a killed writer is reclaimed by the next one.

API for writers (all take ``inputs=``: the paths the command reads; ``overwrite=``):

* :func:`check_output` — validate early (before long work), returns the absolute path;
* :func:`write_text` / :func:`write_bytes` — write a whole file (its content must carry a
  marker: :func:`~precnb._marks.html_marker`, :func:`~precnb._marks.text_marker`, or
  ``{"precnb_output": marker(kind)}`` in JSON / notebook metadata);
* :func:`writing_file` — a temporary path for a tool that writes the file itself, published
  when the ``with`` block ends;
* :func:`writing_folder` — a temporary folder, published when the ``with`` block ends
  (mark it: zarr attribute ``precnb_output``, or :func:`~precnb._marks.mark_folder`).

Examples
--------
>>> import tempfile, pathlib
>>> from precnb._marks import text_marker
>>> d = pathlib.Path(tempfile.mkdtemp())
>>> out = write_text(d / "plan.txt", text_marker("dump-plan") + "\nstep 3\n", inputs=[])
>>> out.read_text().splitlines()[1]
'step 3'
>>> write_text(d / "plan.txt", "x", inputs=[])
Traceback (most recent call last):
...
precnb.errors.OutputExistsError: refusing to write .../plan.txt: it exists (pass --overwrite to replace it)
"""

from __future__ import annotations

from precnb._write._check import check_output
from precnb._write._files import write_bytes, write_text, writing_file
from precnb._write._folders import writing_folder
from precnb._write._protect import STORE_ATTR, dataset_inputs, protected_roots

__all__ = ["STORE_ATTR", "check_output", "dataset_inputs", "protected_roots", "write_bytes", "write_text",
           "writing_file", "writing_folder"]
