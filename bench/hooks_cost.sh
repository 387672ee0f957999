#!/bin/bash
# Usage: BASE_BUILD=/path/to/old/build [NEW_BUILD=build] [ROUNDS=10] bench/hooks_cost.sh
# 8 B all_reduce, 2 ranks, tcperf -m median (20000 iterations, 2000 warm-up),
# interleaved rounds: base (d400cd0, before this issue) vs this tree with the
# flight recorder off / on (default) / on + a no-op pre and post hook.
B=${BASE_BUILD:?build dir of the commit to compare with, e.g. d400cd0}; N=${NEW_BUILD:-build}; R=${ROUNDS:-10}
export ROWS=${TMPDIR:-/tmp}/hooks_cost_rows.txt
one() { "$@" 2>/dev/null | awk '$1==8 {print $6}'; }
for i in $(seq $R); do
  a=$(one $B/tcrun -n 2 $B/tcperf -c all_reduce -b 8 -e 8 -n 20000 -w 2000 -m median)
  b=$(TORCH_FR_BUFFER_SIZE=0 one $N/tcrun -n 2 $N/tcperf -c all_reduce -b 8 -e 8 -n 20000 -w 2000 -m median)
  c=$(one $N/tcrun -n 2 $N/tcperf -c all_reduce -b 8 -e 8 -n 20000 -w 2000 -m median)
  d=$(one $N/tcrun -n 2 $N/tcperf -c all_reduce -b 8 -e 8 -n 20000 -w 2000 -m median --hooks)
  echo "$a $b $c $d"
done | tee "$ROWS"
python3 - <<'PY'
import statistics as st
rows=[list(map(float,l.split())) for l in open(__import__('os').environ['ROWS']) if l.strip()]
names=["base (before)","now, FR off","now, FR on (default)","now, FR on + no-op pre/post hooks"]
cols=list(zip(*rows))
base=st.median(cols[0])
for n,c in zip(names,cols):
    m=st.median(c); print(f"{n:40s} median {m:.3f} us  (min {min(c):.3f}, max {max(c):.3f})  ratio to base {m/base:.2f}")
PY
