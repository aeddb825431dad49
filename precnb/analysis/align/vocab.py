"""What names mean across codebases and frameworks: op families, module-name synonyms, class families, glue.

Everything here is a hint that the value and structure evidence can confirm or overrule: the
aligner never pairs on a name alone when the values or shapes disagree.

Examples
--------
>>> op_similarity("Functional.linear", "Primitive.matmul.MatMul")
0.8
>>> op_similarity("Tensor.__add__", "Torch.add")
1.0
>>> name_similarity("q_proj", "wq") >= 0.7, name_similarity("attn", "attention") >= 0.7
(True, True)
>>> is_glue_op("Primitive.reshape.Reshape"), is_glue_op("Tensor.div_")
(True, False)
"""

from __future__ import annotations

import difflib
import re
from functools import lru_cache

from precnb.naming import op_key

__all__ = ["class_similarity", "is_glue_op", "name_similarity", "op_similarity"]

# framework-neutral op keys (see precnb.naming.op_key) that compute the same thing
_OP_FAMILIES: tuple[frozenset[str], ...] = tuple(frozenset(f) for f in (
    {"linear", "matmul", "dense", "mm", "bmm", "batchmatmul", "addmm", "baddbmm", "einsum", "gemm", "matmulv2"},
    {"embedding", "gather", "embeddinglookup", "indexselect", "take"},
    {"rmsnorm", "fusedrmsnorm", "rmsnormgrad"},
    {"layernorm", "fusedlayernorm", "layernormv3"},
    {"softmax", "softmaxv2"},
    {"logsoftmax"},
    {"flashattentionscore", "fusionattention", "scaleddotproductattention", "sdpa", "flashattention",
     "promptflashattention", "incrementalflashattention"},
    {"or", "logicalor", "bitwiseor"},
    {"and", "logicaland", "bitwiseand"},
    {"not", "logicalnot", "bitwisenot", "invert"},
    {"mul", "multiply"},
    {"truediv", "div", "divide", "realdiv"},
    {"sub", "subtract"},
    {"add", "addn", "tensoradd"},
    {"pow", "square"},
    {"gelu", "fastgelu", "geluv2"},
    {"silu", "swish"},
    {"swiglu", "swigluv2"},
    {"crossentropy", "softmaxcrossentropywithlogits", "sparsesoftmaxcrossentropywithlogits", "nllloss"},
    {"allreduce", "allreducebase"},
    {"allgather", "allgatherbase", "allgatherintotensor"},
    {"reducescatter", "reducescatterbase", "reducescattertensor"},
    {"masked_fill", "maskedfill"},
    {"rotarymul", "rotaryembedding", "applyrotaryposemb"},
    {"dropout", "dropoutdomask", "dropoutgenmask"},
    {"sum", "reducesum"},
    {"mean", "reducemean"},
    {"max", "reducemax", "argmaxwithvalue"},
    {"min", "reducemin", "argminwithvalue"},
    {"exp"}, {"log"}, {"sqrt"}, {"rsqrt"}, {"tanh"}, {"sigmoid"}, {"relu"}, {"cos"}, {"sin"},
))
_OP_FAMILY_OF: dict[str, int] = {k: i for i, fam in enumerate(_OP_FAMILIES) for k in fam}

# ops that move or re-describe data without computing on it (a framework's glue)
_GLUE_KEYS = frozenset({
    "reshape", "view", "viewas", "transpose", "permute", "contiguous", "shape", "getshp", "shapeop", "size", "dim",
    "numel", "expand", "expandas", "expanddims", "broadcastto", "squeeze", "unsqueeze", "flatten", "reshapeflat",
    "unflatten", "cast", "to", "type", "typeas", "float", "half", "bfloat16", "double", "int", "long", "bool",
    "clone", "detach", "identity", "depend", "tensormove", "copy", "copy_", "getitem", "split", "chunk", "narrow",
    "select", "slice", "stridedslice", "tuplegetitem", "makeref", "load", "cpu", "cuda", "npu", "item",
    "tolist", "stack", "concat", "cat", "t", "swapaxes", "movedim", "rearrange", "repeatinterleave", "tile",
    "zeroslike", "oneslike", "emptylike", "fulllike", "zeros", "ones", "empty", "full", "arange",
})


def is_glue_op(api: str) -> bool:
    """An op that only moves, re-shapes, casts or creates data (never a divergence by itself)."""
    return op_key(api).rstrip("_") in _GLUE_KEYS


@lru_cache(maxsize=65536)
def op_similarity(a: str, b: str) -> float:
    """1.0 for the same op, 0.8 for ops of one family (linear ≈ MatMul), else 0.

    Parameters
    ----------
    a, b : str
        API names as msprobe writes them (``Functional.linear``, ``Primitive.matmul.MatMul``).
    """
    ka, kb = op_key(a), op_key(b)
    if ka == kb:
        return 1.0
    if ka.rstrip("_") == kb.rstrip("_"):
        return 0.9  # the in-place and out-of-place forms
    fa, fb = _OP_FAMILY_OF.get(ka.rstrip("_")), _OP_FAMILY_OF.get(kb.rstrip("_"))
    if fa is not None and fa == fb:
        return 0.8
    return 0.0


# module attribute names that mean the same thing in different codebases
_NAME_FAMILIES: tuple[frozenset[str], ...] = tuple(frozenset(f) for f in (
    {"embed", "embedding", "embeddings", "tokembeddings", "tokembedding", "wte", "embedtokens", "wordembeddings",
     "wordembedding", "tokenembedding", "tokenembeddings", "tokemb"},
    {"attn", "attention", "selfattn", "selfattention", "mha", "multiheadattention", "attnlayer"},
    {"mlp", "feedforward", "ffn", "ff", "mlplayer", "feedforwardnetwork", "dense"},
    {"attnnorm", "attentionnorm", "inputlayernorm", "inputnorm", "ln1", "norm1", "lnattn", "preattnnorm",
     "selfattnlayernorm", "attnln"},
    {"mlpnorm", "ffnnorm", "postattentionlayernorm", "postattentionnorm", "ln2", "norm2", "lnmlp", "premlpnorm",
     "finallayernormmlp", "mlpln"},
    {"normout", "norm", "finalnorm", "lnf", "finallayernorm", "finallayernormlast", "normf", "outnorm"},
    {"lmhead", "output", "outputlayer", "head", "lmheadlayer", "outputprojection"},
    {"blocks", "layers", "h", "layer", "decoderlayers", "encoderlayers", "transformerlayers", "block"},
    {"qproj", "wq", "query", "q", "linearq", "qlinear", "toq"},
    {"kproj", "wk", "key", "k", "lineark", "klinear", "tok"},
    {"vproj", "wv", "value", "v", "linearv", "vlinear", "tov"},
    {"oproj", "wo", "outproj", "out", "o", "dense", "linearproj", "cproj", "proj", "toout", "denseproj"},
    {"upproj", "w1", "fc1", "linearfc1", "cfc", "densehto4h", "wi", "up", "fcin"},
    {"downproj", "w2", "fc2", "linearfc2", "cproj", "dense4htoh", "wo", "down", "fcout"},
    {"gateproj", "w3", "gate", "wg", "wi0"},
    {"qkv", "qkvproj", "linearqkv", "wqkv", "querykeyvalue", "cattn", "inproj"},
    {"rotaryemb", "rotary", "rope", "rotarypositionembedding", "rotaryposemb"},
    {"dropout", "drop", "attndropout", "residdropout"},
))
_NAME_FAMILY_OF: dict[str, list[int]] = {}
for _i, _fam in enumerate(_NAME_FAMILIES):
    for _k in _fam:
        _NAME_FAMILY_OF.setdefault(_k, []).append(_i)


def _norm_name(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower())


@lru_cache(maxsize=65536)
def name_similarity(a: str, b: str) -> float:
    """How alike two module attribute names are: 1 (same), 0.8 (synonyms), else a string similarity below 0.6.

    List indices (``0``, ``1``) are alike only when equal (order decides the rest).
    """
    if a == b:
        return 1.0
    if a.isdigit() or b.isdigit():
        return 0.3 if (a.isdigit() and b.isdigit()) else 0.0
    na, nb = _norm_name(a), _norm_name(b)
    if na == nb:
        return 0.95
    fa, fb = set(_NAME_FAMILY_OF.get(na, ())), set(_NAME_FAMILY_OF.get(nb, ()))
    if fa & fb:
        return 0.8
    if na and nb and (na in nb or nb in na) and min(len(na), len(nb)) >= 3:
        return 0.6
    return 0.55 * difflib.SequenceMatcher(None, na, nb).ratio()


# module classes of the same kind in different codebases / frameworks
_CLASS_FAMILIES: tuple[frozenset[str], ...] = tuple(frozenset(f) for f in (
    {"linear", "dense", "columnparallellinear", "rowparallellinear", "telinear", "telayernormcolumnparallellinear",
     "mindspeedtelayernormcolumnparallellinear", "conv1d", "linearlayer", "paralleldense", "denselayer"},
    {"embedding", "vocabparallelembedding", "embed", "tokenembedding", "parallelembedding"},
    {"modulelist", "celllist", "sequential", "sequentialcell", "parallelmodulelist"},
    {"rmsnorm", "fusedrmsnorm", "llamarmsnorm", "mixedfusedrmsnorm", "t5layernorm", "qwen2rmsnorm"},
    {"layernorm", "fusedlayernorm", "mixedfusedlayernorm", "telayernorm"},
    {"attention", "selfattention", "parallelattention", "llamaattention", "multiheadattention", "mha",
     "causalselfattention", "gptattention", "flashselfattention", "coreattention", "dotproductattention"},
    {"mlp", "feedforward", "parallelmlp", "llamamlp", "ffn", "gptmlp", "densemlp", "swiglumlp"},
    {"block", "decoderlayer", "transformerlayer", "paralleltransformerlayer", "llamadecoderlayer",
     "gpt2block", "transformerblock", "encoderlayer", "layer"},
    {"dropout", "dropoutext"},
))
_CLASS_FAMILY_OF: dict[str, int] = {k: i for i, fam in enumerate(_CLASS_FAMILIES) for k in fam}


@lru_cache(maxsize=65536)
def class_similarity(a: str | None, b: str | None) -> float:
    """How alike two module classes are: 1 (same), 0.8 (one family, e.g. Linear ≈ Dense), else below 0.5.

    Containers that are never called have no class (None); two of them are alike (0.5).
    """
    if a is None or b is None:
        return 0.5 if a is None and b is None else 0.0
    if a == b:
        return 1.0
    na, nb = _norm_name(a), _norm_name(b)
    if na == nb:
        return 0.95
    fa, fb = _CLASS_FAMILY_OF.get(na), _CLASS_FAMILY_OF.get(nb)
    if fa is not None and fa == fb:
        return 0.8
    if na and nb and (na in nb or nb in na) and min(len(na), len(nb)) >= 4:
        return 0.7
    return 0.45 * difflib.SequenceMatcher(None, na, nb).ratio()
