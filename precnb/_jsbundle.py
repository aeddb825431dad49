"""The charts' JavaScript (vega, vega-lite, vega-embed) from vl-convert, built in a child process.

:func:`vl_convert.javascript_bundle` runs an embedded V8, which reserves about 100 GiB of
address space when it starts and aborts the whole process ("Fatal process out of memory:
Oilpan: CagedHeap reservation", exit 133) under any ``ulimit -v`` below that, common on cluster
login nodes. So precnb never starts it in its own process: a child Python builds the bundle
(first raising its soft address-space limit to the hard one, which is all a ``ulimit -S -v``
needs), and if the child cannot, that is one clear :class:`ChartScriptError` while precnb's
process goes on. The bundle is kept for the process and, only where ``$PRECNB_CACHE`` names a
folder, on disk per vl-convert version, Vega-Lite version and snippet: a cache built once
without a limit serves every later report, export and explorer under one (precnb writes nowhere
the user did not ask for; an unwritable cache is ignored).

Examples
--------
>>> describe_limit(8 * 2**30)
'8.0 GiB'
>>> describe_limit(None)
'unlimited'
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

from precnb.errors import PrecnbError

__all__ = ["ChartScriptError", "describe_limit", "javascript_bundle", "vegalite_to_svg", "vl_version"]

#: run by the child: raise the soft address-space limit to the hard one, then do what stdin asks (JSON)
_CHILD = """\
import json
import sys
try:
    import resource
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    if soft != hard:
        resource.setrlimit(resource.RLIMIT_AS, (hard, hard))
except (ImportError, ValueError, OSError):
    pass
import vl_convert as vlc
req = json.loads(sys.stdin.read())
if req["op"] == "svg":
    out = vlc.vegalite_to_svg(req["spec"], vl_version=req["vl_version"])
else:
    out = vlc.javascript_bundle(req["snippet"] or None, vl_version=req["vl_version"])
sys.stdout.buffer.write(out.encode("utf-8"))
"""
_TIMEOUT = 600  # seconds; building takes 1-3 s
_V8_RESERVES = "about 100 GiB"
_BUNDLE = "build the charts' JavaScript"
_END = "\n//precnb-bundle-end\n"  # a cache file ends so (one cut short is rebuilt)


class ChartScriptError(PrecnbError, RuntimeError):
    """The charts' JavaScript could not be built (the message says why and what to do)."""


def describe_limit(value: int | None) -> str:
    """An address-space limit in GiB (``None`` or ``RLIM_INFINITY``: ``"unlimited"``)."""
    if value is None or value < 0:
        return "unlimited"
    return f"{value / 2**30:.1f} GiB"


def _hard_address_limit() -> int | None:
    try:
        import resource
    except ImportError:  # pragma: no cover - not POSIX
        return None
    hard = resource.getrlimit(resource.RLIMIT_AS)[1]
    return None if hard == resource.RLIM_INFINITY else hard


def _cache_file(snippet: str, vl_version: str) -> Path | None:
    base = os.environ.get("PRECNB_CACHE")
    if not base:
        return None
    try:
        vlc = metadata.version("vl-convert-python")
    except metadata.PackageNotFoundError:
        vlc = "x"
    what = hashlib.sha256(snippet.encode("utf-8")).hexdigest()[:16] if snippet else "vega"
    return Path(base) / f"vl-convert-{vlc}-{vl_version}-{what}.js"


def _read_cache(path: Path | None) -> str | None:
    if path is None:
        return None
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, ValueError):
        return None
    return text[: -len(_END)] if text.endswith(_END) else None


def _write_cache(path: Path | None, text: str) -> None:
    if path is None:
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    except OSError:
        pass


def _failure(rc: int, stderr: str, what: str) -> ChartScriptError:
    hard = _hard_address_limit()
    last = next((ln.strip() for ln in reversed(stderr.splitlines()) if ln.strip()), "")
    memory = "out of memory" in stderr.lower() or "cagedheap" in stderr.lower() or rc in (133, -5)
    if memory and hard is not None:
        way = (" Build it once where the limit is higher with PRECNB_CACHE=<folder> set and keep PRECNB_CACHE set "
               "here: precnb reuses the bundle from that folder" if what == _BUNDLE else "")
        return ChartScriptError(
            f"cannot {what}: vl-convert's JavaScript engine (V8) cannot start under this address-space limit "
            f"(ulimit -v {describe_limit(hard)}; V8 reserves {_V8_RESERVES} of virtual address space, not RAM)."
            + way)
    why = last or f"exit code {rc}"
    return ChartScriptError(f"cannot {what} with vl-convert (in a child process): {why}")


@functools.lru_cache(maxsize=4)
def javascript_bundle(snippet: str | None, vl_version: str) -> str:
    """:func:`vl_convert.javascript_bundle` of *snippet* for *vl_version*, built outside this process.

    Parameters
    ----------
    snippet : str or None
        JavaScript importing from the modules vl-convert bundles; None: vega, vega-lite and
        vega-embed (``window.vegaEmbed``).
    vl_version : str
        Vega-Lite version as vl-convert spells it (``"v6_4"``).

    Returns
    -------
    str

    Raises
    ------
    ChartScriptError
        The child could not build it (under a hard ``ulimit -v``: the message names the limit
        and the way around it, ``PRECNB_CACHE``).
    """
    snippet = snippet or ""
    cache = _cache_file(snippet, vl_version)
    cached = _read_cache(cache)
    if cached is not None:
        return cached
    text = _in_child({"op": "bundle", "snippet": snippet, "vl_version": vl_version}, _BUNDLE)
    _write_cache(cache, text + _END)
    return text


def vegalite_to_svg(spec: dict[str, Any], vl_version: str) -> str:
    """:func:`vl_convert.vegalite_to_svg` of the Vega-Lite *spec*, in a child process.

    Raises
    ------
    ChartScriptError
        As :func:`javascript_bundle`.
    """
    return _in_child({"op": "svg", "spec": spec, "vl_version": vl_version}, "draw the chart")


def vl_version() -> str:
    """Vega-Lite version of the installed altair, as vl-convert spells it (``"v6_4"``)."""
    import altair as alt

    m = re.match(r"v?(\d+)\.(\d+)", str(alt.SCHEMA_VERSION))
    if not m:  # pragma: no cover - altair always has one
        raise RuntimeError(f"cannot read altair's Vega-Lite version {alt.SCHEMA_VERSION!r}")
    return f"v{m.group(1)}_{m.group(2)}"


def _in_child(request: dict[str, Any], what: str) -> str:
    """What the child prints for *request* (vl-convert's V8 never starts in this process)."""
    try:
        proc = subprocess.run([sys.executable, "-c", _CHILD], input=json.dumps(request).encode("utf-8"),
                              capture_output=True, timeout=_TIMEOUT, check=False)
    except subprocess.TimeoutExpired:
        raise ChartScriptError(f"cannot {what}: vl-convert took over {_TIMEOUT} s") from None
    except OSError as exc:
        raise ChartScriptError(f"cannot {what}: cannot start {sys.executable}: "
                               f"{exc.strerror or exc}") from None
    if proc.returncode != 0 or not proc.stdout:
        raise _failure(proc.returncode, proc.stderr.decode("utf-8", "replace"), what)
    return proc.stdout.decode("utf-8")
