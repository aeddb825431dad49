"""Inlined assets of the report: the vega/vega-lite/vega-embed bundle, CSS and page script.

The vega bundle comes from :func:`vl_convert.javascript_bundle` (offline, no CDN), in the
Vega-Lite version altair writes, built in a child process (:mod:`precnb._jsbundle`) once per
process and inlined once per page.
"""

from __future__ import annotations

import functools
from importlib import resources

__all__ = ["escape_script_json", "package_text", "script_safe", "vega_bundle", "vl_version"]


def vl_version() -> str:
    """Vega-Lite version of the installed altair, as vl-convert spells it (``"v6_4"``)."""
    from precnb._jsbundle import vl_version as version

    return version()


def escape_script_json(text: str) -> str:
    r"""Escape JSON text for a ``<script>`` block: ``<``, ``>``, ``&``, U+2028 and U+2029 as ``\uXXXX``.

    The JSON value is unchanged (these characters only occur inside strings, where the escapes
    mean the same); the HTML parser can no longer end or re-open the script (``</script>``,
    ``<!--``), and JavaScript parsers that treat U+2028/U+2029 as line ends are not confused.

    Examples
    --------
    >>> escape_script_json('{"m": "</script>\u2028"}')
    '{"m": "\\u003c/script\\u003e\\u2028"}'
    """
    for a, b in (("&", "\\u0026"), ("<", "\\u003c"), (">", "\\u003e"), ("\u2028", "\\u2028"),
                 ("\u2029", "\\u2029")):
        text = text.replace(a, b)
    return text


def script_safe(js: str) -> str:
    """Make JavaScript safe inside an inline ``<script>`` element.

    ``</script`` would end the element and ``<!--`` changes how the HTML parser reads it;
    neither occurs in the vega bundle, and this is checked rather than rewritten.

    Examples
    --------
    >>> script_safe("var a = 1;")
    'var a = 1;'
    """
    low = js.lower()
    if "</script" in low or "<!--" in low:
        raise ValueError("script text contains '</script' or '<!--'; it cannot be inlined safely")
    return js


@functools.lru_cache(maxsize=2)
def vega_bundle(version: str | None = None) -> str:
    """Vega, Vega-Lite and vega-embed as one classic script that sets ``window.vegaEmbed``.

    Wrapped in a function scope: the bundle declares top-level constants that would clash
    with any other copy on the page (``jupyter_stack_notes.md``, pitfall 4). Built by
    vl-convert in a child process (:mod:`precnb._jsbundle`: its JavaScript engine cannot start
    under a ``ulimit -v``, and must not take precnb down with it), kept for the process and,
    only when ``$PRECNB_CACHE`` names a folder, on disk.

    Raises
    ------
    precnb._jsbundle.ChartScriptError
        vl-convert could not build it (the message says why and what to do).
    """
    from precnb._jsbundle import javascript_bundle

    return script_safe("(function () {\n" + javascript_bundle(None, version or vl_version()) + "\n})();\n")


@functools.lru_cache(maxsize=8)
def package_text(name: str) -> str:
    """Text of ``precnb/templates/report/<name>`` (CSS and page script)."""
    return resources.files("precnb").joinpath("templates", "report", name).read_text(encoding="utf-8")
