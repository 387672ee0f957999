#!/usr/bin/env bash
# tests/gpu/run.sh -- the nccl backend on real GPUs (world size 1 on one
# GPU; 2 and 4 ranks too when the machine has that many GPUs).
#
# Builds with CMake, finds NCCL and the CUDA runtime, then runs:
#   1. the C operation matrix (tests/c/test_nccl_ops.c: every operation,
#      every dtype NCCL reduces, every reduction, counts 0..65537) on the
#      real libraries, buffers in CUDA managed memory (TC_NCCL_REAL=1);
#   2. examples/nccl_all_reduce (device memory, its own CUDA stream, sync
#      and async);
#   3. tests/py/workers/nccl_worker.py: every TorchComm operation on CUDA
#      tensors (torch's current stream passed to each), several
#      communicators (a split and a second new_comm); tests/gpu/reduce_table.py:
#      every dtype x reduction of all_reduce (ok, refused clearly, or WRONG);
#   4. the seeds' examples (examples/python/*.py) turned back into their
#      CUDA form: new_comm("nccl", torch.device("cuda", LOCAL_RANK)).
# Prints one line per step and a summary; exits 1 if any step failed, 2 if
# it cannot run at all (no GPU, no NCCL, no CUDA-enabled torch).
#
# Usage: tests/gpu/run.sh [--fake]
#   --fake   no GPU needed: the same steps on the fake NCCL and CUDA runtime
#            of tests/c/fake_nccl/ with CPU tensors (TORCHCOMMS_NCCL_FAKE_HOST=1)
#            and the project's .venv; it checks this script, not NCCL.
# Environment:
#   BUILD_DIR    CMake build directory (default: build-gpu; --fake: build)
#   GPU_PYTHON   a Python whose torch has CUDA (default: the first of
#                .venv-gpu, .venv and python3 that has it; otherwise
#                .venv-gpu is created with pip, unless TC_GPU_PIP=0)
#   TORCHCOMMS_NCCL_LIB, TORCHCOMMS_CUDART_LIB
#                the libraries (default: those of torch's nvidia-nccl-cu12
#                and nvidia-cuda-runtime-cu12 wheels, else the system's)
#   TC_GPU_PIP=0 never pip install (a machine without network)
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
FAKE=0
if [[ ${1:-} == --fake ]]; then
  FAKE=1
elif [[ $# -gt 0 ]]; then
  echo "usage: $0 [--fake]" >&2
  exit 2
fi
if ((FAKE)); then
  BUILD=${BUILD_DIR:-$ROOT/build}
else
  BUILD=${BUILD_DIR:-$ROOT/build-gpu}
fi
PIP_OK=${TC_GPU_PIP:-1}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
PASSED=()
FAILED=()

die() { # cannot run at all
  echo "run.sh: cannot run: $*" >&2
  exit 2
}
note() { echo "run.sh: $*"; }

# run_step NAME COMMAND... : runs a step with its output in $TMP/NAME.log,
# shown when it fails.
run_step() {
  local name=$1
  shift
  local log="$TMP/$name.log"
  echo "== $name: $*"
  local t0=$SECONDS
  if "$@" >"$log" 2>&1; then
    PASSED+=("$name")
    echo "   ok ($((SECONDS - t0)) s)"
  else
    FAILED+=("$name")
    echo "   FAILED ($((SECONDS - t0)) s); its output:"
    sed 's/^/   | /' "$log" | tail -n 60
  fi
}

# refused_step NAME TEXT COMMAND... : a step that must fail with TEXT in its
# output (a clear refusal, not a crash).
refused_step() {
  local name=$1 text=$2
  shift 2
  local log="$TMP/$name.log"
  echo "== $name (must be refused: '$text'): $*"
  if "$@" >"$log" 2>&1; then
    FAILED+=("$name (ran; it should have been refused)")
    echo "   FAILED: it ran"
  elif grep -qF -- "$text" "$log" && ! grep -qE 'Segmentation|core dumped|SIG(SEGV|ABRT|BUS)' "$log"; then
    PASSED+=("$name")
    echo "   ok (refused: $(grep -m1 -F -- "$text" "$log" | cut -c1-160))"
  else
    FAILED+=("$name")
    echo "   FAILED; its output:"
    sed 's/^/   | /' "$log" | tail -n 60
  fi
}

# expect_in LOG TEXT... : fails the last step unless LOG holds every TEXT.
expect_in() {
  local name=$1 log="$TMP/$1.log"
  shift
  local t
  for t in "$@"; do
    if ! grep -qF -- "$t" "$log"; then
      echo "   FAILED: $name did not print '$t'"
      FAILED+=("$name (output)")
    fi
  done
}

# ---- the machine ----

NGPU=0
if ((FAKE)); then
  NGPU=2 # ranks the fake may run
else
  command -v nvidia-smi >/dev/null || die "nvidia-smi not found: no NVIDIA driver on this machine"
  NGPU=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)
  ((NGPU > 0)) || die "no NVIDIA GPU visible (nvidia-smi -L lists none)"
  nvidia-smi -L
fi
note "$NGPU GPU(s)"

# ---- a Python with torch (CUDA-enabled unless --fake) ----

has_cuda_torch() {
  "$1" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' \
    >/dev/null 2>&1
}

PY=""
if ((FAKE)); then
  PY=$ROOT/.venv/bin/python
  [[ -x $PY ]] || die "$PY missing (make venv)"
else
  for cand in "${GPU_PYTHON:-}" "$ROOT/.venv-gpu/bin/python" "$ROOT/.venv/bin/python" \
    "$(command -v python3 || true)"; do
    if [[ -n $cand && -x $cand ]] && has_cuda_torch "$cand"; then
      PY=$cand
      break
    fi
  done
  if [[ -z $PY && $PIP_OK != 0 ]]; then
    note "no Python with a CUDA-enabled torch: creating .venv-gpu (pip install torch)"
    python3 -m venv "$ROOT/.venv-gpu" || die "python3 -m venv failed"
    "$ROOT/.venv-gpu/bin/python" -m pip install --quiet --upgrade pip setuptools ||
      die "pip failed"
    "$ROOT/.venv-gpu/bin/python" -m pip install --quiet torch numpy cmake ||
      die "pip install torch failed (no network? set GPU_PYTHON)"
    has_cuda_torch "$ROOT/.venv-gpu/bin/python" && PY=$ROOT/.venv-gpu/bin/python
  fi
  [[ -n $PY ]] || die "no Python with a CUDA-enabled torch (set GPU_PYTHON)"
fi
note "python: $PY ($("$PY" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)'))"
TORCHRUN=$(dirname "$PY")/torchrun
[[ -x $TORCHRUN ]] || die "$TORCHRUN missing"

# ---- build ----

CMAKE=$(command -v cmake || true)
[[ -n $CMAKE ]] || CMAKE=$(dirname "$PY")/cmake
[[ -x $CMAKE ]] || die "cmake not found (pip install cmake)"
echo "== build: $CMAKE -S $ROOT -B $BUILD"
if ! { "$CMAKE" -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=RelWithDebInfo &&
  "$CMAKE" --build "$BUILD" -j "$(nproc)"; } >"$TMP/cmake.log" 2>&1; then
  tail -n 40 "$TMP/cmake.log"
  die "the build failed"
fi
for f in "$BUILD/libtorchcomms-nccl.so" "$BUILD/tc_test" "$BUILD/examples/nccl_all_reduce"; do
  [[ -e $f ]] || die "the build did not make $f"
done

# ---- the libraries ----

if ((FAKE)); then
  export TORCHCOMMS_NCCL_LIB=$BUILD/fake_nccl/libtcfake_nccl.so
  export TORCHCOMMS_CUDART_LIB=$BUILD/fake_nccl/libtcfake_cudart.so
  export TORCHCOMMS_NCCL_FAKE_HOST=1 TCFAKE_NCCL_TIMEOUT=60
else
  # the libraries torch itself loads (its nvidia-* wheels: nvidia/nccl/lib,
  # nvidia/cuda_runtime/lib; CUDA 13 wheels nvidia/cu13/lib), else the system's
  nvidia_lib() { # GLOB
    "$PY" - "$1" <<'EOF' 2>/dev/null
import glob, os, sys
import nvidia
for d in nvidia.__path__:
    hits = sorted(glob.glob(os.path.join(d, "*", "lib", sys.argv[1])))
    if hits:
        print(hits[0])
        break
EOF
  }
  system_lib() { ldconfig -p 2>/dev/null | awk -v n="$1" '$1 == n {print $NF; exit}'; }
  : "${TORCHCOMMS_NCCL_LIB:=$(nvidia_lib 'libnccl.so.2')}"
  : "${TORCHCOMMS_NCCL_LIB:=$(system_lib libnccl.so.2)}"
  : "${TORCHCOMMS_CUDART_LIB:=$(nvidia_lib 'libcudart.so.1*')}"
  : "${TORCHCOMMS_CUDART_LIB:=$(system_lib libcudart.so.12)}"
  : "${TORCHCOMMS_CUDART_LIB:=$(system_lib libcudart.so.13)}"
  if [[ -z $TORCHCOMMS_NCCL_LIB || -z $TORCHCOMMS_CUDART_LIB ]] && [[ $PIP_OK != 0 ]]; then
    note "installing nvidia-nccl-cu12 and nvidia-cuda-runtime-cu12 with pip"
    "$PY" -m pip install --quiet nvidia-nccl-cu12 nvidia-cuda-runtime-cu12 ||
      die "pip install nvidia-nccl-cu12 failed"
    : "${TORCHCOMMS_NCCL_LIB:=$(nvidia_lib 'libnccl.so.2')}"
    : "${TORCHCOMMS_CUDART_LIB:=$(nvidia_lib 'libcudart.so.1*')}"
  fi
  [[ -n $TORCHCOMMS_NCCL_LIB && -e $TORCHCOMMS_NCCL_LIB ]] ||
    die "libnccl.so.2 not found (pip install nvidia-nccl-cu12, or set TORCHCOMMS_NCCL_LIB)"
  [[ -n $TORCHCOMMS_CUDART_LIB && -e $TORCHCOMMS_CUDART_LIB ]] ||
    die "libcudart not found (pip install nvidia-cuda-runtime-cu12, or set TORCHCOMMS_CUDART_LIB)"
  export TORCHCOMMS_NCCL_LIB TORCHCOMMS_CUDART_LIB
  unset TORCHCOMMS_NCCL_FAKE_HOST
fi
note "NCCL: $TORCHCOMMS_NCCL_LIB"
note "CUDA runtime: $TORCHCOMMS_CUDART_LIB"
for v in RANK WORLD_SIZE LOCAL_RANK MASTER_ADDR MASTER_PORT TORCHELASTIC_USE_AGENT_STORE \
  TORCHCOMM_RANK TORCHCOMM_SIZE TORCHCOMMS_BACKEND_LIB_PATH_NCCL; do
  unset "$v"
done
export OMP_NUM_THREADS=1

# ---- torchcomms for that Python (the extension and the nccl module) ----

if ((!FAKE)); then
  echo "== pip install torchcomms into $PY"
  "$PY" -m pip install --quiet setuptools >/dev/null 2>&1 || true
  "$PY" -m pip install --quiet --no-build-isolation "$ROOT" >"$TMP/pip.log" 2>&1 ||
    { tail -n 40 "$TMP/pip.log"; die "pip install of torchcomms failed"; }
fi
"$PY" -c 'import pathlib, torchcomms._comms as c
p = pathlib.Path(c.__file__).parent / "libtorchcomms-nccl.so"
assert p.exists(), p' || die "torchcomms or its libtorchcomms-nccl.so is not installed for $PY"

# ---- 1. the C operation matrix ----

MATRIX=(nccl_ops_w1)
((NGPU >= 2)) && MATRIX+=(nccl_ops_w2)
((NGPU >= 4)) && MATRIX+=(nccl_ops_w4)
run_step c_matrix env TC_NCCL_REAL=1 TC_TEST_TIMEOUT=600 "$BUILD/tc_test" "${MATRIX[@]}"
expect_in c_matrix "${#MATRIX[@]} passed, 0 failed"

# ---- 2. the C example ----

run_step c_example "$BUILD/examples/nccl_all_reduce"
expect_in c_example "Rank 0: After AllReduce: 1.0"
if grep -q skipping "$TMP/c_example.log"; then
  FAILED+=("c_example (skipped: $(cat "$TMP/c_example.log"))")
fi
if ((NGPU >= 2)); then
  run_step c_example_2 "$BUILD/tcrun" -n 2 "$BUILD/examples/nccl_all_reduce"
  expect_in c_example_2 "Rank 0: After AllReduce: 3.0" "Rank 1: After AllReduce: 3.0"
fi

# ---- 3. every TorchComm operation on CUDA tensors ----

DEVKIND=cuda
((FAKE)) && DEVKIND=cpu
run_step py_worker "$TORCHRUN" --standalone --nproc_per_node=1 \
  "$ROOT/tests/py/workers/nccl_worker.py" "$DEVKIND"
expect_in py_worker "nccl worker rank 0 of 1:" "checks passed"
if ((NGPU >= 2)); then
  run_step py_worker_2 "$TORCHRUN" --standalone --nproc_per_node=2 \
    "$ROOT/tests/py/workers/nccl_worker.py" "$DEVKIND"
  expect_in py_worker_2 "nccl worker rank 1 of 2:"
fi

# every dtype x reduction of all_reduce, one line each (the C matrix stops
# at its first failure; this table goes on)
run_step reduce_table "$TORCHRUN" --standalone --nproc_per_node=1 \
  "$ROOT/tests/gpu/reduce_table.py" "$DEVKIND"
sed -n 's/^/   | /p' "$TMP/reduce_table.log" | grep -v ' ok$' | grep -E '^   \| [a-z0-9_]+ +[A-Z_]+ ' || true
expect_in reduce_table "0 WRONG"

# ---- 4. the seeds' examples in their CUDA form ----

mkdir -p "$TMP/examples"
for src in "$ROOT"/examples/python/*.py; do
  name=$(basename "$src" .py)
  dst="$TMP/examples/$name.py"
  if ! grep -q 'new_comm("cpu", device' "$src"; then
    note "example $name: skipped (it does not create its communicator with new_comm(\"cpu\", device))"
    continue
  fi
  if ((FAKE)); then
    sed 's/new_comm("cpu", device/new_comm("nccl", device/' "$src" >"$dst"
  else
    sed -e 's/new_comm("cpu", device/new_comm("nccl", device/' \
      -e 's/torch\.device("cpu")/torch.device("cuda", int(__import__("os").environ.get("LOCAL_RANK", "0")))/' \
      "$src" >"$dst"
  fi
  if ! grep -q 'new_comm("nccl", device' "$dst" ||
    { ((!FAKE)) && grep -q 'torch\.device("cpu")' "$dst"; }; then
    FAILED+=("example $name (not converted to nccl/cuda)")
    continue
  fi
  # send/recv rings need a peer
  ranks=1
  case $name in SendRecv* | ObjectCollectives) ranks=2 ;; esac
  if ((ranks > NGPU)); then
    note "example $name: skipped (needs $ranks GPUs)"
    continue
  fi
  if [[ $name == window_put_signal ]]; then
    # windows from Python need host memory (the cpu backend): on nccl
    # tensor_register must refuse, saying so, not crash on a device pointer
    refused_step "example_$name" "windows from Python need" \
      "$TORCHRUN" --standalone --nproc_per_node="$ranks" "$dst"
    continue
  fi
  run_step "example_$name" "$TORCHRUN" --standalone --nproc_per_node="$ranks" "$dst"
done

# ---- summary ----

echo
echo "run.sh: ${#PASSED[@]} step(s) passed: ${PASSED[*]}"
if ((${#FAILED[@]})); then
  echo "run.sh: ${#FAILED[@]} FAILED:"
  printf '   %s\n' "${FAILED[@]}"
  exit 1
fi
echo "run.sh: all passed$( ((FAKE)) && echo ' (fake NCCL: this checked the script, not a GPU)')"
exit 0
