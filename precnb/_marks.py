"""Markers that make an output recognisable as precnb's own, and the test for them.

``--overwrite`` (and ``overwrite=True``) replaces only what this module recognises, so every
writer embeds a marker in what it writes (:mod:`precnb._write` checks it before publishing):

========================  ===================================================================
output                    marker
========================  ===================================================================
zarr store (folder)       ``"precnb_output"`` in the root ``zarr.json`` attributes, and only
                          zarr entries inside (a user's file dropped in the store protects it)
any other folder          a ``.precnb_output`` JSON manifest listing every file written
``.html`` / ``.htm``      ``<meta name="generator" content="precnb ...; precnb_output=KIND">``
                          in the first 64 KiB (:func:`html_marker`)
``.ipynb``                ``metadata["precnb_output"]`` (a dict, :func:`marker`)
``.json``                 a top-level ``"precnb_output"`` key (a dict, :func:`marker`; or a
                          string ``"precnb <kind>"`` where the file's reader wants scalars)
any other text file       a ``precnb_output: KIND`` line among the first five
                          (:func:`text_marker`, with the file's comment prefix)
a table (CSV)             a sidecar ``.NAME.precnb_output`` (JSON: marker, size, sha256 of the
                          file): any line inside would be read by ``pandas.read_csv`` as the
                          header or a row, and it has no comment syntax (:func:`sidecar_path`)
========================  ===================================================================

The name of a file tells what it holds: ``.json`` is JSON, ``.html``/``.htm`` HTML, ``.ipynb``
a notebook, anything else text (:func:`suffix_problem`: a writer asked for ``report -o r.json``
refuses at once, naming the suffix to use).

Only ``os``/``json``/``stat`` are used: importable without the heavy dependencies, and never
blocks (a FIFO or a device is never opened).

Examples
--------
>>> marker("report")["writer"]
'precnb'
>>> has_marker("out.html", html_marker("report").encode())
True
>>> has_marker("plan.txt", b"just text")
False
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

from precnb._version import __version__

__all__ = ["MANIFEST", "MARKER_KEY", "content_kind", "has_marker", "html_marker", "is_precnb_output", "mark_folder",
           "marker", "sidecar_json", "sidecar_path", "suffix_problem", "text_marker"]

MARKER_KEY = "precnb_output"
MANIFEST = ".precnb_output"
_HEAD = 64 * 1024
_JSON_LIMIT = 512 * 1024 * 1024  # a .json/.ipynb larger than this is not parsed (not ours)
_HTML_TAG = '<meta name="generator" content="precnb'
_SIDECAR = ".precnb_output"


def marker(kind: str) -> dict[str, str]:
    """The marker dict (``{"writer": "precnb", "kind": ..., "version": ...}``) for JSON-like outputs.

    Examples
    --------
    >>> sorted(marker("dump-plan"))
    ['kind', 'version', 'writer']
    """
    return {"writer": "precnb", "kind": str(kind), "version": __version__}


def html_marker(kind: str) -> str:
    """The ``<meta>`` tag that marks an HTML output (put it right after ``<head>``).

    Examples
    --------
    >>> html_marker("report").startswith('<meta name="generator" content="precnb')
    True
    """
    safe = "".join(c for c in str(kind) if c.isalnum() or c in "-_")
    return f'<meta name="generator" content="precnb {__version__}; {MARKER_KEY}={safe}">'


def text_marker(kind: str, comment: str = "#") -> str:
    """The marker line of a text output (one of its first five lines), e.g. ``# precnb_output: repro``.

    Examples
    --------
    >>> text_marker("repro-script")
    '# precnb_output: repro-script (written by precnb; `--overwrite` may replace this file)'
    """
    return f"{comment} {MARKER_KEY}: {kind} (written by precnb; `--overwrite` may replace this file)"


def has_marker(path: str | os.PathLike[str], content: bytes) -> bool:
    """Whether *content*, written to a file named like *path*, carries a precnb marker."""
    suffix = Path(path).suffix.lower()
    if suffix in (".html", ".htm"):
        head = content[:_HEAD]
        return _HTML_TAG.encode() in head and f"{MARKER_KEY}=".encode() in head
    if suffix in (".ipynb", ".json"):
        try:
            obj = json.loads(content.decode("utf-8"))
        except (UnicodeDecodeError, ValueError, RecursionError):
            return False
        if not isinstance(obj, dict):
            return False
        holder = obj.get("metadata") if suffix == ".ipynb" else obj
        mark = holder.get(MARKER_KEY) if isinstance(holder, dict) else None
        if isinstance(mark, str):  # a plain string where a consumer wants scalars (msprobe's config.json)
            return mark.startswith("precnb ")
        return isinstance(mark, dict) and mark.get("writer") == "precnb"
    lines = content[:_HEAD].split(b"\n", 5)[:5]
    return any(f"{MARKER_KEY}: ".encode() in ln and b"written by precnb" in ln for ln in lines)


# content kind -> (what it is, the suffixes its marker is recognised under)
_CONTENT = {"html": ("an HTML page", (".html", ".htm")), "ipynb": ("a notebook", (".ipynb",)),
            "json": ("JSON", (".json",)), "text": ("text", ())}


def content_kind(content: bytes) -> str | None:
    """Which marker *content* carries (``"html"``, ``"ipynb"``, ``"json"``, ``"text"``), or None.

    Examples
    --------
    >>> content_kind(html_marker("report").encode()), content_kind(b"# precnb_output: x (written by precnb)")
    ('html', 'text')
    """
    for kind, (_, suffixes) in _CONTENT.items():
        if has_marker(f"x{suffixes[0] if suffixes else '.txt'}", content):
            return kind
    return None


def suffix_problem(path: str | os.PathLike[str], content: str) -> str | None:
    """Why a file named *path* cannot hold *content* (a kind of :func:`content_kind`), or None.

    Examples
    --------
    >>> suffix_problem("r.json", "html")
    'precnb writes an HTML page here: give it a .html name (a .json file holds JSON)'
    >>> suffix_problem("m.yaml", "json") is None, suffix_problem("m.txt", "text") is None
    (False, True)
    """
    suffix = Path(path).suffix.lower()
    what, wanted = _CONTENT[content]
    owner = next((k for k, (_, sfx) in _CONTENT.items() if suffix in sfx), "text")
    if owner == content:
        return None
    if wanted:
        hint = f"give it a {wanted[0]} name"
    else:
        hint = "give it a name that does not end in " + ", ".join(x for _, (_, sfx) in _CONTENT.items() for x in sfx)
    held = (f"a {suffix} file holds {_CONTENT[owner][0]}" if owner != "text"
            else f"{suffix or 'that name'} is not {what}")
    return f"precnb writes {what} here: {hint} ({held})"


def sidecar_path(path: str | os.PathLike[str]) -> Path:
    """The marker file beside a table output (``dir/.NAME.precnb_output``)."""
    p = Path(path)
    return p.with_name(f".{p.name}{_SIDECAR}")


def sidecar_json(path: str | os.PathLike[str], content: bytes, kind: str) -> str:
    """The text of the sidecar that marks *content*, written to *path*, as precnb's."""
    import hashlib

    return json.dumps({MARKER_KEY: marker(kind), "file": Path(path).name, "size": len(content),
                       "sha256": hashlib.sha256(content).hexdigest()})


def _sidecar_is_ours(path: Path, st: os.stat_result) -> bool:
    """Whether the file at *path* is exactly the content its sidecar describes (so precnb wrote it)."""
    import hashlib

    raw = _read_regular(sidecar_path(path), 1 << 20)
    if raw is None:
        return False
    try:
        doc = json.loads(raw.decode("utf-8"))
        ok = (doc[MARKER_KEY]["writer"] == "precnb" and doc["file"] == path.name and doc["size"] == st.st_size)
    except (UnicodeDecodeError, ValueError, KeyError, TypeError, RecursionError):
        return False
    if not ok or st.st_size > _JSON_LIMIT:
        return False
    data = _read_regular(path, st.st_size + 1)
    return data is not None and hashlib.sha256(data).hexdigest() == doc.get("sha256")


def _read_regular(path: Path, limit: int) -> bytes | None:
    """The first *limit* bytes of a regular file (never opens a FIFO, device or link)."""
    try:
        st = os.lstat(path)
        if not stat.S_ISREG(st.st_mode):
            return None
        with open(path, "rb") as fh:  # a regular file: cannot block
            return fh.read(limit)
    except OSError:
        return None


def _zarr_store_is_ours(path: Path) -> bool:
    raw = _read_regular(path / "zarr.json", 64 * 1024 * 1024)
    if raw is None:
        return False
    try:
        meta = json.loads(raw.decode("utf-8"))
        mark = meta["attributes"][MARKER_KEY]
    except (UnicodeDecodeError, ValueError, KeyError, TypeError, RecursionError):
        return False
    if isinstance(mark, str):
        try:
            mark = json.loads(mark)
        except ValueError:
            return False
    if not (isinstance(mark, dict) and mark.get("writer") == "precnb"):
        return False
    try:  # only zarr entries: the root zarr.json and array/group folders holding zarr.json and chunks
        for entry in os.scandir(path):
            if entry.name == "zarr.json" and entry.is_file(follow_symlinks=False):
                continue
            if not entry.is_dir(follow_symlinks=False):
                return False
            inner = {e.name for e in os.scandir(entry.path)}
            if "zarr.json" not in inner or not inner <= {"zarr.json", "c"}:
                return False
    except OSError:
        return False
    return True


def _files_below(path: Path) -> set[str] | None:
    out: set[str] = set()
    try:
        for root, dirs, files in os.walk(path, followlinks=False):
            rel = os.path.relpath(root, path)
            for name in files + [d for d in dirs if os.path.islink(os.path.join(root, d))]:
                out.add(os.path.normpath(os.path.join(rel, name)))
    except OSError:
        return None
    return out


def mark_folder(folder: str | os.PathLike[str], kind: str) -> None:
    """Write the ``.precnb_output`` manifest of a (non-zarr) output folder: call it last.

    The manifest lists every file below *folder*; a later ``--overwrite`` replaces the folder
    only while it holds nothing else.
    """
    p = Path(folder)
    files = sorted((_files_below(p) or set()) - {MANIFEST})
    (p / MANIFEST).write_text(json.dumps({MARKER_KEY: marker(kind), "files": files}), encoding="utf-8")


def _folder_is_ours(path: Path) -> bool:
    raw = _read_regular(path / MANIFEST, 16 * 1024 * 1024)
    if raw is None:
        return _zarr_store_is_ours(path)
    try:
        man = json.loads(raw.decode("utf-8"))
        listed = set(man["files"]) | {MANIFEST}
        ok = man[MARKER_KEY]["writer"] == "precnb"
    except (UnicodeDecodeError, ValueError, KeyError, TypeError, RecursionError):
        return False
    present = _files_below(path)
    return bool(ok) and present is not None and present <= listed


def is_precnb_output(path: str | os.PathLike[str]) -> bool:
    """Whether *path* is an existing output precnb wrote (see the table in the module docstring).

    A symbolic link is never one (precnb does not write through links).

    Examples
    --------
    >>> is_precnb_output("/nonexistent")
    False
    """
    p = Path(path)
    try:
        st = os.lstat(p)
    except OSError:
        return False
    if stat.S_ISDIR(st.st_mode):
        return _folder_is_ours(p)
    if not stat.S_ISREG(st.st_mode):
        return False
    if _sidecar_is_ours(p, st):
        return True
    limit = _JSON_LIMIT if p.suffix.lower() in (".json", ".ipynb") else _HEAD
    if p.suffix.lower() in (".json", ".ipynb") and st.st_size > limit:
        return False
    raw = _read_regular(p, limit)
    return raw is not None and has_marker(p, raw)

