"""Reader of msprobe ``config_check`` packs (the zip files ``msprobe config_check`` / ``ConfigChecker`` write).

A pack holds, per entry (msprobe 26.2.0, ``msprobe/core/config_check/checkers/``):

========================================  ==============================================================
``env``                                   JSON object: the whole ``os.environ`` of rank 0
``pip``                                   text, one ``name=version`` line per installed distribution
``hyperparameters/hyperparameters_static.json``  JSON object parsed from the training shell script / YAML
``hyperparameters/hyperparameters_dynamic.json`` JSON object: Megatron's ``get_args()``
``dataset/step{N}/rank{R}/dataset.json``  ``{"args": {i: features}, "kwargs": {name: features}}`` of the
                                          model's forward inputs (nested containers keep their keys)
``weights/step{N}/rank{R}/weight.json``   ``{parameter name: features}``
``random/rank{R}.json``                   ``{random API: [{"count": n, "stack": [frame, ...]}]}``
========================================  ==============================================================

*features* are ``{"max", "min", "mean", "norm"}`` of the tensor cast to float; the step is
the model's forward-call count (``ConfigChecker.step``, a micro step). env, pip and the
hyper-parameters are written by rank 0 only, dataset/weights by every rank.

:func:`open_config_check` turns a pack into the canonical dataset: dataset features become
``Dataset.*`` input tensors and weights ``Weights.<name>`` parameter tensors (dims step, rank,
tensor), so the pre-flight checks read a pack like a dump; everything else goes into the
``config_check`` attribute (JSON text). Only the environment variables that bear on numerical
reproducibility are kept (:data:`ENV_KEYS`): a pack's environment may hold credentials.

Reading is safe: nothing is extracted or unpickled; entry names must be relative paths without
``..``; entry count, per-entry and total sizes and compression ratios are bounded; encrypted and
symbolic-link entries are refused. A broken pack raises :class:`~precnb.errors.DumpFormatError`
naming the zip file and the entry.

Examples
--------
>>> is_config_check("/nonexistent.zip")
False
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Sequence
from pathlib import Path, PurePosixPath
from typing import Any

import xarray as xr

from precnb.io._assemble import LoadReport, RecordBuilder, assemble
from precnb.io._config_zip import Limits, _bad, _entries, is_config_check
from precnb.io._jsonio import loads_json
from precnb.io.readers import Reader

__all__ = ["ENV_KEYS", "Limits", "is_config_check", "open_config_check", "read_pack"]

#: environment variables kept from a pack (msprobe's env check list, GPU and NPU names, plus the
#: usual determinism switches); every other variable is dropped on reading
ENV_KEYS: tuple[str, ...] = (
    "HCCL_DETERMINISTIC", "NCCL_DETERMINISTIC", "HCCL_ALGO", "NCCL_ALGO", "HCCL_INTRA_ROCE_ENABLE",
    "HCCL_INTRA_PCIE_ENABLE", "ASCEND_LAUNCH_BLOCKING", "CUDA_LAUNCH_BLOCKING", "ASCEND_RT_VISIBLE_DEVICES",
    "CUDA_VISIBLE_DEVICES", "CUBLAS_WORKSPACE_CONFIG", "PYTHONHASHSEED", "NCCL_PROTO", "OMP_NUM_THREADS",
    "TORCH_DETERMINISTIC", "CLOSE_MATMUL_K_SHIFT", "ASCEND_GLOBAL_LOG_LEVEL",
)
# ASCII digits only (re's \d also matches "١", which int() reads as 1: step١ would silently be step1)
_STEP_RANK = re.compile(r"^(dataset|weights)/step([0-9]+)/rank([0-9]+)/(dataset|weight)\.json$")
_RANDOM = re.compile(r"^random/rank([0-9]+)\.json$")
_FEATURES = ("max", "min", "mean", "norm")
_MAX_INDEX = 2**31 - 1  # step / rank numbers, as in dump folders
_UNICODE_NUMBERED = re.compile(r"^((dataset|weights)/step\d+/rank\d+/(dataset|weight)\.json|random/rank\d+\.json)$")


def _json(path: Path, entry: str, raw: bytes, want: type) -> Any:
    doc = loads_json(raw, f"{path} [{entry}]")
    if not isinstance(doc, want):
        raise _bad(path, entry, f"expected a JSON {'object' if want is dict else want.__name__}, "
                                f"got {type(doc).__name__}")
    return doc


def _pip(raw: bytes) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in raw.decode("utf-8", "replace").splitlines():
        name, sep, version = line.strip().partition("=")
        if name and len(name) <= 200:
            out[name.strip().lower().replace("_", "-")] = version.strip() if sep else ""
    return out


def _frame_site(frame: Any) -> str:
    """``file.py:function`` of one stack frame text (``File /p/x.py, line 3, in f, code``)."""
    m = re.match(r"^\s*File\s+(.+?),\s+line\s+\d+,\s+in\s+([^,]+)", str(frame))
    return f"{PurePosixPath(m.group(1)).name}:{m.group(2).strip()}" if m else str(frame)[:120]


def _random(path: Path, entry: str, doc: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """Per random API: calls with their count and call site (the innermost frame outside libraries)."""
    out: dict[str, list[dict[str, Any]]] = {}
    for op, calls in doc.items():
        if not isinstance(calls, list):
            raise _bad(path, entry, f"{op!r}: expected a list of calls")
        rows = []
        for c in calls:
            if not isinstance(c, dict) or not isinstance(c.get("count", 0), int):
                raise _bad(path, entry, f"{op!r}: a call is not {{count, stack}}")
            stack = [str(f) for f in c.get("stack") or []]
            user = [f for f in stack if "site-packages" not in f and "/lib/python" not in f]
            rows.append({"count": int(c.get("count", 0)), "site": _frame_site((user or stack or [""])[-1]),
                         "depth": len(stack)})
        out[str(op)] = rows
    return out


def _feature_leaves(obj: Any, prefix: str, out: list[tuple[str, dict[str, Any]]], depth: int = 0) -> None:
    if depth > 16 or not isinstance(obj, dict):
        return
    if set(_FEATURES) <= set(obj):
        out.append((prefix, obj))
        return
    for k, v in obj.items():
        _feature_leaves(v, f"{prefix}.{k}", out, depth + 1)


def read_pack(path: str | os.PathLike[str], *, limits: type[Limits] = Limits) -> dict[str, Any]:
    """The parsed entries of a pack (no tensors merged yet).

    Returns
    -------
    dict
        ``entries`` (names), ``env`` (only :data:`ENV_KEYS`), ``env_variables`` (how many the pack
        held), ``pip`` (name → version), ``hyperparameters`` (``static`` / ``dynamic`` dicts),
        ``random`` (rank → API → calls), ``dataset`` and ``weights`` ((step, rank) → JSON object).

    Raises
    ------
    DumpFormatError
        For a broken or unsafe pack (naming the file and entry).
    """
    p = Path(path)
    skipped: list[tuple[str, str]] = []
    raw = _entries(p, limits, skipped)
    out: dict[str, Any] = {"entries": sorted(raw), "env": {}, "env_variables": 0, "pip": {},
                           "hyperparameters": {}, "random": {}, "dataset": {}, "weights": {}, "skipped": skipped}
    numbered = _numbered(p, raw, skipped)
    for name, data in raw.items():
        if name == "env":
            env = _json(p, name, data, dict)
            out["env_variables"] = len(env)
            out["env"] = {k: str(env[k]) for k in ENV_KEYS if k in env}
        elif name == "pip":
            out["pip"] = _pip(data)
        elif name.startswith("hyperparameters/"):
            kind = "dynamic" if "dynamic" in name else "static"
            out["hyperparameters"][kind] = _json(p, name, data, dict)
        elif name in numbered:
            kind, key = numbered[name]
            if kind == "random":
                out["random"][key[0]] = _random(p, name, _json(p, name, data, dict))
            else:
                out[kind][key] = _json(p, name, data, dict)
    return out


def _numbered(p: Path, raw: dict[str, bytes], skipped: list[tuple[str, str]]
              ) -> dict[str, tuple[str, tuple[int, ...]]]:
    """``{entry: (kind, (step, rank) or (rank,))}`` of the numbered entries to read, by the rules of dump folders.

    ASCII digits only, numbers below 2**31, and one entry per number: ``step01`` beside ``step1``
    (or ``rank00`` beside ``rank0``) keeps the canonical spelling; every other one is named in
    *skipped*, never merged.
    """
    from precnb.io._assemble import LoadReport
    from precnb.io._dupes import keep_one_per_number

    items: list[tuple[Any, str]] = []
    parsed: dict[str, tuple[str, tuple[int, ...]]] = {}
    for name in raw:
        m, r = _STEP_RANK.match(name), _RANDOM.match(name)
        if m is None and r is None:
            if _UNICODE_NUMBERED.match(name):  # step١ would be read as step1 by int(): named, not merged
                skipped.append((f"{p} [{name}]", "not loaded: step or rank number not in ASCII digits 0-9 "
                                "(msprobe writes dataset/stepN/rankR/...); rename it"))
            elif name.startswith(("dataset/", "weights/", "random/")):
                skipped.append((f"{p} [{name}]", "ignored: not a config_check entry name (dataset/stepN/rankR/"
                                "dataset.json, weights/stepN/rankR/weight.json or random/rankR.json)"))
            continue
        digits = (m.group(2), m.group(3)) if m is not None else (r.group(1),)  # type: ignore[union-attr]
        if any(len(d) > 10 or int(d) > _MAX_INDEX for d in digits):
            skipped.append((f"{p} [{name}]", f"not loaded: step or rank number out of range (0..{_MAX_INDEX})"))
            continue
        kind, nums = (m.group(1) if m is not None else "random"), tuple(int(d) for d in digits)
        key = f"{kind} of step {nums[0]} rank {nums[1]}" if len(nums) == 2 else f"random of rank {nums[0]}"
        parsed[key] = (kind, nums)
        items.append((key, name))

    def canonical(key: Any) -> str:
        kind, nums = parsed[key]
        if kind == "random":
            return f"random/rank{nums[0]}.json"
        return f"{kind}/step{nums[0]}/rank{nums[1]}/{'dataset' if kind == 'dataset' else 'weight'}.json"

    report = LoadReport()
    kept: list[tuple[Any, str]] = keep_one_per_number(items, "entry", canonical, report, name=lambda n: n,
                                                      where=lambda n: f"{p} [{n}]")
    skipped.extend(report.skipped)
    return {name: parsed[key] for key, name in kept}


def _numeric_features(feats: dict[str, Any]) -> str | None:
    """None when every feature is a number (or null / a NaN-inf token); else which one is not."""
    from precnb.io.records import stat_value

    for k in _FEATURES:
        v = feats.get(k)
        try:
            stat_value(v)
        except TypeError:
            return f"feature {k!r} is {str(v)[:40]!r}, not a number"
        if isinstance(v, str) and v.strip().lower() not in ("", "null", "none", "n/a"):
            try:
                float(v)
            except ValueError:
                return f"feature {k!r} is {v[:40]!r}, not a number"
    return None


def _records(pack: dict[str, Any], path: Path) -> list[Any]:
    keys = sorted(set(pack["dataset"]) | set(pack["weights"]))
    recs = []
    skipped = pack.setdefault("skipped", [])
    for step, rank in keys:
        b = RecordBuilder(step, rank)
        leaves: list[tuple[str, dict[str, Any]]] = []
        _feature_leaves(pack["dataset"].get((step, rank), {}), "Dataset", leaves)
        for label, feats in leaves:
            why = _numeric_features(feats)
            if why is not None:  # a non-numeric feature is no statistic: named, never a NaN
                skipped.append((f"{path} [dataset/step{step}/rank{rank}/dataset.json]",
                                f"not loaded: {label[len('Dataset.'):]}: {why}"))
                continue
            b.add(label, dict(feats), node="Dataset.forward", module="", api="Dataset", kind="module",
                  direction="forward", role="input", dtype="", parent="", call=0, micro_step=-1)
        for name, feats in (pack["weights"].get((step, rank)) or {}).items():
            if not isinstance(feats, dict):
                raise _bad(path, f"weights/step{step}/rank{rank}/weight.json", f"{name!r}: not a features object")
            why = _numeric_features(feats)
            if why is not None:
                skipped.append((f"{path} [weights/step{step}/rank{rank}/weight.json]", f"not loaded: {name}: {why}"))
                continue
            module = str(name).rsplit(".", 1)[0] if "." in str(name) else ""
            b.add(f"Weights.{name}", dict(feats), node=f"Weights.{module}" if module else "Weights", module=module,
                  api="Weights", kind="module", direction="forward", role="parameter", dtype="", parent="",
                  call=0, micro_step=-1)
        recs.append(b.build(meta={"task": "config_check", "path": str(path)}))
    return recs


def open_config_check(path: str | os.PathLike[str], *, steps: Sequence[int] | None = None,
                      ranks: Sequence[int] | None = None, limits: type[Limits] = Limits,
                      **_ignored: Any) -> xr.Dataset:
    """Open a config_check pack as a canonical dataset (see the module docstring).

    Parameters
    ----------
    path : path-like
        The ``.zip`` pack.
    steps, ranks : sequence of int, optional
        Keep only these (the pack's steps are forward-call counts).
    limits : Limits subclass, optional
        Size bounds.

    Returns
    -------
    xarray.Dataset
        ``Dataset.*`` (role input) and ``Weights.*`` (role parameter) tensors; attrs
        ``source_format="config_check"`` and ``config_check`` (JSON: entries, env, env_variables,
        pip, hyperparameters, random).

    Raises
    ------
    DumpFormatError
        For a broken or unsafe pack.
    """
    p = Path(path)
    pack = read_pack(p, limits=limits)
    recs = [r for r in _records(pack, p) if (steps is None or r.step in set(steps))
            and (ranks is None or r.rank in set(ranks))]
    report = LoadReport(read=[str(p)], skipped=list(pack.get("skipped") or []))
    side = {k: pack[k] for k in ("entries", "env", "env_variables", "pip", "hyperparameters")}
    side["random"] = {str(r): v for r, v in sorted(pack["random"].items())}
    attrs = {"source": str(p), "task": "config_check", "config_check": json.dumps(side, allow_nan=True),
             "load_report": json.dumps(report.to_dict())}
    ds = assemble(recs, source_format="config_check", attrs=attrs)
    ds.attrs["task"] = "config_check"
    return ds


READER = Reader(name="config_check", can_open=is_config_check,
                open=lambda path, steps=None, ranks=None, **_: open_config_check(path, steps=steps, ranks=ranks),
                description="msprobe config_check pack", detect_priority=15)
