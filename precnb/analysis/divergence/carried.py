"""Error created, not carried: differences an op's own inputs explain are not a first divergence.

Two healthy runs laid out differently (TP partial sums, another reduction order, a thread count) differ by
rounding noise, and after a few optimizer steps that noise grows through the layers until some tensor crosses
the relative tolerance — which would make an ordinary op the "first divergence". A fault *creates* error: its
op's output differs far more than its inputs do. So a difference is **carried** (not searched as an origin)
when

- an op's output differs by at most :data:`CARRY` times the largest difference of the same call's inputs, or
  its absolute difference is at most :data:`CARRY` times the sum of its inputs' (an addition of noisy addends
  that cancel has a large relative error but no new error); a module call's weights are operands too, their
  noise magnified by the cancellation of its products (``||x|| ||W|| / ||y||``), as are the operands of a
  matrix product call (``matmul``, ``bmm``, ``linear`` …); an output both runs record
  with an earlier output's statistics (a module returning its last child's) is carried when that one is;
- a parameter's gradient ``G = g^T x`` differs by at most :data:`GRAD_CARRY` times what its module's forward
  input ``x`` and output gradient ``g`` explain, magnified by the cancellation of the sum (``||x|| ||g|| / ||G||``);
- a parameter after an Adam step (and an input holding one: ``Tensor.t`` of a weight) whose Mean and Norm agree
  within tolerance and whose Max and Min moved by less than the optimizer's ``lr``: Adam's normalisation magnifies
  a near-zero gradient element's rounding noise by up to ``1 / eps``, a fraction of one step's size; and at the
  steps after, an output whose Max or Min alone differs, by a few tolerances, in a module whose parameters moved
  that way (one element's noise: :mod:`precnb.analysis.divergence.element_noise`), and an optimizer's gradient
  list entry whose Max or Min alone differs while its parameter's entry moved within the tolerance (level L1);
- an op's input differs by at most :data:`CARRY` times the op output that produced it (the latest earlier
  output on the same step and rank with the same target statistics: :mod:`precnb.analysis.causal.dataflow`'s
  rule), which was itself not an origin; an input no recorded op produced, inside a module call, by at most
  :data:`CARRY` times what that call's own input and weights explain (as for its output); an optimizer's list
  entry no recorded op produced (a gradient at level L1) by at most :data:`CARRY` times what the matrix products
  of its element count explain (its addends), magnified by the cancellation of their sum.

Between two runs that agree bit for bit before a fault nothing is carried (every input difference is 0), so a
fault of any size above the tolerance is still found at the op that makes it.

Examples
--------
>>> CARRY
8.0
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import numpy as np

from precnb.analysis.divergence.element_noise import list_entry_noise, one_element_noise
from precnb.analysis.divergence.list_entries import is_list_entry as _is_list_entry
from precnb.analysis.divergence.list_entries import lists_renamed as _lists_renamed

__all__ = ["CARRY", "GRAD_CARRY", "carried_differences", "created_rule"]

CARRY = 8.0


def _scale(ds: Any, si: int, ri: int) -> np.ndarray:
    """Each tensor's magnitude at one entry: max |x| (0 where unknown)."""
    with np.errstate(invalid="ignore"):
        m = np.fmax(np.abs(ds["max"].values[si, ri]), np.abs(ds["min"].values[si, ri]))
    return np.where(np.isfinite(m), m, 0.0)


class _Tables:
    """What the rules read of one judged pair: roles, the calls' inputs, producers and gradient sources."""

    def __init__(self, j: Any) -> None:
        b = j.b
        self.roles, self.nodes = b["role"].values, b["node"].values
        self.parents = b["parent"].values if "parent" in b.coords else None
        self.rel = np.asarray(j.cmp.rel.values, np.float64)
        self.both = np.asarray(j.cmp.both.values, bool)
        self.seq = np.asarray(j.seq.values)
        self.norm = np.abs(np.asarray(b["norm"].values, np.float64))
        self.stats = np.stack([np.asarray(j.t[s].values) for s in ("max", "min", "mean", "norm")], axis=-1)
        self.b, self.t = b, j.t
        self.inputs_of: dict[Any, list[int]] = defaultdict(list)
        self.module_inputs: dict[tuple[str, str], list[int]] = defaultdict(list)  # (module call, direction)
        for c in np.flatnonzero(self.roles == "input").tolist():
            n = str(self.nodes[c])
            self.inputs_of[self.nodes[c]].append(c)
            for d in ("forward", "backward"):
                if n.startswith(("Module.", "Cell.")) and f".{d}." in n:
                    head, _, call = n.rpartition(f".{d}.")
                    self.module_inputs[(f"{head}.{call}", d)].append(c)
        self._params_under: dict[str, list[int]] = {}
        self.params_of: dict[Any, list[int]] = defaultdict(list)  # a module call's own parameters: operands too
        for c in np.flatnonzero(self.roles == "parameter").tolist():
            self.params_of[self.nodes[c]].append(c)
        self.bstats = np.stack([np.asarray(b[s].values) for s in ("max", "min", "mean", "norm")], axis=-1)
        self.outputs = np.flatnonzero((self.roles == "output") | (self.roles == "grad"))  # what an input can copy
        labels = [str(x) for x in b["tensor"].values]
        self.labels = labels
        self.renamed_lists = not (self.roles == "grad").any() and _lists_renamed(b)  # L1, stage lists renamed
        self.products = np.flatnonzero((self.roles == "output")
                                       & np.array([_is_product(str(n)) for n in self.nodes], dtype=bool))
        where = self.where = {lbl: k for k, lbl in enumerate(labels)}
        self.adam_lr = _adam_lr(j.t)  # (first step, largest lr) of the Adam-family optimizer calls recorded
        self.params = np.flatnonzero(self.roles == "parameter")
        self.numel = np.asarray(j.t["numel"].values, np.float64) if "numel" in j.t.data_vars else None
        self.rtol = np.asarray(j.cmp.rtol.values, np.float64)
        self.step_values = [int(x) for x in j.t["step"].values]
        self.earlier_grad: dict[int, int] = {}  # a gradient record -> the same parameter's at the previous call
        for g in np.flatnonzero(self.roles == "grad").tolist():
            head, sep, rest = labels[g].rpartition(".parameters_grad.")
            call, _, name = rest.partition(".")
            if sep and call.isdigit() and int(call) > 0:
                k = where.get(f"{head}.parameters_grad.{int(call) - 1}.{name}")
                if k is not None:
                    self.earlier_grad[g] = k

    def params_under(self, path: str) -> list[int]:
        """The parameter columns of a module and its children (*path*: ``Module.0.decoder.layers.0.mlp``)."""
        if not path:
            return []
        out = self._params_under.get(path)
        if out is None:
            out = self._params_under[path] = [c for node, cs in self.params_of.items()
                                              if str(node).startswith(path + ".") for c in cs]
        return out

    def at(self, si: int, ri: int) -> _Entry:
        """The rules at one (step, rank)."""
        return _Entry(self, si, ri)


class _Entry:
    """The carried rules at one (step, rank) of a :class:`_Tables`."""

    def __init__(self, tab: _Tables, si: int, ri: int) -> None:
        self.tab, self.si, self.ri = tab, si, ri
        self.rel, self.both = tab.rel[si, ri], tab.both[si, ri]
        scale = np.fmax(_scale(tab.b, si, ri), _scale(tab.t, si, ri))
        with np.errstate(invalid="ignore", over="ignore"):
            self.err = self.rel * scale  # the absolute difference, roughly
        self._producers: dict[bytes, list[tuple[int, int]]] | None = None
        self._weights: set[bytes] | None = None

    def carried(self, c: int, factor: float) -> bool:
        """Whether the difference of tensor *c* here is explained by what its op read."""
        role = self.tab.roles[c]
        if role == "output":
            return self._output(c, factor)
        if role == "grad":
            return self._grad(c) or one_element_noise(self.tab, self.si, self.ri, c)
        if role == "parameter" or (role == "input" and self._is_weight(c)):
            return self._optimizer_step(c)
        return role == "input" and (self._input(c, factor) or list_entry_noise(self.tab, self.si, self.ri, c))

    def _is_weight(self, c: int) -> bool:
        """Whether input *c* holds a parameter's statistics at this entry (``Tensor.t`` of a weight)."""
        tab = self.tab
        if self._weights is None:
            ps = tab.params[tab.both[self.si, self.ri, tab.params]]
            self._weights = {tab.stats[self.si, self.ri, p].tobytes() for p in ps.tolist()}
        return tab.stats[self.si, self.ri, c].tobytes() in self._weights

    def _optimizer_step(self, c: int) -> bool:
        """A parameter after an Adam step: extremes within one step's size (lr), Mean and Norm within tolerance.

        Adam moves each element by about ``lr * m / (sqrt(v) + eps)``; for a gradient element near ``eps`` (an
        expert that got few tokens) that ratio magnifies the gradients' rounding noise by up to ``1 / eps``, so one
        element's value may differ by a fraction of ``lr`` between two healthy layouts: an extreme that moved by
        less than ``lr`` while the Mean and Norm agree is that noise. Needs an Adam-family call recorded (its
        ``lr``) and a step after the first.
        """
        tab = self.tab
        lr = tab.adam_lr
        if lr is None or tab.step_values[self.si] <= 0:  # step 0: no optimizer step came before it
            return False
        a, b = tab.stats[self.si, self.ri, c], tab.bstats[self.si, self.ri, c]
        if not (np.isfinite(a).all() and np.isfinite(b).all()):
            return False
        n = float(tab.numel[self.si, self.ri, c]) if tab.numel is not None else 1.0
        with np.errstate(invalid="ignore", divide="ignore"):
            rms = max(abs(float(a[3])), abs(float(b[3]))) / np.sqrt(max(n, 1.0))
        amax = max(abs(float(x)) for x in (a[0], a[1], b[0], b[1]))
        rtol = float(tab.rtol[c])
        for k in (2, 3):  # Mean, Norm: within the comparison's own tolerance
            scale = max(abs(float(a[k])), abs(float(b[k])), rms, amax)
            if abs(float(a[k]) - float(b[k])) > rtol * scale:
                return False
        return bool(abs(float(a[0]) - float(b[0])) <= lr[1] and abs(float(a[1]) - float(b[1])) <= lr[1])

    def _output(self, c: int, factor: float) -> bool:
        return self._output_own(c, factor) or self._copy(c, factor) or one_element_noise(self.tab, self.si, self.ri, c)

    def _output_own(self, c: int, factor: float) -> bool:
        """What the call's own operands explain: its inputs and, for a module call, its weights.

        ``y = f(x, W)`` carries the noise of either, magnified by the cancellation of its products
        (``||x|| ||W|| / ||y||``, as for a gradient).
        """
        tab = self.tab
        ins = [i for i in tab.inputs_of.get(tab.nodes[c], ()) if self.both[i]]
        params = [p for p in tab.params_of.get(tab.nodes[c], ()) if self.both[p]]
        worst = self.rel[ins].max() if ins else 0.0
        if len(ins) >= 2 and not params and _is_product(str(tab.nodes[c])):  # x @ W: the same magnification
            norm = tab.norm[self.si, self.ri]
            big = np.sort(norm[ins])[-2:]
            with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
                cond = float(big[0]) * float(big[1]) / np.float64(norm[c])
            worst = float(worst) * (cond if np.isfinite(cond) and cond > 1 else 1.0)
        if params:
            norm = tab.norm[self.si, self.ri]
            made = max(float(worst), float(self.rel[params].max()))
            with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
                cond = float(norm[ins].max() if ins else 0.0) * float(norm[params].max()) / np.float64(norm[c])
            worst = made * (cond if np.isfinite(cond) and cond > 1 else 1.0)
            ins = ins + params
        return bool(worst > 0 and (self.rel[c] <= factor * worst or self.err[c] <= factor * self.err[ins].sum()))

    def _copy(self, c: int, factor: float, depth: int = 0) -> bool:
        """An output both runs record with an earlier output's statistics: carried when that one is.

        A module returns its last child's output (an MLP its ``linear_fc2``'s): the child's operands decide.
        """
        tab, si, ri = self.tab, self.si, self.ri
        own = int(tab.seq[si, ri, c])
        key_t, key_b = tab.stats[si, ri, c].tobytes(), tab.bstats[si, ri, c].tobytes()
        for p in tab.outputs.tolist():
            if p == c or not self.both[p] or tab.nodes[p] == tab.nodes[c] or int(tab.seq[si, ri, p]) > own:
                continue
            if tab.stats[si, ri, p].tobytes() == key_t and tab.bstats[si, ri, p].tobytes() == key_b:
                return depth < 4 and tab.roles[p] == "output" and (self._output_own(p, factor) or
                                                                     self._copy(p, factor, depth + 1))
        return False

    def _grad(self, c: int) -> bool:
        """A parameter's gradient: a product of its module's input and output gradient, accumulated over calls."""
        tab = self.tab
        head, _, call = str(tab.nodes[c]).rpartition(".parameters_grad.")
        fwd, bwd = ([i for i in tab.module_inputs.get((f"{head}.{call}", d), []) if self.both[i]]
                    for d in ("forward", "backward"))
        made = _product_noise(self.rel, tab.norm[self.si, self.ri], fwd, bwd, c) if fwd and bwd else 0.0
        prev = tab.earlier_grad.get(c)
        if prev is not None and self.both[prev]:
            made = max(made, float(self.rel[prev]) * CARRY / GRAD_CARRY)
        return bool(made > 0 and self.rel[c] <= GRAD_CARRY * made)

    def _input(self, c: int, factor: float) -> bool:
        """An input: carried when an earlier output with its statistics (its producer) differs comparably."""
        tab, si, ri = self.tab, self.si, self.ri
        if self._producers is None:
            self._producers = defaultdict(list)
            for p in tab.outputs[self.both[tab.outputs]].tolist():
                self._producers[tab.stats[si, ri, p].tobytes()].append((int(tab.seq[si, ri, p]), p))
        own = int(tab.seq[si, ri, c])
        cands = [p for q, p in self._producers.get(tab.stats[si, ri, c].tobytes(), ())
                 if q <= own and tab.nodes[p] != tab.nodes[c]]
        made = self.rel[cands].max() if cands else (self._module_operands(c) or self._list_products(c))
        return bool(np.isfinite(tab.stats[si, ri, c]).any() and made > 0 and self.rel[c] <= factor * made)

    def _list_products(self, c: int) -> float:
        """What the matrix products that computed it explain of an optimizer's list entry no recorded op produced.

        Without parameter-gradient records (level L1) a pipeline stage's optimizer gradient entry (list 1 of
        a fused call, renamed to the other run's by its parameter) is the sum, over the micro-batches, of the
        backward's weight-gradient products: the products of its element count at this step and rank carry their
        noise into it, magnified by the cancellation of the sum (the largest product's norm over the entry's).
        0 for any other input (a parameter or an optimizer state, or where gradient records exist).
        """
        tab = self.tab
        if tab.numel is None or not tab.renamed_lists or not _is_list_entry(str(tab.labels[c]), str(tab.nodes[c]),
                                                                             lists=(1,)):
            return 0.0
        n = tab.numel[self.si, self.ri, c]
        prods = [p for p in tab.products.tolist() if self.both[p] and tab.numel[self.si, self.ri, p] == n]
        if not prods:
            return 0.0
        norm = tab.norm[self.si, self.ri]
        with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
            cond = float(norm[prods].max()) / np.float64(norm[c])
        return float(self.rel[prods].max()) * (cond if np.isfinite(cond) and cond > 1 else 1.0)

    def _module_operands(self, c: int) -> float:
        """What the enclosing module call's own operands explain of an input no recorded op produced.

        Inside a module, an op msprobe does not record (a view such as the chunk of a gated unit) made the input
        from the module's input and the weights of the module and its children: ``y = f(x, W)`` carries their
        noise, magnified by the cancellation of its products (``||x|| ||W|| / ||y||``). 0 when the module call is
        not recorded or its operands agree.
        """
        tab = self.tab
        parent = str(tab.parents[c]) if tab.parents is not None else ""
        head, sep, call = parent.rpartition(".forward.")
        if not sep or not parent.startswith(("Module.", "Cell.")):
            return 0.0
        ins = [i for i in tab.module_inputs.get((f"{head}.{call}", "forward"), ()) if self.both[i]]
        params = [q for q in tab.params_under(head.rpartition(".")[0]) if self.both[q]]
        if not ins or not params:
            return 0.0
        mine = tab.stats[self.si, self.ri, c].tobytes()
        if any(tab.stats[self.si, self.ri, q].tobytes() == mine for q in params):
            return 0.0  # the input is one of the weights itself (Tensor.t of a weight): where a difference starts
        norm = tab.norm[self.si, self.ri]
        made = max(float(self.rel[ins].max()), float(self.rel[params].max()))
        with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
            cond = float(norm[ins].max()) * float(norm[params].max()) / np.float64(norm[c])
        return made * (cond if np.isfinite(cond) and cond > 1 else 1.0)


def _adam_lr(ds: Any) -> tuple[int, float] | None:
    """(first step, largest ``lr``) of the Adam-family optimizer calls the run recorded (their scalar arguments).

    >>> import xarray as xr
    >>> _adam_lr(xr.Dataset(attrs={"scalar_args": '{"Torch._fused_adamw_": {"lr": {"1": [0.001], "2": [0.002]}}}'}))
    (1, 0.002)
    """
    import json

    try:
        table = json.loads(ds.attrs.get("scalar_args") or "{}")
    except (TypeError, ValueError):
        return None
    steps: list[int] = []
    lrs: list[float] = []
    for api, args in table.items() if isinstance(table, dict) else ():
        if "adam" not in str(api).lower() or not isinstance(args, dict) or not isinstance(args.get("lr"), dict):
            continue
        for step, values in args["lr"].items():
            vals = [float(v) for v in (values if isinstance(values, list) else [values])
                    if isinstance(v, (int, float)) and not isinstance(v, bool)]
            if vals and str(step).lstrip("-").isdigit():
                steps.append(int(step))
                lrs.append(max(vals))
    return (min(steps), max(lrs)) if steps else None


def carried_differences(j: Any, factor: float = CARRY) -> np.ndarray:
    """(step, rank, tensor) mask of the differences of the judged pair *j* that their inputs explain.

    *j* is a :class:`~precnb.analysis.divergence.judged.Judged` pair (its ``diff``, its comparison's ``rel``,
    the baseline and target in the target's names, execution order ``seq``).
    """
    diff = np.asarray(j.diff.values, bool)
    if j.cmp.replicas_differ is not None:  # copies that disagree: a difference whatever the first copy's values
        diff = diff & ~np.asarray(j.cmp.replicas_differ.values, bool)
    # only value differences beyond tolerance are weighed (a dtype or checksum difference is never carried)
    diff = diff & (np.asarray(j.cmp.rel.values, np.float64) > np.asarray(j.cmp.rtol.values, np.float64)[None, None])
    out = np.zeros(diff.shape, bool)
    if not diff.any():
        return out
    tab = _Tables(j)
    for si, ri in sorted({(int(a), int(r)) for a, r, _ in np.argwhere(diff)}):
        here = tab.at(si, ri)
        for c in np.flatnonzero(diff[si, ri]).tolist():
            out[si, ri, c] = here.carried(c, factor)
    return out


GRAD_CARRY = 16.0
_PRODUCTS = frozenset({"matmul", "mm", "bmm", "baddbmm", "addmm", "addbmm", "linear", "einsum", "dot", "matrix_power"})


def _is_product(node: str) -> bool:
    """A matrix product call (``Torch.matmul.16.forward``, ``Functional.linear.0.forward``).

    >>> _is_product("Torch.matmul.16.forward"), _is_product("Tensor.__add__.3.forward")
    (True, False)
    """
    parts = node.split(".")
    return len(parts) > 2 and parts[1] in _PRODUCTS


def _product_noise(rel: np.ndarray, norm: np.ndarray, fwd: list[int], bwd: list[int], c: int) -> float:
    """The relative difference a gradient ``G = g^T x`` inherits from its operands' (0 when they agree).

    ``(rel x + rel g) * ||x|| ||g|| / ||G||``: a sum over tokens that cancels (``||G||`` much smaller than
    ``||x|| ||g||``) magnifies its operands' relative noise by that ratio.
    """
    rx, rg = float(rel[fwd].max()), float(rel[bwd].max())
    if rx + rg <= 0:
        return 0.0
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        cond = float(norm[fwd].max()) * float(norm[bwd].max()) / np.float64(norm[c])
    return (rx + rg) * (cond if np.isfinite(cond) and cond > 1 else 1.0)


def created_rule(j: Any, si: int, ri: int, col: int, factor: float = CARRY) -> str | None:
    """Which rule makes the origin entry an origin: what its inputs explain, in words (None for other roles)."""
    roles, nodes = j.b["role"].values, j.b["node"].values
    rel = np.asarray(j.cmp.rel.values, np.float64)
    rd = j.cmp.replicas_differ
    if rd is not None and bool(rd.values[si, ri, col]):
        return "replica check: the copies of a tensor that must be replicated differ across the group"
    if roles[col] != "output":
        return None
    both = np.asarray(j.cmp.both.values, bool)
    ins = [i for i in np.flatnonzero((roles == "input") & (nodes == nodes[col])).tolist() if both[si, ri, i]]
    if not ins:
        return f"relative difference {rel[si, ri, col]:.3g} beyond tolerance (no recorded input)"
    worst = float(rel[si, ri, ins].max())
    return (f"error created here: output differs by {rel[si, ri, col]:.3g} (relative), its inputs by at most "
            f"{worst:.3g}: more than {factor:g}x what the inputs explain")
