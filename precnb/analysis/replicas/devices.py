"""Replica departures followed to hosts and devices, across steps and jobs: which device is suspect.

Input: for each job (run), its classified replica departures (the events of
:func:`precnb.analysis.replicas.departures.departure_events`, as ``Finding.evidence["departures"]`` lists them)
and its rank table. Output: one entry per device, most suspect first, in the shape ``precnb devices``
prints::

    {"host", "device", "ranks": {run: rank}, "departures": [{"run", "step", "rank", "node",
     "inputs_identical"}], "verdict": "suspect" | "clean" | "inconclusive", "why"}

The rules:

* a device is blamed by an event when its rank is the event's wrong side (a clean run or a third replica
  decided), or one of its two candidates (a pair, undecided);
* an event whose op is random (an unsynchronised seed) is code, not a device;
* a rank blamed in every job while the device serving it changes: the departure **follows the rank**,
  it points at code or data, and the devices are not blamed for it;
* devices are taken most-blamed first (jobs, then decided events, then events); a device is ``suspect``
  when the events left to it span more than one job, or several steps where they were decided or where it
  is the one candidate common to all of them (undecided pairs with different partners); with one job the
  verdict is at most "suspect (one event)"; events an earlier suspect explains are not counted again for
  its pair partner (``clean``);
* an undecided pair otherwise stays ``inconclusive``, both devices named as candidates, each ``why``
  naming the other (device and rank) and what decides: a clean run, a third replica, or (with one job,
  where the verdict is at most "suspect (one event)") the job rescheduled onto another placement.

Examples
--------
>>> tables = {"a": {0: {"host": "h", "device": "0"}, 1: {"host": "h", "device": "1"}},
...           "b": {0: {"host": "h", "device": "1"}, 1: {"host": "h", "device": "0"}}}
>>> ev = lambda step, rank: {"step": step, "rank": rank, "node": "Torch.rsqrt.0.forward", "inputs_identical": True,
...                          "cause": "compute_fault", "group": [0, 1], "candidates": [0, 1], "wrong_side": []}
>>> out = device_verdicts({"a": [ev(1, 1)], "b": [ev(2, 1)]}, tables)
>>> [(d["device"], d["verdict"]) for d in out]
[('0', 'inconclusive'), ('1', 'inconclusive')]
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["device_verdicts"]

_ORDER = {"suspect": 0, "inconclusive": 1, "clean": 2}
_JUDGE = {"baseline": "the clean run", "majority": "the majority of its replicas",
          "replicated_copy": "the copy of a value replicated on every rank"}


def _name(dev: tuple[str, str]) -> str:
    return f"{dev[0]}:{dev[1]}"


def _blamed(ev: Mapping[str, Any]) -> list[int]:
    return [int(r) for r in (ev.get("wrong_side") or ev.get("candidates") or [ev["rank"]])]


def _where(hits: Sequence[tuple[str, Mapping[str, Any], int]]) -> str:
    by_run: dict[str, list[str]] = {}
    for run, ev, _ in hits:
        by_run.setdefault(run, []).append(f"{ev['step']}")
    ranks: dict[str, set[int]] = {}
    for run, _, rank in hits:
        ranks.setdefault(run, set()).add(rank)
    return "; ".join(f"{run} step{'s' if len(st) > 1 else ''} {', '.join(dict.fromkeys(st))} as rank "
                     f"{'/'.join(map(str, sorted(ranks[run])))}" for run, st in by_run.items())


def device_verdicts(events: Mapping[str, Sequence[Mapping[str, Any]]],
                    tables: Mapping[str, Mapping[int, Mapping[str, str]]]) -> list[dict[str, Any]]:
    """Per device: the rank it served in each job, its departures, and a verdict with why (most suspect first).

    Parameters
    ----------
    events : mapping run -> list of dict
        Each job's departure events: ``step, rank, node, inputs_identical, cause, group, candidates,
        wrong_side`` (``Finding.evidence["departures"]`` of the replica diagnosis).
    tables : mapping run -> rank table
        ``{rank: {"host", "device"}}`` of each job.

    Returns
    -------
    list of dict
    """
    jobs = _Jobs(events, tables)
    explained: dict[_Key, tuple[str, str]] = {}
    out: list[dict[str, Any]] = []
    for dev in sorted(jobs.where, key=lambda d: (tuple(-x for x in jobs.weight(d)), d)):
        verdict, why = jobs.verdict(dev, explained)
        out.append({"host": dev[0], "device": dev[1], "ranks": dict(jobs.where[dev]),
                    "departures": jobs.departures[dev], "verdict": verdict, "why": why})
    out.sort(key=lambda d: _ORDER[d["verdict"]])  # stable: most blamed first within each verdict
    return out


_Dev = tuple[str, str]
_Key = tuple[str, int, tuple[int, ...]]
_Hit = tuple[str, Mapping[str, Any], int]


def _key(run: str, ev: Mapping[str, Any]) -> _Key:
    return (run, int(ev["step"]), tuple(ev["group"]))


class _Jobs:
    """The departures of every job, by the device that served the blamed rank."""

    def __init__(self, events: Mapping[str, Sequence[Mapping[str, Any]]],
                 tables: Mapping[str, Mapping[int, Mapping[str, str]]]) -> None:
        self.tables = tables
        self.runs = runs = list(tables)
        self.where: dict[_Dev, dict[str, int]] = {}
        for run in runs:
            for rank, d in tables[run].items():
                self.where.setdefault((str(d["host"]), str(d["device"])), {})[run] = int(rank)
        follows = self._rank_follows(events)
        self.departures: dict[_Dev, list[dict[str, Any]]] = {d: [] for d in self.where}
        self.hits: dict[_Dev, list[_Hit]] = {d: [] for d in self.where}
        self.seed: dict[_Dev, list[str]] = {d: [] for d in self.where}
        self.rank_follow: dict[_Dev, set[int]] = {d: set() for d in self.where}
        for run in runs:
            for ev in events.get(run, ()):
                for r in _blamed(ev):
                    self._add(run, ev, r, follows)
        self.blamed_by: dict[_Key, dict[_Dev, int]] = {}  # event -> device -> rank
        for one, hs in self.hits.items():
            for run, ev, r in hs:
                self.blamed_by.setdefault(_key(run, ev), {})[one] = r
        self.at_most = ("; with one job the verdict is at most 'suspect (one event)': a clean run of the same "
                        "training (--baseline), a third replica or the job rescheduled onto another rank placement "
                        "decides") if len(runs) == 1 else \
            "; a clean run (--baseline), a third replica or another placement decides"

    def dev_of(self, run: str, rank: int) -> _Dev | None:
        d = self.tables[run].get(rank)
        return (str(d["host"]), str(d["device"])) if d else None

    def _rank_follows(self, events: Mapping[str, Sequence[Mapping[str, Any]]]) -> set[int]:
        """Ranks blamed in every job while the device serving them changes: the departure follows the rank."""
        runs = self.runs
        blamed = {run: {r for ev in events.get(run, ()) if ev.get("inputs_identical") for r in _blamed(ev)}
                  for run in runs}
        blamed_devs = {run: {self.dev_of(run, r) for r in blamed[run]} for run in runs}
        follows: set[int] = set()
        if len(runs) > 1:
            for r in set.intersection(*blamed.values()) if blamed else set():
                # a device that served r in one job and did not depart in another: r departs, not the device
                if any(self.dev_of(a, r) not in blamed_devs[b] for a in runs for b in runs if a != b):
                    follows.add(r)
        return follows

    def _add(self, run: str, ev: Mapping[str, Any], r: int, follows: set[int]) -> None:
        dev = self.dev_of(run, r)
        if dev is None:
            return
        self.departures[dev].append({"run": run, "step": int(ev["step"]), "rank": r, "node": ev["node"],
                                     "inputs_identical": bool(ev.get("inputs_identical"))})
        if not ev.get("inputs_identical"):
            return  # inherited: a consequence, not an origin
        is_seed = ev.get("cause") == "unsynchronised_seed"
        if is_seed:
            self.seed[dev].append(str(ev["node"]))
        if r in follows:
            self.rank_follow[dev].add(r)
        if not is_seed and r not in follows:
            self.hits[dev].append((run, ev, r))

    def weight(self, dev: _Dev) -> tuple[int, int, int]:
        h = self.hits[dev]
        return (len({run for run, _, _ in h}), sum(1 for _, ev, r in h if r in (ev.get("wrong_side") or [])), len(h))

    def partners(self, dev: _Dev, mine: Sequence[_Hit]) -> str:
        """The other candidates of *dev*'s events: ``10.0.0.1:0 (job1 rank 0)``."""
        seen: dict[str, None] = {}
        for run, ev, _ in mine:
            for o, r in self.blamed_by.get(_key(run, ev), {}).items():
                if o != dev:
                    seen[f"{_name(o)} ({run} rank {r})"] = None
        return ", ".join(seen) or "no other device of the rank tables"

    def verdict(self, dev: _Dev, explained: dict[_Key, _Dev]) -> tuple[str, str]:
        """(verdict, why) of *dev*, the devices judged before it having *explained* their events."""
        h = self.hits[dev]
        mine = [(run, ev, r) for run, ev, r in h if _key(run, ev) not in explained]
        if mine:
            return self._blamed_verdict(dev, mine, explained)
        if h:
            by = sorted({_name(explained[_key(run, ev)]) for run, ev, _ in h})
            return "clean", self._seed_too(dev, f"its departures ({_where(h)}) are explained by the other side, "
                                                f"{', '.join(by)}, which is suspect")
        if self.rank_follow[dev]:
            rs = sorted(self.rank_follow[dev])
            return "clean", self._seed_too(dev, (
                f"the departure follows rank{'s' if len(rs) > 1 else ''} {', '.join(map(str, rs))} across devices "
                "in every job, not this device: it points at code or data (the same rank departs wherever it runs)"))
        if self.seed[dev]:
            return "clean", (f"its departures are a random op ({', '.join(sorted(set(self.seed[dev])))}) drawing other "
                             "numbers: an unsynchronised seed is code, not this device")
        return "clean", "no replica departure with identical inputs on this device"

    def _seed_too(self, dev: _Dev, why: str) -> str:
        if self.seed[dev]:  # the random op's part of the story
            ops = ", ".join(sorted(set(self.seed[dev])))
            why += f"; the random op {ops} departs too: an unsynchronised seed (code)"
        return why

    def _blamed_verdict(self, dev: _Dev, mine: list[_Hit], explained: dict[_Key, _Dev]) -> tuple[str, str]:
        """The verdict of a device blamed for events no device judged before it explains."""
        decided = [(run, ev, r) for run, ev, r in mine if r in (ev.get("wrong_side") or [])]
        jobs = {run for run, _, _ in mine}
        steps = {(run, int(ev["step"])) for run, ev, _ in mine}
        keys = {_key(run, ev) for run, ev, _ in mine}
        twins = [_name(o) for o in self.where if o != dev and keys and {
            _key(run, ev) for run, ev, _ in self.hits[o]} == keys and not any(
            r in (ev.get("wrong_side") or []) for _, ev, r in mine)]
        # undecided pairs at several steps whose only common candidate is this device
        common = set.intersection(*(set(self.blamed_by[k]) for k in keys)) if keys else set()
        if twins:
            times = "each time together with" if len(keys) > 1 else "together with"
            return "inconclusive", (f"candidate: departed with identical inputs ({_where(mine)}) {times} "
                                    f"{self.partners(dev, mine)}: a pair cannot say which side is wrong, so both are "
                                    "candidates and nothing tells them apart" + self.at_most)
        if not (len(jobs) > 1 or decided or (len(steps) > 1 and common == {dev})):
            return "inconclusive", (f"candidate: one of the two replicas that departed with identical inputs "
                                    f"({_where(mine)}), with {self.partners(dev, mine)}: a pair cannot say which side "
                                    "is wrong" + self.at_most)
        judges = sorted({_JUDGE.get(str(ev.get("decided_by")), "a decision") for _, ev, _ in decided})
        at = ", ".join(dict.fromkeys(f"{run} step {ev['step']}" for run, ev, _ in decided))
        how = ("in more than one job, on different ranks: it follows the device" if len(jobs) > 1 else
               f"at {len(steps)} step(s); {' and '.join(judges)} names it the wrong side at {at}" if decided else
               f"at {len(steps)} steps, with other replicas ({self.partners(dev, mine)}): the one device common to "
               "those departures")
        why = f"departed with identical inputs ({_where(mine)}) {how}"
        if len(self.runs) == 1:
            why = ("suspect (one event): " + why + "; one job only: rerun with another rank placement (or on a "
                   "clean device) to confirm")
        for run, ev, _ in mine:
            explained[_key(run, ev)] = dev
        return "suspect", why
