"""Ground truth of a PyTorch ↔ MindSpore port, read from the two msprobe dumps (torch-free).

Module pairs come from the port's renaming rules (:func:`ms_module_path`) and are checked
against the module records of both dumps (every module of each side paired exactly once, with
the expected class pair); API pairs are the non-glue API children of each module pair, matched
in dump order through :data:`API_NAME_MAP` and checked to agree in output value. Nothing here
imports precnb.io: the ground truth must not come from the code it checks.
"""

from __future__ import annotations

import math
import re
from typing import Any

from . import _dumps as D  # noqa: N812

# PyTorch module path segment renames of the port (MindFormers-style names)
SEGMENT_MAP = {"embed": "tok_embeddings", "blocks": "layers", "attn_norm": "attention_norm",
               "attn": "attention", "q_proj": "wq", "k_proj": "wk", "v_proj": "wv", "o_proj": "wo",
               "mlp_norm": "ffn_norm", "mlp": "feed_forward", "up_proj": "w1", "down_proj": "w2"}
CLASS_MAP = {"Embedding": "Embedding", "Block": "DecoderLayer", "RMSNorm": "RMSNorm",
             "Attention": "Attention", "Linear": "Dense", "MLP": "FeedForward"}
# API names (prefix.name) as they appear in the dumps: PyTorch -> MindSpore
API_NAME_MAP = {"Functional.embedding": "Primitive.gather.Gather", "Torch.rsqrt": "Functional.rsqrt",
                "Functional.linear": "Primitive.matmul.MatMul", "Torch.matmul": "Functional.matmul",
                "Tensor.masked_fill": "Functional.masked_fill"}
MS_GLUE = re.compile(r"^(Primitive\.[A-Za-z_]+\.(Shape|Reshape)|Functional\.shape|Tensor\.(reshape|transpose))\.")
PT_GLUE = re.compile(r"^Tensor\.(view|reshape|transpose|contiguous)\.")
NOISE = 1e-4  # scale-aware agreement of fp32 statistics across the two frameworks
_MODULE = re.compile(r"^(Module|Cell)\.(.+)\.([A-Za-z_][A-Za-z0-9_]*)\.(forward|backward)\.(\d+)$")


def ms_module_path(pt_path: str) -> str:
    """The MindSpore cell path of a PyTorch module path (``blocks.1.mlp_norm`` -> ``layers.1.ffn_norm``)."""
    return ".".join(SEGMENT_MAP.get(s, s) for s in pt_path.split("."))


def module_nodes(data: dict[str, Any], direction: str = "forward") -> dict[str, tuple[str, str]]:
    """Module path -> (node, class) of the first-call module records of one direction, in dump order."""
    out: dict[str, tuple[str, str]] = {}
    for node in data:
        m = _MODULE.match(node)
        if m and m.group(4) == direction and m.group(5) == "0":
            out.setdefault(m.group(2), (node, m.group(3)))
    return out


def api_name(node: str) -> str:
    """``Functional.linear.3.forward`` -> ``Functional.linear``; ``Primitive.matmul.MatMul.0.forward`` too."""
    parts = node.split(".")
    while parts and parts[-1] in ("forward", "backward"):
        parts.pop()
    if parts and parts[-1].isdigit():
        parts.pop()
    return ".".join(parts)


def forward_apis_by_parent(data: dict[str, Any], construct: dict[str, Any]) -> dict[str | None, list[str]]:
    """Forward API nodes of dump.json grouped by their parent module node (None: top level)."""
    out: dict[str | None, list[str]] = {}
    for node in data:
        if node.startswith(("Module.", "Cell.")) or not node.endswith(".forward"):
            continue
        out.setdefault(D.parent_of(construct, node), []).append(node)
    return out


def leaf(record: dict, path: str) -> dict | None:
    """One leaf of a node record (``output.0``, ``input_args.1``), or None."""
    return D.node_leaves(record).get(path)


def scale_aware_err(a: dict, b: dict) -> float:
    """max(|ΔMax|, |ΔMin|, |ΔMean|) / max(|Max|, |Min|) and |ΔNorm| / |Norm| of two tensor leaves (or scalar values)."""
    if "value" in a or "value" in b:
        va, vb = a.get("value"), b.get("value")
        if not isinstance(va, (int, float)) or not isinstance(vb, (int, float)):
            return 0.0 if va == vb else math.inf
        return abs(va - vb) / max(abs(va), abs(vb), 1e-30)
    vals = [(a.get(k), b.get(k)) for k in D.STAT_KEYS]
    if any(not isinstance(x, (int, float)) or not isinstance(y, (int, float)) for x, y in vals):
        return 0.0 if all(x == y for x, y in vals) else math.inf
    fv = [(float(x), float(y)) for x, y in vals]  # type: ignore[arg-type]
    if any(not (math.isfinite(x) and math.isfinite(y)) for x, y in fv):
        return 0.0 if all(x == y or (math.isnan(x) and math.isnan(y)) for x, y in fv) else math.inf
    scale = max(abs(a["Max"]), abs(a["Min"]), abs(b["Max"]), abs(b["Min"]), 1e-30)
    err = max(abs(a[k] - b[k]) / scale for k in ("Max", "Min", "Mean"))
    return max(err, abs(a["Norm"] - b["Norm"]) / max(abs(a["Norm"]), abs(b["Norm"]), 1e-30))


def rel_errs(pt_leaf: dict, ms_leaf: dict) -> dict[str, float]:
    """Plain relative errors per statistic and the scale-aware error (as in the shared S13 sample)."""
    out = {f"rel_err_{k}": abs(ms_leaf[k] - pt_leaf[k]) / abs(pt_leaf[k]) if pt_leaf[k] else
           abs(ms_leaf[k] - pt_leaf[k]) for k in D.STAT_KEYS}
    out["scale_aware_err"] = scale_aware_err(pt_leaf, ms_leaf)
    return out


def pair_modules(pt: dict[str, Any], ms: dict[str, Any]) -> list[dict[str, Any]]:
    """Every module pair (forward and backward node names), checked one-to-one; ms forward order."""
    pf, mf = module_nodes(pt), module_nodes(ms)
    pb, mb = module_nodes(pt, "backward"), module_nodes(ms, "backward")
    want = {ms_module_path(p): p for p in pf}
    if set(want) != set(mf):
        raise ValueError(f"module trees do not pair: pt-only {sorted(set(want) - set(mf))}, "
                         f"ms-only {sorted(set(mf) - set(want))}")
    pairs = []
    for ms_path, (ms_node, ms_cls) in mf.items():
        pt_path = want[ms_path]
        pt_node, pt_cls = pf[pt_path]
        if CLASS_MAP.get(pt_cls) != ms_cls:
            raise ValueError(f"{pt_node} ({pt_cls}) pairs with {ms_node} ({ms_cls})")
        pairs.append({"pt_module": pt_path, "ms_cell": ms_path, "pt_class": pt_cls, "ms_class": ms_cls,
                      "pt_node": pt_node, "ms_node": ms_node,
                      "pt_backward_node": pb.get(pt_path, (None,))[0],
                      "ms_backward_node": mb.get(ms_path, (None,))[0]})
    return pairs


def pair_apis(pt: dict, pt_con: dict, ms: dict, ms_con: dict,
              modules: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Forward API pairs per module pair (and at top level), plus what stays unpaired."""
    pa, ma = forward_apis_by_parent(pt, pt_con), forward_apis_by_parent(ms, ms_con)
    groups = [(m["pt_module"], m["ms_cell"], m["pt_node"], m["ms_node"]) for m in modules]
    groups.append(("", "", None, None))
    pairs: list[dict[str, Any]] = []
    unpaired: dict[str, Any] = {}
    for pt_mod, ms_mod, pt_node, ms_node in groups:
        p_all, m_all = pa.get(pt_node, []), ma.get(ms_node, [])
        p_real = [n for n in p_all if not PT_GLUE.match(n)]
        m_real = [n for n in m_all if not MS_GLUE.match(n)]
        if pt_node is None:  # top level: the loss only (the PyTorch optimizer runs inside the dump)
            p_real = [n for n in p_real if api_name(n) != "Torch._fused_adamw_"]
        expect = [API_NAME_MAP.get(api_name(n), api_name(n)) for n in p_real]
        if expect != [api_name(n) for n in m_real]:
            raise ValueError(f"APIs of {pt_mod or 'top level'} do not pair: {p_real} vs {m_real}")
        for a, b in zip(p_real, m_real, strict=True):
            pairs.append({"pt_api": a, "ms_api": b, "module": pt_mod, "ms_module": ms_mod})
        glue_pt = [n for n in p_all if n not in p_real]
        glue_ms = [n for n in m_all if n not in m_real]
        if glue_pt or glue_ms:
            unpaired[pt_mod or "<top level>"] = {"pt": glue_pt, "ms": glue_ms}
    return pairs, unpaired


def module_closeness(pt: dict, ms: dict, modules: list[dict[str, Any]]) -> dict[str, Any]:
    """Per module pair: forward output[0] errors and both sides' statistics."""
    out = {}
    for m in modules:
        a, b = leaf(pt[m["pt_node"]], "output.0"), leaf(ms[m["ms_node"]], "output.0")
        if a is None or b is None:
            raise ValueError(f"no output.0 in {m['pt_node']} / {m['ms_node']}")
        out[m["pt_module"]] = {"ms_cell": m["ms_cell"], **rel_errs(a, b),
                               "pt_output": {"shape": a["shape"], **{k: a[k] for k in D.STAT_KEYS}},
                               "ms_output": {"shape": b["shape"], **{k: b[k] for k in D.STAT_KEYS}}}
    return out


def io_errors(pt_rec: dict, ms_rec: dict) -> tuple[float, float, list[str]]:
    """(max input error, output.0 error, differing input leaves) of one paired node."""
    lp, lm = D.node_leaves(pt_rec), D.node_leaves(ms_rec)
    ins = [p for p in lm if p.startswith(("input_args", "input_kwargs")) and p in lp]
    errs = {p: scale_aware_err(lp[p], lm[p]) for p in ins}
    out = scale_aware_err(lp["output.0"], lm["output.0"])
    return max(errs.values(), default=0.0), out, [p for p, e in errs.items() if e > NOISE]


def culprit(pt: dict, ms: dict, modules: list[dict[str, Any]], apis: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The first module (completion order) whose inputs agree and output differs, and its first differing API."""
    for m in modules:
        e_in, e_out, _ = io_errors(pt[m["pt_node"]], ms[m["ms_node"]])
        if e_in <= NOISE < e_out:
            inside = [a for a in apis if a["ms_module"] == m["ms_cell"]]
            first = None
            for a in inside:
                a_in, a_out, bad_in = io_errors(pt[a["pt_api"]], ms[a["ms_api"]])
                if a_out > NOISE:
                    first = {**a, "input_err": a_in, "output_err": a_out, "differing_inputs": {
                        p: {"pt": leaf(pt[a["pt_api"]], p), "ms": leaf(ms[a["ms_api"]], p)} for p in bad_in}}
                    break
            return {**m, "input_err": e_in, "output_err": e_out, "first_differing_api": first}
    return None
