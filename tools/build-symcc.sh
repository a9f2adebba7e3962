#!/usr/bin/env bash
# Build SymCC (QSYM backend) against Debian's LLVM 15, and check that it derives inputs.
#
#   tools/build-symcc.sh SRC DEST    DEST/bin/symcc and DEST/bin/sym++ when done
#   tools/build-symcc.sh --key SRC   the source's cache key (12 hex digits; `make symcc`)
#     INSTALL_DEPS=1   apt-get the build dependencies first (root)
#     JOBS=N           ninja parallelism
#
# SRC is either a checkout laid out as SymCC's repository, with its submodules (the runtime
# in runtime/, QSYM in runtime/src/backends/qsym/qsym), or a directory holding
# symcc-src.tar.gz, an archive of such a checkout under symcc/ (../shared/symcc).
# The compiler wrapper holds DEST's absolute path: build where it will be used.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
QSYM=runtime/src/backends/qsym/qsym

fail() { echo "build-symcc: $*" >&2; exit 1; }

# What SRC is: "archive" or "checkout"; fails with what is missing otherwise.
kind() {
  local src="$1"
  [ -d "$src" ] || fail "SYMCC_SRC=$src is not a directory"
  if [ -f "$src/symcc-src.tar.gz" ]; then echo archive; return; fi
  [ -f "$src/CMakeLists.txt" ] && [ -d "$src/compiler" ] ||
    fail "SYMCC_SRC=$src is neither a SymCC checkout (CMakeLists.txt, compiler/, runtime/) nor a directory holding symcc-src.tar.gz"
  [ -f "$src/runtime/CMakeLists.txt" ] && [ -f "$src/$QSYM/qsym/pintool/afl_trace_map.cpp" ] ||
    fail "SYMCC_SRC=$src: its runtime or QSYM is missing ($src/runtime, $src/$QSYM): git -C $src submodule update --init --recursive"
  echo checkout
}

if [ "${1:-}" = --key ]; then
  src="${2:?usage: $0 --key SRC}"
  source_kind="$(kind "$src")"
  case "$source_kind" in
    archive) cat "$src/symcc-src.tar.gz" "$0" | sha256sum | cut -c1-12 ;;
    checkout) { (cd "$src" && find . -type f -not -path '*/.git/*' -print0 | LC_ALL=C sort -z |
                 xargs -0 sha256sum); cat "$0"; } | sha256sum | cut -c1-12 ;;
  esac
  exit 0
fi

SRC="${1:?usage: $0 SRC DEST}"
DEST="${2:?usage: $0 SRC DEST}"
KIND="$(kind "$SRC")"
if [ "${INSTALL_DEPS:-0}" = 1 ]; then
  apt-get update -q
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q llvm-15-dev clang-15 libz3-dev z3 \
    cmake ninja-build python3 zlib1g-dev libzstd-dev
fi
command -v llvm-config-15 >/dev/null ||
  fail "llvm-config-15 not found: INSTALL_DEPS=1 $0 $SRC $DEST (as root) installs LLVM 15"
LLVM_BIN="$(llvm-config-15 --bindir)"
mkdir -p "$DEST"
DEST="$(cd "$DEST" && pwd)"
rm -rf "$DEST/src" && mkdir -p "$DEST/src"
if [ "$KIND" = archive ]; then
  tar -xzf "$SRC/symcc-src.tar.gz" -C "$DEST/src"
else
  cp -a "$SRC" "$DEST/src/symcc" && rm -rf "$DEST/src/symcc/.git"
fi
# The build's own output goes to a log, shown (its end) only when a step fails.
LOG="$DEST/build.log"
step() {
  "$@" >>"$LOG" 2>&1 || { tail -n 40 "$LOG" >&2; fail "$1 failed (whole log: $LOG)"; }
}
: >"$LOG"
step cmake -S "$DEST/src/symcc" -B "$DEST/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_C_COMPILER="$LLVM_BIN/clang" -DCMAKE_CXX_COMPILER="$LLVM_BIN/clang++" \
  -DSYMCC_RT_BACKEND=qsym -DZ3_TRUST_SYSTEM_VERSION=on \
  -DLLVM_DIR="$(llvm-config-15 --cmakedir)" \
  -DCLANG_BINARY="$LLVM_BIN/clang" -DCLANGPP_BINARY="$LLVM_BIN/clang++"
step ninja -C "$DEST/build" ${JOBS:+-j "$JOBS"}
mkdir -p "$DEST/bin"
ln -sf "$DEST/build/symcc" "$DEST/bin/symcc"
ln -sf "$DEST/build/sym++" "$DEST/bin/sym++"

# Smoke: from "AAAA" QSYM must derive an input that starts with 'X' (a symbolic branch
# solved), and the derived input must take the branch when replayed.
T="$(mktemp -d)"; trap 'rm -rf "$T"' EXIT
cat > "$T/smoke.c" <<'C'
#include <stdio.h>
int main(int argc, char **argv) {
  char c = 0;
  FILE *f = fopen(argv[1], "rb");
  if (f && fread(&c, 1, 1, f) == 1 && c == 'X') return 42;
  return 0;
}
C
"$DEST/bin/symcc" -O2 -o "$T/smoke" "$T/smoke.c"
printf AAAA > "$T/seed"; mkdir "$T/out"
SYMCC_INPUT_FILE="$T/seed" SYMCC_OUTPUT_DIR="$T/out" "$T/smoke" "$T/seed" >/dev/null 2>&1 || true
derived="$(ls "$T/out" | head -n 1)"
[ -n "$derived" ] || fail "the SymCC built in $DEST derived no input from the smoke test"
rc=0; SYMCC_NO_SYMBOLIC_INPUT=1 SYMCC_OUTPUT_DIR="$T" "$T/smoke" "$T/out/$derived" \
  >/dev/null 2>&1 || rc=$?
[ "$rc" = 42 ] || fail "the input SymCC derived does not take the solved branch (exit $rc)"
echo "SymCC (QSYM backend) ready: $DEST/bin/symcc"
