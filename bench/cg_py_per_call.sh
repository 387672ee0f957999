#!/usr/bin/env bash
# cg_py_per_call.sh -- instructions per call of an 8-byte operation from
# Python, counted exactly with callgrind (docs/benchmarks.md, "Reading
# tensors through torch's C shim"): 1 rank, 2-element float32 tensors,
# async_op=False, a loop of N1 and of N2 calls after 2000 warm-up calls;
# only the calling thread between the two markers (get_name before the loop,
# get_rank after) is counted, and the difference of the two launches
# divided by N2 - N1 cancels what is not per call.
# Usage: bench/cg_py_per_call.sh [OP] [N1] [N2]
#        OP: all_reduce (default), all_gather, reduce_scatter, all_to_all;
#        PYTHONPATH picks another copy of the package; needs valgrind.
set -euo pipefail
OP=${1:-all_reduce}; N1=${2:-10000}; N2=${3:-20000}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
command -v valgrind >/dev/null || { echo "SKIP: valgrind is not installed"; exit 0; }
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
cat > "$out/loop.py" <<'PY'
import sys
import torch
import torchcomms
op, n = sys.argv[1], int(sys.argv[2])
c = torchcomms.new_comm("cpu", torch.device("cpu"), name="cg")
a, o = torch.ones(2), torch.zeros(2 * c.get_size())
f, args = {
    "all_reduce": (c.all_reduce, (a, torchcomms.ReduceOp.SUM, False)),
    "all_gather": (c.all_gather_single, (o, a, False)),
    "reduce_scatter": (c.reduce_scatter_single, (a.clone(), o, torchcomms.ReduceOp.SUM, False)),
    "all_to_all": (c.all_to_all_single, (o, a, False)),
}[op]
def loop(k):
    for _ in range(k):
        f(*args)
loop(2000)
c.get_name()
loop(n)
c.get_rank()
c.finalize()
PY
for n in "$N1" "$N2"; do
  PYTHONHASHSEED=0 "$ROOT/build/tcrun" -n 1 valgrind --tool=callgrind --separate-threads=yes \
    --compress-strings=no --compress-pos=no --zero-before=tcpy_comm_get_name \
    --dump-before=tcpy_comm_get_rank --callgrind-out-file="$out/cg.$n" \
    "$ROOT/.venv/bin/python" "$out/loop.py" "$OP" "$n" >/dev/null 2>&1
done
a=$(awk '/^summary/{print $2}' "$out/cg.$N1.1-01")
b=$(awk '/^summary/{print $2}' "$out/cg.$N2.1-01")
echo "$OP: $(( (b - a) / (N2 - N1) )) instructions per call"
