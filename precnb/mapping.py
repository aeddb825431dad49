"""Name-mapping files: msprobe's layer / cell / API / data mapping YAML, and precnb's own mapping file.

:func:`load_mapping` reads one file, detects which kind it is and returns a :class:`MappingSpec`
in neutral terms; the aligner (:func:`precnb.align`) turns it into pairs. precnb's own file
(:func:`write_mapping`, ``precnb align -o``) lists module, node and tensor pairs a user can edit
and reuse on the next dump of the same model; a partial file is completed automatically.

Kinds (``MappingSpec.kind``):

``layer``   msprobe ``-lm``: ``{LayerClass: {target_child: baseline_child}}`` plus ``TopLayer``
``cell``    msprobe ``-cm``: ``{target_path.Class: baseline_path.Class}`` (or class renames)
``api``     msprobe ``-am``: ``[{ms_api, pt_api, ms_args, pt_args, ms_outputs, pt_outputs}]``
``data``    msprobe ``-dm``: ``{target_tensor_name: baseline_tensor_name}``
``precnb``  precnb's own: ``{"schema": "precnb.mapping/1", "modules": [...], "nodes": [...], ...}``

msprobe's files name the target (its "NPU" side) first and the baseline ("bench") second;
precnb's own file says ``baseline`` and ``target``.

Examples
--------
>>> spec = parse_mapping({"TopLayer": {"tok_embeddings": "embed"}, "Attention": {"wq": "q_proj"}})
>>> spec.kind, spec.layer["TopLayer"]
('layer', {'tok_embeddings': 'embed'})
>>> parse_mapping({"Functional.linear.0.forward.input.0": "Functional.linear.0.forward.input.0"}).kind
'data'
"""

from __future__ import annotations

import errno
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from precnb.errors import PrecnbError

__all__ = ["MAPPING_SCHEMA", "MappingError", "MappingSpec", "load_mapping", "parse_mapping", "save_mapping",
           "write_mapping"]

MAPPING_SCHEMA = "precnb.mapping/1"
MAX_MAPPING_BYTES = 64 << 20
MAX_DEPTH = 32  # msprobe's files nest 2 levels, precnb's 3
MAX_VALUE_CHARS = 4096  # a module path, a node or a tensor label


class MappingError(PrecnbError):
    """A mapping file that cannot be read or understood (the message names the file and why)."""


@dataclass
class MappingSpec:
    """One mapping file in neutral terms (target → baseline where msprobe's files are one-sided)."""

    kind: str
    source: str = ""
    layer: dict[str, dict[str, str]] = field(default_factory=dict)  # class -> {target child: baseline child}
    cell: dict[str, str] = field(default_factory=dict)  # target path.Class -> baseline path.Class
    api: list[dict[str, Any]] = field(default_factory=list)
    data: dict[str, str] = field(default_factory=dict)  # target tensor -> baseline tensor
    modules: dict[str, str] = field(default_factory=dict)  # baseline path -> target path (precnb)
    nodes: dict[str, str] = field(default_factory=dict)  # baseline node -> target node (precnb)
    tensors: dict[str, str] = field(default_factory=dict)  # baseline label -> target label (precnb)
    unpair: list[str] = field(default_factory=list)  # target nodes that must stay unpaired (precnb)
    problems: list[str] = field(default_factory=list)  # pairs read but not kept (duplicates), said to the user
    found: dict[str, dict[str, tuple[str, float]]] = field(default_factory=dict)  # level -> baseline -> how (precnb)


_TENSOR_NAME = re.compile(r"\.(forward|backward)(\.\d+)?\.(input|output|parameters|kwargs)\b|\.parameters_grad")


def parse_mapping(obj: Any, *, source: str = "") -> MappingSpec:
    """Detect the kind of an already-parsed mapping document and return its :class:`MappingSpec`.

    Raises
    ------
    MappingError
        When the document is none of the known kinds.
    """
    where = source or "mapping"
    if isinstance(obj, dict) and (str(obj.get("schema", "")).startswith("precnb.mapping")
                                  or any(k in obj for k in ("modules", "nodes", "tensors"))):
        spec = MappingSpec("precnb", source)
        for key in ("modules", "nodes", "tensors"):
            items = obj.get(key) or []
            if not isinstance(items, list):
                raise MappingError(f"{where}: {key!r} must be a list of {{baseline, target}} pairs")
            pairs: dict[str, str] = getattr(spec, key)
            for k, item in enumerate(items):
                if not (isinstance(item, dict) and isinstance(item.get("baseline"), str)
                        and isinstance(item.get("target"), str)):
                    raise MappingError(f"{where}: {key}[{k}] must be {{\"baseline\": str, \"target\": str}}")
                b, t = item["baseline"], item["target"]
                if b in pairs and pairs[b] != t:  # one-to-many: a pair is 1:1
                    spec.problems.append(f"{key}[{k}]: baseline {b!r} is paired twice ({pairs[b]!r} and {t!r}); "
                                         "the second pair is ignored")
                    continue
                pairs[b] = t
                how = item.get("how")
                if isinstance(how, str) and how and how != "user":  # how it was found when the file was written
                    conf = item.get("confidence")
                    ok = isinstance(conf, (int, float)) and not isinstance(conf, bool) and 0 <= conf <= 1
                    spec.found.setdefault(key, {})[b] = (how, float(conf) if ok else 1.0)
        unpair = obj.get("unpair") or []
        if not isinstance(unpair, list) or not all(isinstance(x, str) for x in unpair):
            raise MappingError(f"{where}: 'unpair' must be a list of target node names")
        spec.unpair = list(unpair)
        return spec
    if isinstance(obj, list) and obj and all(isinstance(x, dict) and "ms_api" in x and "pt_api" in x for x in obj):
        return MappingSpec("api", source, api=[_api_item(x, k, where) for k, x in enumerate(obj)])
    if isinstance(obj, dict) and obj and all(isinstance(k, str) and isinstance(v, dict) for k, v in obj.items()):
        layer: dict[str, dict[str, str]] = {}
        for cls, sub in obj.items():
            if not all(isinstance(a, str) and isinstance(b, str) for a, b in sub.items()):
                raise MappingError(f"{where}: layer mapping {cls!r} must map child names to child names")
            layer[cls] = dict(sub)
        return MappingSpec("layer", source, layer=layer)
    if isinstance(obj, dict) and obj and all(isinstance(k, str) and isinstance(v, str) for k, v in obj.items()):
        if sum(bool(_TENSOR_NAME.search(k)) for k in obj) >= max(1, len(obj) // 2):
            return MappingSpec("data", source, data=dict(obj))
        return MappingSpec("cell", source, cell=dict(obj))
    raise MappingError(f"{where}: not a mapping file precnb knows (msprobe layer / cell / API / data mapping "
                       "YAML, or precnb's own mapping file from `precnb align -o`)")


_API_LISTS = ("ms_args", "pt_args", "ms_outputs", "pt_outputs")


def _api_item(x: dict[str, Any], k: int, where: str) -> dict[str, Any]:
    """One msprobe API mapping item: two API names and, optionally, argument / output index lists."""
    if not (isinstance(x["ms_api"], str) and isinstance(x["pt_api"], str)):
        raise MappingError(f"{where}: [{k}] ms_api and pt_api must be API names (strings)")
    out: dict[str, Any] = {"ms_api": x["ms_api"], "pt_api": x["pt_api"]}
    for key in _API_LISTS:
        v = x.get(key)
        if v is None:
            continue
        if not (isinstance(v, list) and len(v) <= 4096 and all(isinstance(i, int) and not isinstance(i, bool)
                                                                for i in v)):
            raise MappingError(f"{where}: [{k}] {key} must be a list of argument / output indices")
        out[key] = list(v)
    return out


def load_mapping(path: str | os.PathLike[str]) -> MappingSpec:
    """Read and detect one mapping file (YAML or JSON).

    The file must be a regular file of at most :data:`MAX_MAPPING_BYTES`; YAML is read with the
    C loader when available, and plain YAML only: aliases (a 1.5 kB "billion laughs" expands to
    gigabytes), tags other than the core scalars and collections (``!!python/...``), nesting
    deeper than :data:`MAX_DEPTH` and scalars longer than :data:`MAX_VALUE_CHARS` are refused
    before anything is built.

    Raises
    ------
    MappingError
        Unreadable (missing, a symlink loop, a FIFO, ...), too large, not YAML/JSON, not plain,
        or no known kind (the message names the file).
    """
    from precnb._files import missing_reason, read_regular

    p = Path(path)
    try:
        st = os.stat(p)
        if st.st_size > MAX_MAPPING_BYTES:
            raise MappingError(f"{p}: mapping file larger than {MAX_MAPPING_BYTES >> 20} MB")
        raw = read_regular(p, MAX_MAPPING_BYTES + 1)
    except FileNotFoundError:
        reason = missing_reason(p)
        raise MappingError(f"{p}: no such mapping file" if reason.startswith("no such") else f"{p}: {reason}"
                           ) from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise MappingError(f"{p}: {missing_reason(p)}") from None
        raise MappingError(f"{p}: cannot read: {exc.strerror or exc}") from None
    if len(raw) > MAX_MAPPING_BYTES:
        raise MappingError(f"{p}: mapping file larger than {MAX_MAPPING_BYTES >> 20} MB")
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise MappingError(f"{p}: not UTF-8 text (byte {exc.start})") from None
    obj: Any
    try:
        obj = json.loads(text)
    except RecursionError:
        raise MappingError(f"{p}: nested deeper than {MAX_DEPTH} levels (not a mapping file)") from None
    except ValueError:
        obj = _load_yaml(text, p)
    _check_plain(obj, str(p))
    return parse_mapping(obj, source=str(p))


_CORE_TAGS = frozenset(f"tag:yaml.org,2002:{t}" for t in ("str", "int", "float", "bool", "null", "seq", "map"))


def _load_yaml(text: str, p: Path) -> Any:
    """Plain YAML only: the events are checked (C parser when available) before anything is built."""
    import yaml

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

    def where(ev: Any) -> str:
        mark = getattr(ev, "start_mark", None)
        return f" at line {mark.line + 1}" if mark is not None else ""

    depth = 0
    try:
        for ev in yaml.parse(text, Loader=loader):
            if isinstance(ev, yaml.AliasEvent):
                raise MappingError(f"{p}: YAML alias *{str(ev.anchor)[:40]}{where(ev)}: mapping files are plain "
                                   "YAML; aliases (which can expand a small file into gigabytes) are refused")
            tag = getattr(ev, "tag", None)
            if tag and tag not in _CORE_TAGS and tag != "!":
                raise MappingError(f"{p}: YAML tag {str(tag)[:80]!r}{where(ev)}: mapping files are plain YAML "
                                   "(strings, numbers, lists, maps); precnb never builds objects from tags")
            if isinstance(ev, yaml.ScalarEvent) and len(ev.value) > MAX_VALUE_CHARS:
                raise MappingError(f"{p}: a value of {len(ev.value)} characters{where(ev)} (at most "
                                   f"{MAX_VALUE_CHARS}): not a name")
            if isinstance(ev, yaml.MappingStartEvent | yaml.SequenceStartEvent):
                depth += 1
                if depth > MAX_DEPTH:
                    raise MappingError(f"{p}: nested deeper than {MAX_DEPTH} levels{where(ev)} (not a mapping file)")
            elif isinstance(ev, yaml.MappingEndEvent | yaml.SequenceEndEvent):
                depth -= 1
        return yaml.load(text, Loader=loader)  # noqa: S506 - a safe loader, on events checked above
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}" if mark is not None else ""
        raise MappingError(f"{p}: not valid YAML or JSON{at}") from None


def _check_plain(obj: Any, where: str) -> None:
    """Plain data of bounded size: strings, numbers, booleans, null, lists and maps (no recursion)."""
    stack = [(obj, 0)]
    while stack:
        x, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise MappingError(f"{where}: nested deeper than {MAX_DEPTH} levels (not a mapping file)")
        if isinstance(x, dict):
            for k, v in x.items():
                if not isinstance(k, str | int | float | bool) or (isinstance(k, str) and len(k) > MAX_VALUE_CHARS):
                    raise MappingError(f"{where}: a key that is not a short name ({str(k)[:60]!r})")
                stack.append((v, depth + 1))
        elif isinstance(x, list):
            stack.extend((v, depth + 1) for v in x)
        elif isinstance(x, str):
            if len(x) > MAX_VALUE_CHARS:
                raise MappingError(f"{where}: a value of {len(x)} characters (at most {MAX_VALUE_CHARS}): not a name")
        elif x is not None and not isinstance(x, int | float | bool):
            raise MappingError(f"{where}: a {type(x).__name__} value ({str(x)[:60]!r}): mapping values are names")


def write_mapping(doc: dict[str, Any]) -> str:
    """The text of precnb's own mapping file for *doc* (an :meth:`Alignment.mapping_document`).

    It carries precnb's output marker (``"precnb_output"``), so ``--overwrite`` may replace it.
    """
    from precnb._marks import MARKER_KEY, marker

    out = {"schema": MAPPING_SCHEMA, MARKER_KEY: marker("mapping"),
           **{k: v for k, v in doc.items() if k not in ("schema", MARKER_KEY)}}
    return json.dumps(out, indent=1, ensure_ascii=False) + "\n"


def save_mapping(doc: dict[str, Any], path: str | os.PathLike[str], *, overwrite: bool = False,
                 inputs: Any = ()) -> Path:
    """Write precnb's mapping file by the rules of :mod:`precnb._write` (atomic; never over an input).

    Raises
    ------
    precnb.errors.OutputRefusedError
        When *path* exists without *overwrite*, exists and is not a precnb output, lies inside
        an input (*inputs*: the runs aligned), or its folder does not exist.
    """
    from precnb._write import write_text

    return write_text(Path(path).expanduser(), write_mapping(doc), inputs=inputs, overwrite=overwrite)
