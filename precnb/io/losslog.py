r"""Loss logs: a CSV ``step,loss[,rank]`` or TensorBoard event files, read into one table.

A dump often covers only the steps around an incident; the loss of every step is in the
training's own log. :func:`read_loss_log` returns a DataFrame with columns ``step`` (int),
``rank`` (float: NaN for a log of the whole job) and ``loss`` (float64, NaN / ±inf kept).

* **CSV**: a header naming ``step`` and ``loss`` (any order; ``rank`` optional; other columns
  ignored); one row per step (and rank). ``nan`` / ``inf`` cells are kept as such.
* **TensorBoard** (``events.out.tfevents.*``, a file or a folder searched down to 4 levels): read
  without TensorFlow or TensorBoard — the TFRecord framing (length, masked CRC-32C of the length,
  the record, masked CRC-32C of the record) and the few protobuf fields of ``Event`` →
  ``Summary`` → ``Value`` (``tag``; ``simple_value`` as ``SummaryWriter.add_scalar`` writes it,
  or a scalar ``tensor`` as ``tf.summary.scalar`` writes it) are decoded by bounds-checked code
  that never evaluates anything; every record's length checksum is verified, and the record
  checksum of every record whose value is used. The loss tag is the one named ``loss`` (or ending
  in ``/loss``, ``lm loss``, ...), training rather than validation; give ``tag=`` to choose. A
  ``rank{N}`` folder or file name gives the rank; otherwise the log is the job's.

Bad input raises :class:`~precnb.errors.DumpFormatError` naming the file and what is wrong.

Examples
--------
>>> import tempfile
>>> path = Path(tempfile.mkdtemp()) / "loss.csv"
>>> _ = path.write_text("step,loss,rank\n0,4.4,0\n0,4.3,1\n1,nan,0\n")
>>> read_loss_log(path).to_dict("records")[2]
{'step': 1, 'rank': 0.0, 'loss': nan}
"""

from __future__ import annotations

import math
import os
import re
from pathlib import Path

import numpy as np
import pandas as pd

from precnb.errors import DumpFormatError
from precnb.io._tfevents import is_event_file, read_event_scalars

__all__ = ["is_event_file", "read_event_scalars", "read_loss_log"]

_RANK = re.compile(r"(?:^|[^a-z])rank[_-]?(\d{1,9})(?:[^0-9]|$)", re.IGNORECASE)
_MAX_DEPTH = 4
_MAX_FILES = 10_000


_PREFERRED = ("loss", "train/loss", "train_loss", "loss/train", "lm loss", "train/lm loss", "lm-loss",
              "training_loss", "train/loss_step")
_NOT_TRAIN = ("val", "eval", "valid", "test", "scale", "lr", "grad")


def _loss_tag(tags: list[str], wanted: str | None) -> str | None:
    if wanted is not None:
        return wanted if wanted in tags else None
    low = {t: t.lower() for t in tags}
    for p in _PREFERRED:
        hit = [t for t in tags if low[t] == p]
        if hit:
            return hit[0]
    cands = [t for t in tags if re.search(r"(^|[/ _-])loss$", low[t]) and not any(
        re.search(rf"(^|[/ _-]){w}", low[t]) for w in _NOT_TRAIN)]
    return sorted(cands, key=len)[0] if cands else None


def _event_files(root: Path) -> list[Path]:
    if root.is_file():
        return [root]
    out: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(root):
        depth = len(Path(dirpath).relative_to(root).parts)
        if depth >= _MAX_DEPTH:
            dirnames[:] = []
        dirnames.sort()
        out += [Path(dirpath) / f for f in sorted(filenames) if is_event_file(f)]
        if len(out) > _MAX_FILES:
            raise DumpFormatError(str(root), f"more than {_MAX_FILES} event files; point at one run's folder")
    return out


def _rank_of(path: Path, root: Path) -> float:
    rel = path.relative_to(root) if root in path.parents or path == root else Path(path.name)
    for part in reversed(rel.parts):
        m = _RANK.search(part)
        if m:
            return float(int(m.group(1)))
    return math.nan


def _read_events(root: Path, tag: str | None) -> pd.DataFrame:
    files = _event_files(root)
    if not files:
        raise DumpFormatError(str(root), "no TensorBoard event file (events.out.tfevents.*) in it")
    parts = []
    for f in files:
        df = read_event_scalars(f)
        df["rank"] = _rank_of(f, root if root.is_dir() else f.parent)
        df["file"] = str(f)
        parts.append(df)
    allv = pd.concat(parts, ignore_index=True)
    names = sorted(map(str, allv["tag"].unique()))  # not set(column): 2M records iterated one by one
    chosen = _loss_tag(names, tag)
    if chosen is None:
        tags = ", ".join(names[:12]) or "none"
        raise DumpFormatError(str(root), (f"no scalar tag {tag!r}" if tag else "no loss scalar") + f" (tags: {tags})")
    sub = allv[allv["tag"] == chosen]
    # a step written twice (a restart appends to the log): the last record wins, as TensorBoard shows it
    sub = sub.sort_values(["rank", "file", "record"], kind="stable").drop_duplicates(["rank", "step"], keep="last")
    out = pd.DataFrame({"step": sub["step"].astype(np.int64).to_numpy(), "rank": sub["rank"].to_numpy(float),
                        "loss": sub["value"].to_numpy(float)})
    out.attrs["tag"] = chosen
    return out.sort_values(["step", "rank"], kind="stable").reset_index(drop=True)


def _read_csv(path: Path) -> pd.DataFrame:
    from precnb.io._csvutil import iter_rows, parse_float

    rows = iter_rows(path)
    try:
        _, header = next(rows)
    except StopIteration:
        raise DumpFormatError(str(path), "empty file (expected a header step,loss[,rank])") from None
    cols = [c.strip().lower() for c in header]
    if "step" not in cols or "loss" not in cols:
        raise DumpFormatError(str(path), f"line 1: the header must name step and loss (got {', '.join(cols)[:200]})")
    si, li = cols.index("step"), cols.index("loss")
    ri = cols.index("rank") if "rank" in cols else None
    steps: list[int] = []
    ranks: list[float] = []
    losses: list[float] = []
    for line, cells in rows:
        if len(cells) != len(cols):
            raise DumpFormatError(str(path), f"line {line}: {len(cells)} fields, the header has {len(cols)}")
        for name, j in (("step", si), ("rank", ri)):
            if j is None:
                continue
            txt = cells[j].strip()
            if name == "rank" and not txt:
                continue
            if not (txt.isascii() and txt.isdigit()) or len(txt) > 12:  # "²".isdigit() is True
                raise DumpFormatError(str(path), f"line {line}: {name} {txt[:40]!r} is not a non-negative integer")
        try:
            v = parse_float(cells[li], bools=False)
        except ValueError:
            raise DumpFormatError(str(path), f"line {line}: loss {cells[li][:40]!r} is not a number") from None
        steps.append(int(cells[si]))
        ranks.append(float(int(cells[ri])) if ri is not None and cells[ri].strip() else math.nan)
        losses.append(math.nan if v is None else float(v))
    df = pd.DataFrame({"step": np.asarray(steps, dtype=np.int64), "rank": np.asarray(ranks, dtype=float),
                       "loss": np.asarray(losses, dtype=float)})
    dup = df.duplicated(["step", "rank"], keep=False)
    if dup.any():
        first = df[dup].iloc[0]
        raise DumpFormatError(str(path), f"step {int(first['step'])}"
                              + (f" rank {int(first['rank'])}" if np.isfinite(first["rank"]) else "")
                              + " appears more than once")
    return df


def read_loss_log(path: str | os.PathLike[str], *, tag: str | None = None) -> pd.DataFrame:
    """Read a loss log (see the module docstring).

    Parameters
    ----------
    path : path
        A CSV file, a TensorBoard event file, or a folder of event files.
    tag : str, optional
        The TensorBoard scalar tag of the loss (default: found, see the module docstring).

    Returns
    -------
    pandas.DataFrame
        ``step`` (int64), ``rank`` (float, NaN = the whole job), ``loss`` (float64); ``attrs``
        ``source`` (the path) and, for TensorBoard, ``tag``.

    Raises
    ------
    DumpFormatError
        For a file that is neither, or is malformed (one line naming the file and the problem).
    """
    p = Path(path).expanduser()
    if not p.exists():
        raise DumpFormatError(str(path), "no such file or folder")
    df = _read_events(p, tag) if p.is_dir() or is_event_file(p) else _read_csv(p)
    if not len(df):
        raise DumpFormatError(str(path), "no loss values")
    df.attrs["source"] = str(path)
    return df
