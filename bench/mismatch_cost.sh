#!/bin/bash
# The cost of mismatch detection: tcperf 8 B all_reduce and broadcast with
# TORCHCOMMS_CHECK_MISMATCH=1 and 0, interleaved run by run, shm and TCP.
# Usage: bench/mismatch_cost.sh [BUILD_DIR] [NRANKS]   (docs/reliability.md)
B=${1:-build}
N=${2:-2}
for run in 1 2 3 4 5; do
 for tp in auto tcp; do
  for coll in all_reduce broadcast; do
   for chk in 1 0; do
    out=$(TORCHCOMMS_CPU_TRANSPORT=$tp TORCHCOMMS_CHECK_MISMATCH=$chk ./$B/tcrun -n $N ./$B/tcperf -c $coll -b 8 -e 8 -n 20000 -w 2000 -m median 2>&1 | awk '$1==8 {print $6}')
    echo "$tp $coll chk=$chk $out"
   done
  done
 done
done
