#!/usr/bin/env bash
# The differential fuzzer (tests/test_fuzz_differential.py) against an AddressSanitizer/UBSan build of the C
# extension (issue #49; run by `make fuzz`): a copy of the package is built with -fsanitize=address,undefined in a
# temporary folder and the fuzzer runs on it with libasan preloaded. pytest captures at the Python level only
# (--capture=sys): a sanitizer writes its report to file descriptor 2 and ends the process, and with pytest's
# default fd capture that report went into the capture file with it (an exit 1 without a word). Without a C compiler it says so and exits 0 (the pure path
# is all there is to fuzz then; `make fuzz` still runs the fuzzers on the normal build).
# usage: tools/fuzz_sanitized.sh PYTHON [pytest args...]
set -eu
PY=${1:?usage: tools/fuzz_sanitized.sh PYTHON [pytest args]}
shift
CC=${CC:-gcc}
if ! command -v "$CC" >/dev/null 2>&1; then
  echo "fuzz_sanitized: no C compiler ($CC): the sanitizer build is skipped"
  exit 0
fi
ASAN=$("$CC" -print-file-name=libasan.so)
if [ ! -e "$ASAN" ]; then
  echo "fuzz_sanitized: $CC has no libasan: the sanitizer build is skipped"
  exit 0
fi
ROOT=$(cd "$(dirname "$0")/.." && pwd)
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
cp -r "$ROOT/precnb" "$ROOT/setup.py" "$ROOT/pyproject.toml" "$ROOT/tests" "$TMP/"
cp -r "$ROOT/README.md" "$TMP/" 2>/dev/null || true
rm -f "$TMP"/precnb/io/*.so
(cd "$TMP" && CFLAGS="-O1 -g -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined" \
   LDFLAGS="-fsanitize=address,undefined" "$PY" setup.py -q build_ext --inplace >/dev/null)
ls "$TMP"/precnb/io/_craw*.so >/dev/null
echo "fuzz_sanitized: extension built with ASan/UBSan in $TMP"
cd "$TMP"
LD_PRELOAD="$ASAN" ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  PYTHONPATH="$TMP" "$PY" -m pytest -p no:cacheprovider --capture=sys -q -rs "$@" tests/test_fuzz_differential.py
