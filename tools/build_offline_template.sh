#!/usr/bin/env bash
# build_offline_template.sh OUTDIR [PYTHON]  ->  OUTDIR/offline_lab (an nbconvert HTML template)
#
# An nbconvert template that extends "lab" and inlines everything a saved notebook needs to
# render with no network: require.js, a vega-embed bundle from vl-convert registered as the AMD
# module "vega-embed", anywidget as the AMD module "anywidget" (wrapped in a function scope so
# its top-level helpers do not clash with vega's globals), and the ipywidgets HTML manager; the
# MathJax <script> (CDN) is dropped. See ../shared/docs/jupyter_stack_notes.md §2 and pitfall 6.
#
# Nothing third-party is committed: the npm packages are fetched at build time with `npm pack`
# at pinned versions (html-manager 1.0.x goes with ipywidgets 8; npm anywidget must equal the
# pip anywidget installed in PYTHON) into a temporary folder, and only OUTDIR is written.
# Needs: npm (registry), and altair + vl-convert-python + anywidget + ipywidgets in PYTHON.
#
#   jupyter nbconvert --to html --TemplateExporter.extra_template_basedirs=OUTDIR \
#                     --template offline_lab notebook.ipynb
set -euo pipefail

OUT=${1:?usage: build_offline_template.sh OUTDIR [PYTHON]}
PY=${2:-python}
if ! command -v npm >/dev/null 2>&1; then
  echo "build_offline_template: npm is needed (npm pack fetches the JavaScript): run 'sudo apt-get install npm'" \
       "(make system-deps does, as root)" >&2
  exit 1
fi
HTML_MANAGER_VERSION=${HTML_MANAGER_VERSION:-1.0.15}
REQUIREJS_VERSION=${REQUIREJS_VERSION:-2.3.8}
ANYWIDGET_VERSION=${ANYWIDGET_VERSION:-$("$PY" -c 'import importlib.metadata as m; print(m.version("anywidget"))')}
IPYWIDGETS_MAJOR=$("$PY" -c 'import importlib.metadata as m; print(m.version("ipywidgets").split(".")[0])')
if [ "$IPYWIDGETS_MAJOR" != 8 ]; then
  echo "build_offline_template: @jupyter-widgets/html-manager $HTML_MANAGER_VERSION needs ipywidgets 8," \
       "found ipywidgets $IPYWIDGETS_MAJOR" >&2
  exit 1
fi

T="$OUT/offline_lab"
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
mkdir -p "$W/t"

( cd "$W" && npm pack --silent "@jupyter-widgets/html-manager@$HTML_MANAGER_VERSION" \
      "requirejs@$REQUIREJS_VERSION" "anywidget@$ANYWIDGET_VERSION" >/dev/null
  for f in *.tgz; do mkdir "${f%.tgz}"; tar -xzf "$f" -C "${f%.tgz}"; done )

cp "$W/requirejs-$REQUIREJS_VERSION/package/require.js" "$W/t/require.js"
# html-manager's CSS points at its icon fonts with relative URLs (file:// misses next to the
# exported page): inline the .woff2 files as data: URIs (browsers try woff2 first).
"$PY" - "$W/jupyter-widgets-html-manager-$HTML_MANAGER_VERSION/package/dist" "$W/t/embed-amd.js" <<'PY'
import base64, pathlib, re, sys

dist, out = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
js = (dist / "embed-amd.js").read_text(encoding="utf-8")

def inline(m):
    data = base64.b64encode((dist / m.group(1)).read_bytes()).decode("ascii")
    return '"data:font/woff2;base64,' + data + '"'

js, n = re.subn(r'[A-Za-z_$][\w$]*\.p\+"([0-9a-f]{20}\.woff2)"', inline, js)
assert n and not re.search(r'\.p\+"[0-9a-f]{20}\.woff2"', js), "unexpected html-manager font references"
out.write_text(js, encoding="utf-8")
PY

# anywidget's dist is an anonymous AMD module with top-level globals: name it, wrap it.
{ echo "(function () {"
  sed 's|^define(\["@jupyter-widgets/base"\], widget_default);|define("anywidget", ["@jupyter-widgets/base"], widget_default);|' \
      "$W/anywidget-$ANYWIDGET_VERSION/package/dist/index.js"
  echo "})();"; } > "$W/t/anywidget-amd.js"
grep -q 'define("anywidget"' "$W/t/anywidget-amd.js" || {
  echo "build_offline_template: anywidget $ANYWIDGET_VERSION dist/index.js has an unexpected define() line" >&2
  exit 1; }

# vega + vega-lite + vega-embed, the versions altair uses, as the AMD module "vega-embed"
"$PY" - "$W/t/vega-embed-amd.js" <<'PY'
import re
import sys

import altair as alt
import vl_convert as vlc

major, minor = re.match(r"v?(\d+)\.(\d+)", alt.SCHEMA_VERSION).groups()  # "v6.4.1" -> "v6_4"
bundle = vlc.javascript_bundle(vl_version=f"v{major}_{minor}")
with open(sys.argv[1], "w", encoding="utf-8") as fh:
    fh.write("(function () {\n" + bundle
             + '\ndefine("vega-embed", [], function () { return window.vegaEmbed; });\n})();\n')
PY

echo '{"base_template": "lab", "mimetypes": {"text/html": true}, "preprocessors": {}}' > "$W/t/conf.json"
cat > "$W/t/index.html.j2" <<'J2'
{%- extends 'lab/index.html.j2' -%}
{#- offline_lab: built by tools/build_offline_template.sh; every script is inlined -#}
{%- block html_head_js_requirejs -%}
{{ resources.include_js("require.js") }}
{{ resources.include_js("vega-embed-amd.js") }}
{%- endblock html_head_js_requirejs -%}
{% block jupyter_widgets %}
{%- if "widgets" in nb.metadata -%}
{{ resources.include_js("anywidget-amd.js") }}
{{ resources.include_js("embed-amd.js") }}
{%- endif -%}
{% endblock jupyter_widgets %}
{%- block html_head_js_mathjax -%}{%- endblock html_head_js_mathjax -%}
J2
printf '{"html-manager": "%s", "requirejs": "%s", "anywidget": "%s"}\n' \
    "$HTML_MANAGER_VERSION" "$REQUIREJS_VERSION" "$ANYWIDGET_VERSION" > "$W/t/versions.json"

# replace the old template only once the new one is complete
rm -rf "$T.tmp" && mkdir -p "$OUT" && cp -r "$W/t" "$T.tmp" && rm -rf "$T" && mv "$T.tmp" "$T"
echo "built $T (html-manager $HTML_MANAGER_VERSION, requirejs $REQUIREJS_VERSION, anywidget $ANYWIDGET_VERSION)"
