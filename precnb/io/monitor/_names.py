"""Monitor file and folder names: the families, their execution order, what a monitor output looks like."""

from __future__ import annotations

import os
import re
from pathlib import Path

from precnb.schema import TENSOR_COORDS

FAMILY_RANK: dict[str, int] = {
    "actv": 0,
    "actv_grad": 1,
    "grad_unreduced": 2,
    "grad_reduced": 3,
    "param_origin": 4,
    "exp_avg": 5,
    "exp_avg_sq": 6,
    "param_updated": 7,
    "cc": 8,
    "other": 9,
    "attention_hook": 10,
    "linear_hook": 11,
    "moe_router_weight_hook": 12,
    "moe_router_logit_hook": 13,
}
_OTHER_HOOK_RANK = 14
_UNKNOWN_RANK = 15
_SEQ_FAMILY, _SEQ_MICRO = 1_000_000, 10_000

_DIRECTION = {
    "actv": "forward",
    "actv_grad": "backward",
    "grad_unreduced": "backward",
    "grad_reduced": "backward",
    "exp_avg": "optimizer",
    "exp_avg_sq": "optimizer",
    "param_origin": "optimizer",
    "param_updated": "optimizer",
}
_PARAM_ROLE = {
    "grad_unreduced": "grad",
    "grad_reduced": "grad",
    "exp_avg": "state",
    "exp_avg_sq": "state",
    "param_origin": "parameter",
    "param_updated": "parameter",
}
_V2_SCOPES = {
    ("module", "forward"): "actv",
    ("module", "backward"): "actv_grad",
    ("weight_grad", "unreduced"): "grad_unreduced",
    ("weight_grad", "reduced"): "grad_reduced",
    ("optimizer", "exp_avg"): "exp_avg",
    ("optimizer", "exp_avg_sq"): "exp_avg_sq",
    ("param", "param_origin"): "param_origin",
    ("param", "param_updated"): "param_updated",
}

_V1_FILE = re.compile(r"^(?P<family>[a-z][a-z0-9_]*?)_(?P<a>[0-9]+)-(?P<b>[0-9]+)\.csv$")
_V2_FILE = re.compile(
    r"^(?P<slug>module|weight_grad|optimizer|param|cc)_step(?P<a>[0-9]+)-(?P<b>[0-9]+)\.csv$")
_V1_RANK = re.compile(r"(?:^|-)rank([0-9]+)-[0-9A-Za-z]+$")
_V2_RANK = re.compile(r"^rank_([0-9]+)$")
_MAX_INDEX = 2**31 - 1  # steps, ranks, vpp stages
_MAX_MICRO = 99_999  # keeps seq (see the module docstring) inside int32
_OUT_OF_RANGE = -2
_IO_NAME = re.compile(r"^(?P<module>.*)\.(?P<io>input|output)(?:_grad)?(?:_\d+)?$")
_IGNORED_DIRS = ("anomaly_detected", "module_struct")

_FIXED_COLUMNS = {"vpp_stage", "name", "module_name", "step", "micro_step", "scope", "shape",
                  "dtype"}
_KNOWN_OPS = {"min", "max", "norm", "mean", "zeros", "nans"}
_RESERVED = {"present", "seq", "numel", "null_stats", "crc", "data_name", "step", "rank", "tensor",
             "run", *TENSOR_COORDS}


def _known_v1_family(family: str) -> bool:
    return family in FAMILY_RANK or family.endswith("_hook")


def family_rank(family: str) -> int:
    """Position of a monitor family in training order (see the module docstring).

    Parameters
    ----------
    family : str

    Returns
    -------
    int

    Examples
    --------
    >>> family_rank("actv"), family_rank("exp_avg_sq"), family_rank("my_hook")
    (0, 6, 14)
    """
    if family in FAMILY_RANK:
        return FAMILY_RANK[family]
    return _OTHER_HOOK_RANK if family.endswith("_hook") else _UNKNOWN_RANK


def _file_kind(name: str) -> tuple[str, str, int, int] | None:
    """``(version, family-or-slug, a, b)`` for a monitor CSV file name, else None."""
    m = _V2_FILE.match(name)
    if m:
        return "v2", m["slug"], int(m["a"]), int(m["b"])
    m = _V1_FILE.match(name)
    if m and _known_v1_family(m["family"]):
        return "v1", m["family"], int(m["a"]), int(m["b"])
    return None


def _holds_monitor_csv(folder: Path) -> bool:
    try:
        with os.scandir(folder) as it:
            for entry in it:
                if entry.name.endswith(".csv") and _file_kind(entry.name) and entry.is_file():
                    return True
    except OSError:
        return False
    return False


def _rank_of_folder(name: str) -> int | None:
    """The rank in a monitor folder name; None when not a rank folder, -2 when out of range."""
    m = _V1_RANK.search(name) or _V2_RANK.match(name)
    if not m:
        return None
    digits = m.group(1)
    return int(digits) if len(digits) <= 10 and int(digits) <= _MAX_INDEX else _OUT_OF_RANGE


def is_monitor_output(path: str | Path) -> bool:
    """Whether *path* is a monitor output root (v1 or v2) or one of its rank folders.

    Parameters
    ----------
    path : str or Path

    Returns
    -------
    bool

    Examples
    --------
    >>> is_monitor_output("/nonexistent")
    False
    """
    p = Path(path)
    try:
        if not p.is_dir():
            return False
        if _holds_monitor_csv(p):
            return True
        with os.scandir(p) as it:
            for entry in it:
                if (_rank_of_folder(entry.name) not in (None, _OUT_OF_RANGE) and entry.is_dir()
                        and _holds_monitor_csv(Path(entry.path))):
                    return True
    except OSError:
        return False
    return False
