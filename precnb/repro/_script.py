"""The body of every ``precnb repro`` script (written out by :func:`precnb.repro.repro_script`).

This module is the script: :func:`precnb.repro.repro_script` copies the text from ``# <body>``
on, with the block between ``# <record>`` and ``# </record>`` replaced by the dumped record
(data only: names, file names, literals, and one ``call(OP, ...)`` line). The op is never named
in code: :func:`call` looks ``OP`` up on the allow-list the script carries (:data:`ALLOWED`,
precnb's list of the operators msprobe hooks), resolves it under torch and checks that what it
found is an operator (:func:`is_operator`) before calling it — so neither a hostile dump nor an
edit of ``OP`` makes the script run anything else. It needs torch and numpy, not precnb; it is
importable without them (the checks are testable anywhere).

Examples
--------
>>> allowed("Functional.gelu"), allowed("Torch.builtins.exec")
(True, False)
>>> is_operator(len), is_operator(print)
(False, False)
"""

# <body>
import argparse
import builtins
import contextlib
import json
import sys
import types
from pathlib import Path

try:
    import numpy as np
    import torch
except ImportError as _exc:  # main() says so (exit 2): the script can still be checked without them
    np = torch = None
    _MISSING = str(_exc)

EXIT_REPRODUCED, EXIT_NOT_REPRODUCED, EXIT_COULD_NOT_RUN = 0, 1, 2
# where each prefix of a dumped API name lives (the namespaces msprobe hooks)
OWNERS = {"Functional": ("nn", "functional"), "Torch": (), "Tensor": ("Tensor",), "VF": ("_VF",),
          "Aten": ("ops", "aten")}
RTOL = {"bfloat16": 2.0 ** -8, "float16": 2.0 ** -11, "float32": 2.0 ** -14, "float64": 2.0 ** -40}
ARGS = DEVICE = None


class CannotRun(Exception):  # noqa: N818 - the script's own "could not run" (exit 2)
    """The op could not be rerun (refused, unreadable file, missing torch): exit 2."""


def allowed(op):
    """Whether *op* (``Prefix.name``, e.g. ``Functional.gelu``) is on this script's allow-list."""
    return isinstance(op, str) and op in ALLOWED


def owner_module(obj):
    """The module an object says it belongs to (a method descriptor: its class's module)."""
    mod = getattr(obj, "__module__", None)
    if not isinstance(mod, str):
        mod = getattr(getattr(obj, "__objclass__", None), "__module__", None)
    return mod if isinstance(mod, str) else ""


def is_operator(obj):
    """Whether *obj* is a genuine torch operator.

    That is a builtin or Python function, a method descriptor of ``torch.Tensor`` or an aten
    op packet, belonging to torch: never a module, a class, a builtin (``exec``, ``eval``,
    ``open``, ...) or anything of ``builtins``/``os``/``sys``/``subprocess``/``importlib``.
    """
    if isinstance(obj, (types.ModuleType, type)) or not callable(obj):  # tuples: the script runs on Python 3.8+
        return False
    if any(obj is v for v in vars(builtins).values()):
        return False
    kinds = (types.BuiltinFunctionType, types.FunctionType, types.MethodDescriptorType, types.WrapperDescriptorType)
    packet = type(obj).__name__ in ("OpOverloadPacket", "OpOverload") and type(obj).__module__ == "torch._ops"
    # torch's own, so never builtins, os, sys, subprocess, importlib, ... (whatever torch re-exports)
    return (isinstance(obj, kinds) or packet) and owner_module(obj).split(".")[0] == "torch"


def resolve(op):
    """The torch operator *op* names, after the allow-list and operator checks (else :class:`CannotRun`)."""
    if not allowed(op):
        raise CannotRun(f"{op!r} is not an operator on this script's allow-list (the torch operators msprobe "
                        "hooks): refused")
    prefix, _, name = op.partition(".")
    if prefix not in OWNERS:
        raise CannotRun(f"{op!r}: {prefix!r} is not a torch namespace this script calls: refused")
    obj = torch
    for part in OWNERS[prefix]:
        obj = getattr(obj, part)
    parts = name.split(".")
    for i, part in enumerate(parts):
        if not part.isidentifier():
            raise CannotRun(f"{op!r}: {part!r} is not a name")
        obj = getattr(obj, part, None)
        if obj is None:
            raise CannotRun(f"{op}: this torch ({torch.__version__}) has no such operator")
        inner = i < len(parts) - 1
        if inner and not (isinstance(obj, types.ModuleType) and obj.__name__.split(".")[0] == "torch"):
            raise CannotRun(f"{op!r}: {part!r} is not a torch namespace: refused")
    if not is_operator(obj):
        raise CannotRun(f"{op} resolves to {type(obj).__name__} {owner_module(obj)!r}, not a torch operator: refused")
    return obj


def call(op, /, *args, **kwargs):
    """Call the operator *op* (checked by :func:`resolve` first) with the dumped arguments."""
    return resolve(op)(*args, **kwargs)


def load(name, folder=None):
    """One dumped tensor file of the data folder (or *folder*), read safely (no pickle code runs)."""
    if not isinstance(name, str) or Path(name).name != name or name in ("", ".", ".."):
        raise CannotRun(f"{name!r} is not a file name inside the data folder: refused")
    path = (ARGS.data if folder is None else Path(folder)) / name
    if not path.is_file():
        raise CannotRun(f"{path}: no such tensor file")
    if path.suffix == ".npy":
        return torch.from_numpy(np.load(path, allow_pickle=False))
    return torch.load(path, weights_only=True, map_location="cpu")


def T(name):  # noqa: N802 - an input tensor, on the chosen device
    """The dumped input tensor file *name*, on the chosen device."""
    return load(name).to(DEVICE)


def pick(result, index):
    """The output at *index* (``"0"``, ``"1.0"``, ``"key"``) of the op's result."""
    if index == "0" and isinstance(result, torch.Tensor):
        return result
    for part in index.split("."):
        result = result[int(part)] if isinstance(result, (list, tuple)) else result[part]
    return result


def as_numpy(t):
    """A tensor as numpy (bfloat16 / float8 widened to float32)."""
    t = t.detach().cpu()
    if t.dtype == torch.bfloat16 or "float8" in str(t.dtype):
        t = t.float()
    return t.numpy()


def metrics(out, ref):
    """The metrics of msprobe compare (float64), plus the relative L2 error."""
    n, b = np.squeeze(as_numpy(out)), np.squeeze(as_numpy(ref))
    if n.shape != b.shape:
        return {"status": f"shape {list(n.shape)} vs dumped {list(b.shape)}"}
    n64, b64 = n.astype(np.float64).reshape(-1), b.astype(np.float64).reshape(-1)
    bad_n, bad_b = ~np.isfinite(n64), ~np.isfinite(b64)
    if not (np.array_equal(bad_n, bad_b) and np.array_equal(n64[bad_n], b64[bad_b], equal_nan=True)):
        return {"status": "NaN/inf at different positions or signs"}
    n64, b64 = np.where(bad_n, 0.0, n64), np.where(bad_b, 0.0, b64)
    d = n64 - b64
    ref_norm = float(np.linalg.norm(b64))
    res = {"status": "ok", "bitwise_equal": bool(n.dtype == b.dtype and n.tobytes() == b.tobytes()),
           "max_abs_err": float(np.max(np.abs(d))) if d.size else 0.0,
           "rel_l2_err": float(np.linalg.norm(d)) / ref_norm if ref_norm else (0.0 if not d.any() else float("inf"))}
    bb = np.where(b64 == 0, np.finfo(np.float64).eps, b64)
    rel = np.abs((np.where(b64 == 0, n64 + np.finfo(np.float64).eps, n64) - bb) / bb)
    res["max_rel_err"] = float(np.max(rel)) if rel.size else 0.0
    if n64.size > 1:
        na, nb = np.linalg.norm(n64), np.linalg.norm(b64)
        res["cosine"] = 1.0 if na == nb == 0 else (float(np.dot(n64, b64) / (na * nb)) if na and nb else float("nan"))
        res["one_thousandth_err_ratio"] = float(np.mean(rel < 0.001))
    return res


def same_bits(a, b):
    """Whether two tensors are bit for bit the same (dtype, shape and bytes)."""
    a, b = a.detach().cpu().contiguous(), b.detach().cpu().contiguous()
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    return bool(torch.equal(a.view(torch.uint8) if a.numel() else a, b.view(torch.uint8) if b.numel() else b))


def replica_folders(pairs):
    """``{rank: data folder}`` of the replicas, ``--replica-data RANK=DIR`` applied."""
    out = {int(q): Path(rep["data"]) for q, rep in REPLICAS.items()}
    for item in pairs or ():
        rank, sep, folder = item.partition("=")
        if not sep or not rank.strip().isdigit() or int(rank) not in out:
            raise CannotRun(f"--replica-data {item!r}: give RANK=DIR for a rank of REPLICAS {sorted(out)}")
        out[int(rank)] = Path(folder)
    return out


def _agreeing(scores, key):
    return [r for r, per_output in scores.items() if all(m.get(key) for m in per_output)]


def compare_replicas(result, rtol_of):
    """Whose dumped output the recomputation agrees with, and the verdict (a dict; printed by :func:`_main`)."""
    folders = replica_folders(ARGS.replica_data)
    inputs_same = {}
    for q, rep in REPLICAS.items():
        if len(rep["inputs"]) != len(INPUTS):
            inputs_same[q] = False
            continue
        inputs_same[q] = all(same_bits(load(a), load(b, folders[int(q)]))
                             for a, b in zip(INPUTS, rep["inputs"], strict=True))
    sides = {RANK: (ARGS.data, OUTPUTS), **{int(q): (folders[int(q)], rep["outputs"]) for q, rep in REPLICAS.items()}}
    scores = {}
    for r, (folder, outs) in sides.items():
        scores[r] = []
        for index, name, dtype in outs:
            got, ref = pick(result, index), load(name, folder)
            m = metrics(got, ref)
            m["within_rtol"] = m["status"] == "ok" and m["rel_l2_err"] <= rtol_of(dtype)
            m["bitwise_equal"] = bool(m.get("bitwise_equal")) and same_bits(got, ref)
            scores[r].append(m)
    bitwise, close = _agreeing(scores, "bitwise_equal"), _agreeing(scores, "within_rtol")
    agree, how = (bitwise, "bit for bit") if bitwise else (close, "within rtol")
    wrong = [r for r in sides if r not in agree]
    ranks = ", ".join(map(str, agree))
    where = f"{NODE} recomputed on {DEVICE} from rank {RANK}'s dumped inputs"
    if not all(inputs_same.values()):
        differ = [q for q, v in inputs_same.items() if not v]
        decided, wrong = False, []
        text = (f"the dumped inputs of rank(s) {', '.join(map(str, differ))} differ from rank {RANK}'s: the op was "
                "not given the same inputs there (not a replica of this call, or a departure inherited from an earlier "
                "op); this recomputation cannot decide")
    elif agree and wrong:
        decided = True
        text = (f"{where} agrees {how} with the dumped output of rank(s) {ranks}, not with rank(s) "
                f"{', '.join(map(str, wrong))}: on identical inputs, rank(s) {', '.join(map(str, wrong))} computed it "
                "wrongly (a device fault there, or a non-deterministic kernel)")
    elif agree and bitwise:
        decided = False
        text = (f"{where} agrees bit for bit with every replica's dumped output: the replicas agree, no departure "
                "here")
    elif agree:
        decided = False
        text = (f"{where} agrees within rtol with every replica's dumped output: their difference is below what "
                "this recomputation resolves (rerun on the replicas' own device type, or lower --rtol)")
    else:
        decided = False
        text = (f"{where} agrees with no replica's dumped output: this device computes the op differently from "
                "all of them (another kernel, or a non-deterministic one): run it on the replicas' device type")
    return {"node": NODE, "device": str(DEVICE), "torch": torch.__version__, "rank": RANK,
            "replicas": sorted(int(q) for q in REPLICAS),
            "inputs_identical": {str(q): v for q, v in inputs_same.items()},
            "sides": {str(r): ms for r, ms in scores.items()},
            "agrees_with": agree, "wrong_ranks": wrong, "decided": decided,
            "this_rank_is_wrong": decided and RANK in wrong,
            "verdict": text}


def _rtol_of(dtype):
    return ARGS.rtol if ARGS.rtol is not None else RTOL.get(dtype.replace("torch.", ""), 0.0)


def _main(argv):
    global ARGS, DEVICE
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0] if __doc__ else None)
    p.add_argument("--data", type=Path, default=DATA, help="folder of the dumped tensor files (default: %(default)s)")
    p.add_argument("--device", default="cpu", help="device to run the op on (default: cpu)")
    p.add_argument("--rtol", type=float, help="relative L2 error allowed (default: by dtype, fp32 2^-14)")
    p.add_argument("--autocast", default=AUTOCAST, help="autocast dtype, or 'none' (default: %(default)s)")
    p.add_argument("--replica-data", action="append", metavar="RANK=DIR",
                   help="the folder of a replica's dumped tensor files (default: where REPLICAS says)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the text")
    ARGS = p.parse_args(argv)
    if not allowed(OP):  # before torch: an edited OP is refused wherever the script runs
        resolve(OP)
    if torch is None:
        raise CannotRun(f"torch and numpy are needed ({_MISSING})")
    DEVICE = torch.device(ARGS.device)
    auto = None if str(ARGS.autocast).lower() == "none" else ARGS.autocast
    if auto and auto not in RTOL:
        raise CannotRun(f"--autocast {auto!r}: not a floating dtype ({', '.join(RTOL)})")
    region = torch.autocast(DEVICE.type, dtype=getattr(torch, auto)) if auto else contextlib.nullcontext()
    try:
        with torch.no_grad(), region:
            result = run_op()
    except CannotRun:
        raise
    except Exception as exc:
        raise CannotRun(f"the op failed: {type(exc).__name__}: {exc}") from None
    if REPLICAS:
        try:
            found = compare_replicas(result, _rtol_of)
        except CannotRun:
            raise
        except Exception as exc:
            raise CannotRun(f"cannot compare with the replicas: {type(exc).__name__}: {exc}") from None
        if ARGS.json:
            print(json.dumps(found, indent=1, default=str))
        else:
            print(f"{NODE} on {DEVICE}, torch {torch.__version__}" + (f", under autocast {auto}" if auto else ""))
            for q, same in found["inputs_identical"].items():
                print(f"  inputs of rank {q} vs rank {RANK}: {'bit-identical' if same else 'DIFFER'}")
            for r, ms in found["sides"].items():
                for (index, _, _), m in zip(OUTPUTS, ms, strict=True):
                    shown = "  ".join(f"{k}={v:.6g}" if isinstance(v, float) else f"{k}={v}" for k, v in m.items())
                    print(f"  output {index} vs rank {r}'s dump: {shown}")
            print("VERDICT: " + found["verdict"])
        return EXIT_REPRODUCED if found["decided"] else EXIT_NOT_REPRODUCED
    ok = True
    report = []
    lines = [f"{NODE} on {DEVICE}, torch {torch.__version__}" + (f", under autocast {auto}" if auto else "")]
    for index, name, dtype in OUTPUTS:
        try:
            ref = load(name)
            got = pick(result, index)
            m = metrics(got, ref)
        except CannotRun:
            raise
        except Exception as exc:
            raise CannotRun(f"output {index} ({name}): cannot compare: {type(exc).__name__}: {exc}") from None
        rtol = _rtol_of(dtype)
        good = m["status"] == "ok" and m["rel_l2_err"] <= rtol
        report.append({"index": index, "file": name, **m, "reproduced": good})
        ok = ok and good
        shown = "  ".join(f"{k}={v:.6g}" if isinstance(v, float) else f"{k}={v}" for k, v in m.items())
        lines.append(f"  output {index} ({name}): {shown}  -> {'reproduced' if good else 'NOT reproduced'}"
                     f" (rel_l2_err <= {rtol:.3g})")
    lines.append("REPRODUCED" if ok else "NOT REPRODUCED")
    if ARGS.json:
        print(json.dumps({"node": NODE, "device": str(DEVICE), "torch": torch.__version__, "rank": RANK,
                          "outputs": report, "reproduced": ok}, indent=1, default=str))
    else:
        print("\n".join(lines))
    return EXIT_REPRODUCED if ok else EXIT_NOT_REPRODUCED


def main(argv=None):
    """Rerun the op; exit status 0 reproduced, 1 NOT reproduced, 2 could not run (refused, unreadable, failed)."""
    try:
        return _main(argv)
    except CannotRun as exc:
        print(f"{NODE}: could not run: {exc}", file=sys.stderr)
    except Exception as exc:  # the script's own failure is never "does not reproduce"
        print(f"{NODE}: could not run: {type(exc).__name__}: {exc}", file=sys.stderr)
    return EXIT_COULD_NOT_RUN


# <record>
NODE = "Functional.gelu.0.forward"
OP = "Functional.gelu"
SOURCE = "dump.json"
DATA = Path("dump_tensor_data")
INPUTS = ["Functional.gelu.0.forward.input.0.pt"]
OUTPUTS = [("0", "Functional.gelu.0.forward.output.0.pt", "torch.float32")]
AUTOCAST = None
RANK = 0
REPLICAS = {}
ALLOWED = frozenset({"Functional.gelu"})


def run_op():
    """The dumped call."""
    return call(OP, T("Functional.gelu.0.forward.input.0.pt"))
# </record>


if __name__ == "__main__":
    sys.exit(main())
