#!/usr/bin/env bash
# cg_per_op.sh -- instructions per operation and rank of an 8-byte
# collective, counted exactly with callgrind (docs/benchmarks.md, "What an
# 8-byte operation costs"): two launches of BUILD/tcperf under tcrun (N1 and
# N2 operations); the difference divided by N2 - N1 cancels start-up and
# shutdown. Printed per rank: the operations' own work, and apart from it
# the functions that spin or read the clock while waiting for a peer (whose
# count varies from launch to launch). Spinning inlined into other
# functions (a wait on a peer's header inside the small path) stays in the
# first figure.
# Usage: bench/cg_per_op.sh [BUILD] [COLLECTIVE] [RANKS] [N1] [N2]
#        (defaults: build all_reduce 2 10000 30000); needs valgrind.
set -euo pipefail
B=${1:-build}; C=${2:-all_reduce}; N=${3:-2}; N1=${4:-10000}; N2=${5:-30000}
command -v valgrind >/dev/null || { echo "SKIP: valgrind is not installed"; exit 0; }
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
for n in "$N1" "$N2"; do
  "$B/tcrun" -n "$N" valgrind --tool=callgrind --callgrind-out-file="$out/cg.$n.%q{RANK}" \
    "$B/tcperf" -c "$C" -b 8 -e 8 -n "$n" -w 5 >/dev/null 2>&1
done
for ((r = 0; r < N; r++)); do
  python3 - "$out/cg.$N1.$r" "$out/cg.$N2.$r" "$((N2 - N1))" "$r" <<'PY'
import re, subprocess, sys
def load(f):
    txt = subprocess.run(["callgrind_annotate", "--auto=no", "--threshold=100",
                          "--inclusive=no", f], capture_output=True, text=True).stdout
    d, on = {}, False
    for line in txt.splitlines():
        if "file:function" in line:
            on = True
            continue
        m = re.match(r"\s*([\d,]+) \(\s*[\d.]+%\)\s+(.*)$", line) if on else None
        if m:
            k = m.group(2).split(" [")[0]
            d[k] = d.get(k, 0) + int(m.group(1).replace(",", ""))
    return d
a, b, n = load(sys.argv[1]), load(sys.argv[2]), float(sys.argv[3])
wait = re.compile(r"wait_word|shm_block|shm_pause|_ready|sched_yield|tc__now|clock_gettime|__vdso|fp_wait")
own = sum(b.get(k, 0) - a.get(k, 0) for k in set(a) | set(b) if not wait.search(k))
spin = sum(b.get(k, 0) - a.get(k, 0) for k in set(a) | set(b) if wait.search(k))
print(f"rank {sys.argv[4]}: {own / n:.0f} instructions per operation, "
      f"+ {spin / n:.0f} in waits and clock reads")
PY
done
