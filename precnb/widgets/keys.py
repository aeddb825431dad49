"""Keyboard navigation of the explorer: a tiny anywidget that forwards keys to Python.

It finds the explorer it sits in (``.precnb-explorer``), makes it focusable, keeps JupyterLab's
own shortcuts out of it (``data-lm-suppress-shortcuts``) and sends arrow keys, ``n`` / ``p``
(next / previous finding) and Enter to Python; ``/`` focuses the search box. Keys typed into a
text box are left alone. Python handles them in :meth:`KeyNav.on_key` callbacks.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anywidget
import traitlets

__all__ = ["KEYS", "KeyNav"]

KEYS = ("ArrowUp", "ArrowDown", "ArrowLeft", "ArrowRight", "n", "p", "Enter")

_ESM = """
const KEYS = new Set(%s);
function editable(t) {
  const tag = ((t && t.tagName) || "").toLowerCase();
  return tag === "input" || tag === "textarea" || tag === "select" || (t && t.isContentEditable);
}
function render({ model, el }) {
  el.classList.add("precnb-keys");
  el.textContent = "keys: \\u2190\\u2191\\u2193\\u2192 move \\u00b7 n / p next / previous finding \\u00b7 / search";
  el.style.cssText = "font-size:11px;color:#777";
  let root = null, tries = 0, timer = null;
  const onKey = (ev) => {
    if (editable(ev.target) || ev.ctrlKey || ev.metaKey || ev.altKey) return;
    if (ev.key === "/") {
      const box = root.querySelector(".precnb-search input");
      if (box) { box.focus(); ev.preventDefault(); ev.stopPropagation(); }
      return;
    }
    if (!KEYS.has(ev.key)) return;
    ev.preventDefault(); ev.stopPropagation();
    model.send({ key: ev.key });
  };
  const onDown = (ev) => {
    const button = ev.target.closest && ev.target.closest("button");
    if (!editable(ev.target) && !button) root.focus({ preventScroll: true });
  };
  const attach = () => {
    root = el.closest(".precnb-explorer");
    if (!root) { if (tries++ < 100) timer = setTimeout(attach, 100); return; }
    if (!root.hasAttribute("tabindex")) root.setAttribute("tabindex", "0");
    root.setAttribute("data-lm-suppress-shortcuts", "true");
    root.style.outline = "none";
    root.addEventListener("keydown", onKey);
    root.addEventListener("mousedown", onDown);
  };
  attach();
  return () => {
    clearTimeout(timer);
    if (root) { root.removeEventListener("keydown", onKey); root.removeEventListener("mousedown", onDown); }
  };
}
export default { render };
""" % ("[" + ", ".join(f'"{k}"' for k in KEYS) + "]")


class KeyNav(anywidget.AnyWidget):
    """Forwards key presses inside the explorer to ``handler(key)``."""

    _esm = _ESM
    last = traitlets.Unicode("")

    def __init__(self, handler: Callable[[str], Any]) -> None:
        super().__init__()
        self._handler = handler
        self.on_msg(self._on_msg)

    def _on_msg(self, _widget: Any, content: Any, _buffers: Any) -> None:
        key = content.get("key") if isinstance(content, dict) else None
        if key in KEYS:
            self.press(str(key))

    def press(self, key: str) -> None:
        """Handle *key* as if it had been pressed in the browser."""
        self.last = key
        self._handler(key)
