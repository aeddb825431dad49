"""Which mindstudio-probe release wrote a dump, as far as the dump itself says.

Every release writes the same records a little differently (``tests/fixtures/msprobe_releases`` holds the same
training dumped by each): the backward sections are ``grad_input``/``grad_output`` in 1.0.1 only; parameters
and parameter gradients are recorded from 1.2.0; dump.json has a ``framework`` key from 1.2.1; records carry
``is_recompute`` from 1.2.2 to 26.0.0; stack.json is deduplicated (grouped) from 8.1.0; parameter gradients are
numbered (``parameters_grad.N``) and a process without ``torch.distributed`` writes ``proc<PID>`` instead of
``rank`` from 26.0.0; integer tensors get a null Mean/Norm from 26.1.0. :func:`file_facts` reads those facts
from one parsed file, :func:`release_range` intersects what they allow. The answer is a range (most dumps fit
several releases); it goes into the dataset attributes ``msprobe_release`` and ``msprobe_release_evidence``.

Examples
--------
>>> release_range([{"framework_key": False, "backward": "grad"}])
(['1.0.1'], ['backward records hold grad_input/grad_output (1.0.1)', 'dump.json has no framework key (up to 1.2.0)'])
>>> release_text(release_range([{"stack": "grouped", "param_grad": "plain"}])[0])
'8.1.0–8.3.3'
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["RELEASES", "RULES", "release_range", "release_text", "stack_format"]

#: the mindstudio-probe releases on the registry, oldest first
RELEASES = ("1.0.1", "1.0.3", "1.0.4", "1.1.0", "1.1.1", "1.2.0", "1.2.1", "1.2.2", "1.3.0", "8.1.0", "8.1.1", "8.1.2",
            "8.2.0", "8.2.1", "8.3.0", "8.3.1", "8.3.2", "8.3.3", "26.0.0", "26.1.0", "26.1.0.post1", "26.2.0")

#: (fact, value) -> (first release, last release, what the dump shows); None: no bound on that side. Facts
#: marked PyTorch in file_facts are only read from PyTorch dumps (MindSpore's writer differs there)
RULES: dict[tuple[str, Any], tuple[str | None, str | None, str]] = {
    ("backward", "grad"): ("1.0.1", "1.0.1", "backward records hold grad_input/grad_output"),
    ("backward", "io"): ("1.0.3", None, "backward records hold input/output"),
    ("framework_key", True): ("1.2.1", None, "dump.json has a framework key"),
    ("framework_key", False): (None, "1.2.0", "dump.json has no framework key"),
    ("module_parameters", True): ("1.2.0", None, "module records hold parameters"),
    ("module_parameters", False): (None, "1.1.1", "module records hold no parameters"),
    ("param_grad", "numbered"): ("26.0.0", None, "parameter gradients are numbered (parameters_grad.N)"),
    ("param_grad", "plain"): ("1.2.0", "8.3.3", "parameter gradients are not numbered"),
    ("is_recompute", True): ("1.2.2", "26.0.0", "records carry is_recompute"),
    ("is_recompute", False): (None, None, ""),  # its absence says nothing: 26.x and before 1.2.2 alike
    ("stack", "grouped"): ("8.1.0", None, "stack.json is deduplicated (grouped)"),
    ("stack", "plain"): (None, "1.3.0", "stack.json is one entry per node"),
    ("folder", "proc"): ("26.0.0", None, "a single process writes proc<PID> folders"),
    ("folder", "rank"): (None, "8.3.3", "a single process writes a bare rank folder"),
    ("int_stats", "null"): ("26.1.0", None, "integer tensors have a null Mean/Norm"),
    ("int_stats", "filled"): (None, "26.0.0", "integer tensors have a float Mean/Norm"),
}


def _bound(first: str | None, last: str | None) -> str:
    if first and last:
        return first if first == last else f"{first}–{last}"
    return f"{first} or later" if first else f"up to {last}"


def release_range(facts: Iterable[Mapping[str, Any]]) -> tuple[list[str], list[str]]:
    """(candidate releases, the evidence in words) of the facts of a run's files.

    The candidates are the releases every fact allows (empty when the facts contradict each other, e.g. two
    releases' files mixed in one run); the evidence lists each distinct fact once.
    """
    allowed = set(RELEASES)
    said: dict[str, None] = {}
    for f in facts:
        for key, value in f.items():
            rule = RULES.get((key, value))
            if rule is None or not rule[2]:
                continue
            first, last, words = rule
            lo = RELEASES.index(first) if first else 0
            hi = RELEASES.index(last) if last else len(RELEASES) - 1
            allowed &= set(RELEASES[lo:hi + 1])
            said[f"{words} ({_bound(first, last)})"] = None
    return [r for r in RELEASES if r in allowed], sorted(said)


def release_text(candidates: list[str]) -> str:
    """``"8.1.0–8.3.3"`` (a run of consecutive releases), ``"1.0.1"``, a list, or ``""`` when none fits.

    Examples
    --------
    >>> release_text(["8.1.0", "8.1.1"]), release_text(["1.0.1", "8.1.0"]), release_text(list(RELEASES))
    ('8.1.0–8.1.1', '1.0.1, 8.1.0', '')
    """
    if not candidates or len(candidates) == len(RELEASES):
        return ""
    idx = [RELEASES.index(c) for c in candidates]
    if idx == list(range(idx[0], idx[-1] + 1)):
        return candidates[0] if len(candidates) == 1 else f"{candidates[0]}–{candidates[-1]}"
    return ", ".join(candidates)


def stack_format(raw: bytes) -> str | None:
    """``"grouped"`` (8.1.0 and later: ``{"0": [[nodes], [frames]], ...}``), ``"plain"`` or None (empty / unknown).

    Examples
    --------
    >>> stack_format(b'{"0": [["a"], ["f"]]}'), stack_format(b' { "Functional.x.0.forward": ["f"]}')
    ('grouped', 'plain')
    >>> stack_format(b"{}") is None
    True
    """
    head = raw[:4096].lstrip()
    if not head.startswith(b"{"):
        return None
    rest = head[1:].lstrip()
    if not rest.startswith(b'"'):
        return None
    return "grouped" if rest.startswith(b'"0"') else "plain"


def file_facts(*, top: Mapping[str, Any], framework: str, folder: str, backward: str | None, is_recompute: bool | None,
               kinds: Iterable[str], calls: Iterable[int], has_parameters: bool, stack: str | None,
               int_stats: str | None) -> dict[str, Any]:
    """The release facts of one parsed dump.json (see :data:`RULES`).

    *kinds* / *calls*: the kinds and call counters of its nodes; *int_stats*: ``"null"`` / ``"filled"`` from
    its integer tensors with at least one dimension (None without any).
    """
    out: dict[str, Any] = {"framework_key": "framework" in top}
    if backward:
        out["backward"] = backward
    kinds = list(kinds)
    numbered = [c >= 0 for k, c in zip(kinds, calls, strict=True) if k == "param_grad"]
    if numbered:
        out["param_grad"] = "numbered" if any(numbered) else "plain"
    if stack:
        out["stack"] = stack
    if framework == "pytorch":  # MindSpore's writers: integer statistics filled, no is_recompute, cell dumps
        if "module" in kinds:  # without parameters
            out["module_parameters"] = has_parameters
        if is_recompute is not None:
            out["is_recompute"] = is_recompute
        if int_stats:
            out["int_stats"] = int_stats
        if folder == "rank" or folder.startswith("proc"):
            out["folder"] = "rank" if folder == "rank" else "proc"
    return out
