#!/bin/sh
# build_mpi_plugin.sh MPICC OUTPUT -- builds the mpi backend
# (src/backends/mpi/mpi_backend.c, plus src/reduce/reduce.c for the
# reductions MPI lacks) into OUTPUT (libtorchcomms-mpi.so) with the MPI
# compiler wrapper MPICC, so the plugin links that MPI (docs/backends.md,
# section 9). Exports tc_backend_table only. The MPI's lib directory (beside
# the wrapper's bin/) goes into the run path, so no LD_LIBRARY_PATH is
# needed. Used by CMake (the default build, when mpicc or TORCHCOMMS_MPICC
# is found) and by `make mpi-plugins` (one build per MPI).
set -eu
[ $# -eq 2 ] || { echo "usage: $0 MPICC OUTPUT" >&2; exit 2; }
MPICC=$1
OUT=$2
ROOT=$(cd "$(dirname "$0")/.." && pwd)
command -v "$MPICC" >/dev/null 2>&1 || { echo "build_mpi_plugin.sh: no MPI compiler wrapper '$MPICC'" >&2; exit 1; }
BIN=$(dirname "$(command -v "$MPICC")")
LIB=$(cd "$BIN/../lib" 2>/dev/null && pwd || echo "")
mkdir -p "$(dirname "$OUT")"
VS=$(mktemp)
trap 'rm -f "$VS"' EXIT
echo '{ global: tc_backend_table; local: *; };' >"$VS"
RPATH=""
[ -n "$LIB" ] && RPATH="-Wl,-rpath,$LIB"
# shellcheck disable=SC2086
"$MPICC" -std=gnu11 -O2 -g -fPIC -shared -fvisibility=hidden \
  -Wall -Wextra -Werror -Wno-unused-parameter \
  -D_GNU_SOURCE -Dtc_dtype_size=tc_mpi_dtype_size \
  -I"$ROOT/include" -I"$ROOT/src" \
  "$ROOT/src/backends/mpi/mpi_backend.c" "$ROOT/src/reduce/reduce.c" \
  -o "$OUT.tmp" -lpthread -lm -Wl,--version-script="$VS" -Wl,-z,defs $RPATH
mv "$OUT.tmp" "$OUT"
