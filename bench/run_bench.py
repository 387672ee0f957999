"""make bench: our cpu backend against Gloo, Open MPI and memcpy, side by side.

    .venv/bin/python bench/run_bench.py [--runs 3] [--ranks 2,4] [--colls ...]

For each run (runs are interleaved, so drift hits every implementation alike),
each rank count and each collective, it measures over 8 B and 16 B .. 64 MiB
(x4 steps, so 64 KiB, 1 MiB and 64 MiB are exact points):

  ours-c      build/tcperf under build/tcrun (shared memory: the default here)
  ours-py     python -m torchcomms.perf under build/tcrun (torch tensors)
  ours-tcp    build/tcperf with TORCHCOMMS_CPU_TRANSPORT=tcp
  ours-c-bf16, ours-c-fp16
              build/tcperf -d float32,bfloat16 / -d float32,float16: all_reduce
              and reduce_scatter at 2 ranks (issue 16, point 5); each launch
              measures the 16-bit dtype and float32 side by side (5 rounds per
              size, alternating), and its float32 rows are kept as
              ours-c-bf16-f32 / ours-c-fp16-f32, point 5's reference
  gloo        ../shared/bench/gloo_perf.py (torch.distributed, Gloo)
  mpi-shm     ../shared/bench/mpi_perf.c under mpirun (Open MPI's default:
              shared memory)
  mpi-tcp     the same with --mca btl self,tcp
  memcpy      ../shared/bench/memcpy_bw.c (one thread, once per run)
  ompi mpich impi ccl (ccl-mpi ccl-impi)
              the PyPI-wheel anchors of ../shared/bench/anchors/run_anchor.sh
              (Open MPI 5, MPICH 5, Intel MPI, oneCCL), each as A (shared
              memory) and A-tcp; --anchors / BENCH_ANCHORS picks them
              (default ompi,mpich,impi,ccl; "none": no anchor); installed
              once into $ANCHOR_CACHE (default /tmp/anchor-cache) and reused.
              One ratio table per anchor, "ours / best anchor" first
              (bench/bench_anchors.py).

send_recv (point-to-point): tcperf -c send_recv (every rank sends to r+1
and receives from r-1 in one batch) against bench/mpi_sendrecv.c's
MPI_Sendrecv of the same pattern, built with each MPI (Debian's and the
anchors' Open MPI, MPICH, Intel MPI), and bench/ccl_sendrecv.cpp's
ccl::send + ccl::recv for the oneCCL anchors.

One-sided windows ("put" and "get", 2 ranks only; rank 0 the origin, rank 1
the target; see docs/benchmarks.md), in the same runs and the same CSVs:

  ours-c      build/tcperf -c put|get (library-allocated window in shared
              memory; put = tc_window_put + tc_window_flush, get =
              tc_window_get)
  ours-tcp    the same with TORCHCOMMS_CPU_TRANSPORT=tcp
  mpi-shm     bench/mpi_rma_perf.c under mpirun, Open MPI's default osc
              component (MPI_Win_allocate, MPI_Win_lock_all once, then
              MPI_Put|MPI_Get + MPI_Win_flush per iteration)
  mpi-oscsm   the same with --mca osc sm (Open MPI's shared-memory window:
              a put is a memcpy into the mapped peer segment)
  mpi-tcp     the same with --mca btl self,tcp --mca osc pt2pt (osc rdma
              refuses the tcp btl, and with btl self,tcp alone Open MPI
              silently falls back to osc sm, i.e. shared memory; pt2pt is
              excluded by Debian's openmpi-mca-params.conf and named here
              explicitly). Skipped with a message when Open MPI refuses it.

--colls put,get runs the window part alone; the default runs everything.

Iterations follow the anchors' rule for everyone (1000 below 64 KiB, 100
below 4 MiB, 10 from 4 MiB; 5 warm-up). Writes bench/results/raw.csv (every
row of every run), bench/results/median.csv (median over runs),
bench/results/ratios.csv, bench/results/ratios_<anchor>.csv,
bench/results/timing.csv (seconds per measurement call),
bench/results/placement.csv (bench/placement_probe.c run before every
launch: how fast the two CPUs exchange data at that moment; on a VM the
host's placement of the virtual CPUs makes a launch 2-4x slower from 64 KiB
when the probe's ping-pong is far, docs/benchmarks.md "Two placements"),
bench/results/busbw_<N>ranks.png, and prints the tables of ratios and the
issues' targets with PASS/MISS, issue 16's last (bench/bench_targets.py,
which --targets, or make bench-targets, prints again from saved CSVs).

--more K (BENCH_MORE, default 2): after the runs, K more interleaved
launches of each implementation that decides an issue-16 target the runs
left close (within bench_targets.CLOSE of it, either side), at those points
only (docs/benchmarks.md, "Close calls").
--load (make bench-load: --load --colls none): 8 B all_reduce at 2, 4, 8
ranks quiet and under a CPU hog on every core, and the idle CPU cost of a
blocking wait (bench/bench_load.py; issue 16, point 3).
"""
import argparse
import csv
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import time

import bench_anchors as BA
import bench_load
import bench_targets

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ANCHORS = os.path.normpath(os.environ.get("TC_BENCH_ANCHORS", os.path.join(ROOT, "..", "shared", "bench")))
BUILD = os.environ.get("TC_BUILD_DIR", os.path.join(ROOT, "build"))
OUT = os.path.join(ROOT, "bench", "results")
COLLS = ["all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all"]
P2P_COLLS = ["send_recv"]  # point-to-point: tcperf -c send_recv, bench/mpi_sendrecv.c
WIN_COLLS = ["put", "get"]  # one-sided windows: 2 ranks only
MPI_NAME = {"all_reduce": "allreduce", "all_gather": "allgather", "reduce_scatter": "reduce_scatter",
            "broadcast": "bcast", "all_to_all": "alltoall"}
IMPLS = ["ours-c", "ours-py", "ours-tcp", "ours-c-bf16", "ours-c-fp16", "gloo", "mpi-shm", "mpi-tcp", "mpi-oscsm"]
COLL_IMPLS = ["ours-c", "ours-py", "ours-tcp", "ours-c-bf16", "ours-c-fp16", "gloo", "mpi-shm", "mpi-tcp"]
# ours-c with another dtype (tcperf -d; issue 16, point 5): all_reduce and
# reduce_scatter at 2 ranks only
DTYPE_IMPLS = bench_targets.DTYPE_IMPLS
WIN_IMPLS = ["ours-c", "ours-tcp", "mpi-shm", "mpi-oscsm", "mpi-tcp"]
# Open MPI options of each MPI implementation, for the collectives and for the
# windows (osc: the one-sided component; see the docstring)
MPI_OPTS = {"mpi-shm": [], "mpi-tcp": ["--mca", "btl", "self,tcp"]}
MPI_WIN_OPTS = {"mpi-shm": [], "mpi-oscsm": ["--mca", "osc", "sm"],
                "mpi-tcp": ["--mca", "btl", "self,tcp", "--mca", "osc", "pt2pt"]}
SIZES = list(bench_targets.SIZES)  # 8 B, 16 B .. 64 MiB (--max-size cuts it)
MPIRUN = ["mpirun", "--allow-run-as-root", "--oversubscribe"]
# 16-bit floats against float32 (issue 16, point 5): 2 ranks, shared memory
DT_COLLS = ["all_reduce", "reduce_scatter"]


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def parse_times(text):
    """time_us of each row, in order, from nccl-tests style output (ours or the anchors')."""
    times = []
    for line in text.splitlines():
        f = line.split()
        if not f or f[0].startswith("#") or not f[0].isdigit():
            continue
        if len(f) >= 9:  # ours: size count type redop root time algbw busbw #wrong
            if f[8] not in ("N/A", "0"):
                raise RuntimeError(f"wrong results reported: {line}")
            times.append(float(f[5]))
        elif len(f) == 5:  # anchors: size count time_us algbw busbw
            times.append(float(f[2]))
    return times


def busbw(coll, n, size, time_us):
    """nccl-tests bus bandwidth in GB/s of the requested size (computed here, not
    read back, so that rounding in the printed columns does not matter)."""
    f = 2 * (n - 1) / n if coll == "all_reduce" else 1.0 if coll in ("broadcast", *WIN_COLLS) else (n - 1) / n
    return size / (time_us * 1e-6) / 1e9 * f


def run_cmd(cmd, env=None, timeout=600):
    e = dict(os.environ, OMP_NUM_THREADS="1")
    e.update(env or {})
    e = {k: v for k, v in e.items() if v is not None}  # None: unset
    t0 = time.time()
    p = subprocess.run(cmd, env=e, capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {p.returncode}:\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}")
    return p.stdout, time.time() - t0


def size_ranges():
    """(min, max) calls covering SIZES with x4 steps."""
    return [(8, 8)] + ([(16, SIZES[-1])] if SIZES[-1] >= 16 else [])


# Implementations whose benchmark takes any factor: one launch with x2 steps
# from 8 B covers every size of SIZES (8 B and 16 B x 4^k); the others' rows
# are dropped. Saves a launch (a torch import for ours-py and gloo) per point.
ONE_LAUNCH = ("ours-c", "ours-py", "ours-tcp", "ours-c-bf16", "ours-c-fp16", "gloo")


SETTLE_S = float(os.environ.get("BENCH_SETTLE_S", "0.5"))


def applies(impl, coll, n):
    """Whether impl measures coll at n ranks."""
    if coll in WIN_COLLS:
        return n == 2 and impl in WIN_IMPLS
    if coll in P2P_COLLS and impl == "gloo":
        return False  # gloo_perf.py has no send/recv
    if impl == "gloo" and n not in GLOO_RANKS:
        return False
    if impl in DTYPE_IMPLS:
        return n == 2 and coll in bench_targets.DTYPE_COLLS
    return impl in COLL_IMPLS


# Gloo's rank counts: 2 by default (the issue-4 targets compare with Gloo at
# 2 ranks only; at 4 ranks on 2 cores a Gloo sweep took minutes per
# collective, the largest share of make bench's time); BENCH_GLOO_RANKS=2,4
# adds 4 ranks back.
GLOO_RANKS = [int(x) for x in os.environ.get("BENCH_GLOO_RANKS", "2").split(",") if x]
OVERSUB_SEEN = set()  # (impl, ranks) the anchor script marked OVERSUBSCRIBED
TIMING = []  # [run, impl, ranks, collective, min size, max size, seconds] of every measurement call
# [run, impl, ranks, collective, min size, attempts, ping-pong ns before,
# after, handoff GB/s before] of the placement probe (bench/placement_probe.c)
# around each launch: on a VM the host moves the virtual CPUs, and a launch in
# the "far" placement is 2-4x slower from 64 KiB (docs/benchmarks.md, "Two
# placements").
PLACEMENT = []
FAR_NS = 150  # a probe ping-pong above this: the far placement
# BENCH_PLACEMENT=near (the default): every launch, ours and the anchors'
# alike, waits (up to BENCH_PLACEMENT_WAIT_S, 10 s) for the near placement,
# and is measured again (up to 3 attempts) when the probe after it says far;
# "any": measured as it comes, the probe only recorded.
PLACE_NEAR = os.environ.get("BENCH_PLACEMENT", "near") != "any"
PLACE_WAIT_S = float(os.environ.get("BENCH_PLACEMENT_WAIT_S", "10"))


def probe_placement(tools):
    """(handoff GB/s, ping-pong ns) now, or None without the probe."""
    if not tools.get("probe"):
        return None
    try:
        out, _ = run_cmd([tools["probe"]], timeout=30)
    except (RuntimeError, subprocess.TimeoutExpired):
        return None
    m = re.search(r"handoff_GBps=([0-9.na]+) pingpong_ns=([0-9.na]+)", out)
    return (float(m.group(1)), float(m.group(2))) if m else None


def far(p):
    return p is not None and p[1] > FAR_NS


def wait_near(tools):
    """The probe now; with PLACE_NEAR, probes every 0.25 s until the near
    placement or PLACE_WAIT_S."""
    p, t0 = probe_placement(tools), time.time()
    while PLACE_NEAR and far(p) and time.time() - t0 < PLACE_WAIT_S:
        time.sleep(0.25)
        p = probe_placement(tools)
    return p


def placement_report():
    """placement.csv, and per implementation how many of its launches ran
    in the far placement (a probe ping-pong above FAR_NS)."""
    if not PLACEMENT:
        return
    with open(os.path.join(OUT, "placement.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["run", "impl", "ranks", "collective", "min_size", "attempts",
                    "pingpong_ns_before", "pingpong_ns_after", "handoff_GBps_before"])
        w.writerows(PLACEMENT)
    per = {}
    for r in PLACEMENT:
        k = per.setdefault(r[1], [0, 0, 0])
        k[0] += 1
        k[1] += r[6] > FAR_NS or r[7] > FAR_NS
        k[2] += r[5] - 1
    log(f"bench: placement (placement.csv; {'near placement awaited' if PLACE_NEAR else 'as it came'}): "
        f"{sum(v[1] for v in per.values())} of {len(PLACEMENT)} kept launches had a far probe "
        f"(> {FAR_NS} ns) before or after, {sum(v[2] for v in per.values())} launches measured again; "
        "per implementation (far / launches, again): " +
        ", ".join(f"{k} {v[1]}/{v[0]}, {v[2]}" for k, v in sorted(per.items())))


def launch(impl, coll, n, lo, hi, factor, tools, anchor):
    """One launch of impl over sizes lo..hi: (its output, its start time)."""
    t_call = time.time()
    if impl in ("ours-c", "ours-tcp", "ours-py", *DTYPE_IMPLS):
        prog = [tools["tcperf"]] if impl != "ours-py" else [tools["python"], "-m", "torchcomms.perf"]
        cmd = [tools["tcrun"], "-n", str(n), *prog, "-c", coll, "-b", str(lo), "-e", str(hi),
               "-f", str(factor), "-n", "0", "-w", "5", "-t", "120"]
        if impl in DTYPE_IMPLS:  # float32 beside it: rows alternate float32, DTYPE
            cmd += ["-d", "float32," + DTYPE_IMPLS[impl], "-R", "5"]
        env = {"TORCHCOMMS_CPU_TRANSPORT": "tcp"} if impl == "ours-tcp" else None
        out, _ = run_cmd(cmd, env)
    elif anchor:
        env, cmd = BA.measure_cmd(impl, coll, n, lo, hi, ANCHORS, tools["p2p"])
        # GNU nproc honours OMP_NUM_THREADS: the script counts cores with it
        env["OMP_NUM_THREADS"] = None
        out, _ = run_cmd(cmd, env, timeout=BA.RUN_TIMEOUT + 60)
        if "OVERSUBSCRIBED" in out or (coll in P2P_COLLS and BA.oversubscribed(n)):
            OVERSUB_SEEN.add((impl, n))
    elif impl == "gloo":
        cmd = [tools["python"], os.path.join(ANCHORS, "gloo_perf.py"), "--nproc", str(n), "--coll", coll,
               "--min-bytes", str(lo), "--max-bytes", str(hi), "--factor", str(factor),
               "--port", str(free_port())]
        out, _ = run_cmd(cmd)
    elif coll in WIN_COLLS:
        cmd = [*MPIRUN, *MPI_WIN_OPTS[impl], "-np", str(n), tools["mpi_rma_perf"], coll, str(lo), str(hi)]
        out, _ = run_cmd(cmd)
    elif coll in P2P_COLLS:
        cmd = [*MPIRUN, *MPI_OPTS[impl], "-np", str(n), tools["mpi_sendrecv"], "sendrecv", str(lo), str(hi)]
        out, _ = run_cmd(cmd)
    else:
        cmd = [*MPIRUN, *MPI_OPTS[impl], "-np", str(n), tools["mpi_perf"], MPI_NAME[coll], str(lo), str(hi)]
        out, _ = run_cmd(cmd)
    return out, t_call


def measure(impl, coll, n, tools, ranges=None, place=True):
    """{size: (time_us, busbw)} of one implementation at one point, over
    ranges ([(min, max)], x4 steps; default size_ranges()). place: the
    placement probe around each launch (not under bench_load's CPU hog,
    where every probe is slow)."""
    rows = {}
    anchor = BA.split_impl(impl)
    factor = 4
    if ranges is None and impl in ONE_LAUNCH and SIZES[-1] >= 16:
        ranges, factor = [(8, SIZES[-1])], 2
    for lo, hi in ranges or size_ranges():
        # the previous job's processes may still be exiting (mpirun's daemons,
        # torch's workers): a sub-millisecond 8 B measurement must not share
        # the cores with them
        time.sleep(SETTLE_S)
        for attempt in range(1, 4):
            before = wait_near(tools) if place else None
            out, t_call = launch(impl, coll, n, lo, hi, factor, tools, anchor)
            after = probe_placement(tools) if place else None
            if not PLACE_NEAR or not (far(before) or far(after)) or attempt == 3:
                break
        if before and after:
            PLACEMENT.append([RUN_NOW[0], impl, n, coll, lo, attempt, before[1], after[1], before[0]])
        want = [lo * factor ** k for k in range(64) if lo * factor ** k <= hi]
        times = parse_times(out)
        if impl in DTYPE_IMPLS:  # (float32, DTYPE) per size: the reference under (REF, size)
            ref, times = times[0::2], times[1::2]
            rows.update({(bench_targets.DTYPE_REF, size): (t, busbw(coll, n, size, t))
                         for size, t in zip(want, ref) if factor == 4 or size in SIZES})
        if len(times) != len(want):
            raise RuntimeError(f"expected {len(want)} rows, got {len(times)}:\n{out[-2000:]}")
        rows.update({size: (t, busbw(coll, n, size, t)) for size, t in zip(want, times)
                     if factor == 4 or size in SIZES})
        TIMING.append([RUN_NOW[0], impl, n, coll, lo, hi, round(time.time() - t_call + SETTLE_S, 2)])
    return rows


RUN_NOW = [0]  # the run measure() is in (for TIMING)


def put_rows(raw, run, impl, n, coll, rows, sizes=None):
    """measure()'s rows into raw (at `sizes` only, when given); a reference
    row (DTYPE_REF, size) goes in as implementation impl + DTYPE_REF."""
    for k, v in rows.items():
        i, size = (impl + k[0], k[1]) if isinstance(k, tuple) else (impl, k)
        if sizes is None or size in sizes:
            raw[(run, i, n, coll, size)] = v


def measure_or_report(impl, coll, n, tools, ranges, run, failures, afailures):
    """measure(), or {} after a failure is logged and listed: an anchor's in
    afailures (reported, not a failed bench), ours and the rest in failures."""
    try:
        return measure(impl, coll, n, tools, ranges)
    except (RuntimeError, subprocess.TimeoutExpired) as e:
        (afailures if BA.split_impl(impl) else failures).append(f"run {run} {impl} {coll} n={n}: {e}")
        # the command, then the end of its output (a traceback's last lines)
        msg = str(e)
        log(f"bench: FAILED {impl} {coll} n={n}: " +
            (msg if len(msg) <= 1200 else msg[:300] + "\n...\n" + msg[-900:]))
        return {}


def timing_report(t_total):
    """Where the time went: bench/results/timing.csv and a summary on stderr."""
    with open(os.path.join(OUT, "timing.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["run", "impl", "ranks", "collective", "min_size", "max_size", "seconds"])
        w.writerows(TIMING)
    per = {}
    for r in TIMING:
        per[r[1]] = per.get(r[1], 0.0) + r[6]
    log(f"bench: {t_total:.0f} s in all; seconds per implementation (launches, settling and timing): " +
        ", ".join(f"{k} {v:.0f}" for k, v in sorted(per.items(), key=lambda x: -x[1])))


def memcpy_rows(tools):
    out, _ = run_cmd([tools["memcpy_bw"]])
    r = {}
    for line in out.splitlines():
        f = line.split()
        if f and f[0].isdigit():
            r[int(f[0])] = float(f[1])
    return r


def kernel_report(tools):
    """The reduction kernels' single-core throughput next to memcpy
    (build/tcreduce_bench: float32, bfloat16, float16; reduce and reduce3) for
    point 5 of issue 16; the end-to-end bf16/fp16 ratios are the ours-c-bf16 and
    ours-c-fp16 rows of the main runs (bench_targets.py). File: reduce_kernels.txt."""
    out, _ = run_cmd([tools["tcreduce_bench"]])
    with open(os.path.join(OUT, "reduce_kernels.txt"), "w") as f:
        f.write(out)
    print("\n# reduction kernels, one core (issue 16, point 5)\n" + out.rstrip())


def build_tools(skip_mpi):
    os.makedirs(os.path.join(BUILD, "bench"), exist_ok=True)
    tools = {"tcrun": os.path.join(BUILD, "tcrun"), "tcperf": os.path.join(BUILD, "tcperf"),
             "python": sys.executable,
             "memcpy_bw": os.path.join(BUILD, "bench", "memcpy_bw"),
             "tcreduce_bench": os.path.join(BUILD, "tcreduce_bench"),
             "probe": os.path.join(BUILD, "tcplacement_probe"),
             "mpi_perf": os.path.join(BUILD, "bench", "mpi_perf"),
             "mpi_rma_perf": os.path.join(BUILD, "bench", "mpi_rma_perf"),
             "mpi_sendrecv": os.path.join(BUILD, "bench", "mpi_sendrecv"), "p2p": {}}
    for t in ("tcrun", "tcperf", "tcreduce_bench"):
        if not os.access(tools[t], os.X_OK):
            sys.exit(f"bench: {tools[t]} is missing: run `make build` first")
    if not os.access(tools["probe"], os.X_OK):
        tools["probe"] = None  # an older build: no placement.csv
    if not os.path.isfile(os.path.join(ANCHORS, "memcpy_bw.c")):
        sys.exit(f"bench: the anchor benchmarks are not in {ANCHORS} (a checkout beside ../shared, "
                 "or TC_BENCH_ANCHORS=/path/to/shared/bench)")
    subprocess.run(["cc", "-O2", "-o", tools["memcpy_bw"], os.path.join(ANCHORS, "memcpy_bw.c")], check=True)
    if not skip_mpi:
        if not shutil.which("mpicc") or not shutil.which("mpirun"):
            sys.exit("bench: Open MPI is missing (mpicc, mpirun): `make bench` installs Debian's "
                     "openmpi-bin and libopenmpi-dev; or pass --no-mpi")
        subprocess.run(["mpicc", "-O2", "-o", tools["mpi_perf"], os.path.join(ANCHORS, "mpi_perf.c")], check=True)
        subprocess.run(["mpicc", "-O2", "-o", tools["mpi_rma_perf"], os.path.join(ROOT, "bench", "mpi_rma_perf.c")],
                       check=True)
        subprocess.run(["mpicc", "-O2", "-o", tools["mpi_sendrecv"], os.path.join(ROOT, "bench", "mpi_sendrecv.c")],
                       check=True)
    return tools


def fmt_size(b):
    for unit, s in (("M", 1 << 20), ("K", 1 << 10)):
        if b >= s and b % s == 0:
            return f"{b // s}{unit}"
    return str(b)


def median_table(raw):
    """(impl, n, coll, size) -> (median time_us, median busbw, runs)."""
    groups = {}
    for (run, impl, n, coll, size), (t, bw) in raw.items():
        groups.setdefault((impl, n, coll, size), []).append((t, bw))
    return {k: (statistics.median(x[0] for x in v), statistics.median(x[1] for x in v), len(v))
            for k, v in groups.items()}


def ratio(a, b):
    return a / b if a is not None and b else None


OSC_VERBOSE = ["--mca", "osc_base_verbose", "1", "--mca", "osc_rdma_verbose", "100",
               "--mca", "osc_pt2pt_verbose", "100", "--mca", "osc_ucx_verbose", "100"]


def probe_osc(impls, tools):
    """Runs each MPI window implementation once at 8 B with the osc components'
    verbosity up (rdma, pt2pt and ucx name themselves when the window is
    freed; sm does not, so a window none named is sm's): returns
    {impl: "osc <component>"}, or {impl: "refused (<why>)"} for those that do
    not work here (e.g. an Open MPI without osc pt2pt for mpi-tcp), which are
    skipped."""
    found = {}
    for impl in impls:
        if impl not in MPI_WIN_OPTS:
            continue
        cmd = [*MPIRUN, *MPI_WIN_OPTS[impl], *OSC_VERBOSE, "-np", "2", tools["mpi_rma_perf"], "put", "8", "8"]
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        except subprocess.TimeoutExpired:
            p = None
        text = (p.stdout + p.stderr) if p else ""
        comps = set(re.findall(r"(\w+) component destroying window", text))
        if p is None or p.returncode != 0 or "# check ok" not in p.stdout:
            lines = text.splitlines()
            errs = [ln for ln in lines if "MPI_ERR" in ln] or [ln for ln in lines if "rror" in ln]
            why = "timed out" if p is None else (errs or text.strip().splitlines()[-1:] or ["no output"])[0].strip()
            found[impl] = f"refused ({why}): skipped"
            continue
        found[impl] = "osc " + ("/".join(sorted(comps)) if comps else "sm")
    return found



def main():
    global OUT
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=int(os.environ.get("BENCH_RUNS", "3")))
    ap.add_argument("--more", type=int, default=int(os.environ.get("BENCH_MORE", "2")),
                    help="after the runs, this many more interleaved launches of each implementation "
                         "deciding an issue-16 target that the runs left close (within "
                         f"{bench_targets.CLOSE}x of it, either side), at those points only (env BENCH_MORE; "
                         "0: none)")
    ap.add_argument("--ranks", default=os.environ.get("BENCH_RANKS", "2,4"))
    ap.add_argument("--colls", default=os.environ.get("BENCH_COLLS", ",".join(COLLS + P2P_COLLS + WIN_COLLS)),
                    help="collectives, send_recv and/or put,get (--colls put,get: the window part alone)")
    ap.add_argument("--anchors", default=os.environ.get("BENCH_ANCHORS", BA.DEFAULT),
                    help=f"PyPI-wheel anchors, comma separated, of {', '.join(BA.KNOWN)}; 'none' for none "
                         f"(default {BA.DEFAULT}; env BENCH_ANCHORS)")
    ap.add_argument("--impls", default=os.environ.get("BENCH_IMPLS", ",".join(IMPLS)))
    ap.add_argument("--max-size", type=int, default=int(os.environ.get("BENCH_MAX_SIZE", str(SIZES[-1]))),
                    help="largest size in bytes (default 64 MiB; smaller for a quick check)")
    ap.add_argument("--no-mpi", action="store_true", help="skip Open MPI (when it cannot be installed)")
    ap.add_argument("--no-plot", action="store_true")
    ap.add_argument("--out", default=os.environ.get("BENCH_OUT", OUT),
                    help=f"results directory (default {os.path.relpath(OUT, ROOT)}; env BENCH_OUT)")
    ap.add_argument("--load", action="store_true", default=os.environ.get("BENCH_LOAD", "") not in ("", "0"),
                    help="also measure 8 B all_reduce quiet and under a CPU hog on every core, and the idle "
                         "CPU cost of a blocking wait (bench/bench_load.py; make bench-load runs it alone "
                         "with --colls none)")
    ap.add_argument("--load-ranks", default=os.environ.get("BENCH_LOAD_RANKS", ",".join(map(str, bench_load.LOAD_RANKS))))
    ap.add_argument("--load-impls", default=os.environ.get("BENCH_LOAD_IMPLS", ",".join(bench_load.LOAD_IMPLS)),
                    help="of ours-c, ompi (Open MPI 5 anchor), mpi-shm (Debian's Open MPI), or another anchor")
    ap.add_argument("--targets", action="store_true",
                    help="measure nothing: print the issue-16 targets from the CSVs in --out and exit")
    ap.add_argument("--no-dtypes", action="store_true",
                    help="skip the reduction kernels' table (build/tcreduce_bench)")
    a = ap.parse_args()
    OUT = os.path.abspath(a.out)
    if a.targets:
        if not os.path.isdir(OUT):
            sys.exit(f"bench: {OUT} is not a results directory")
        bench_targets.print_issue16(OUT)
        return 0
    ranks = [int(x) for x in a.ranks.split(",")]
    SIZES[:] = [s for s in SIZES if s <= a.max_size] or [8]
    colls = [c for c in a.colls.split(",") if c and c != "none"]
    impls = [i for i in a.impls.split(",") if i and not (a.no_mpi and i.startswith("mpi"))]
    load_ranks = [int(x) for x in a.load_ranks.split(",") if x]
    load_impls = [i for i in a.load_impls.split(",") if i and not (a.no_mpi and i.startswith("mpi"))] \
        if a.load else []
    for i in load_impls:
        if i not in ("ours-c", "mpi-shm") and not BA.split_impl(i):
            sys.exit(f"bench: unknown --load-impls entry {i!r} (ours-c, mpi-shm or an anchor: "
                     f"{', '.join(BA.KNOWN)})")
    try:
        anchors = BA.parse_list(a.anchors)
    except ValueError as e:
        sys.exit(f"bench: {e}")
    for c in colls:
        if c not in COLLS + P2P_COLLS + WIN_COLLS:
            sys.exit(f"bench: unknown collective {c!r} (one of {', '.join(COLLS + P2P_COLLS + WIN_COLLS)})")
    for i in impls:
        if i not in IMPLS:
            sys.exit(f"bench: unknown implementation {i!r} (one of {', '.join(IMPLS)})")
    wcolls = [c for c in colls if c in WIN_COLLS]
    colls_c = [c for c in colls if c not in WIN_COLLS]
    ranks_c = ranks  # the collectives' rank counts (as asked); put/get: 2 ranks only
    if wcolls and 2 not in ranks:
        log("bench: put/get are measured at 2 ranks only, and --ranks has no 2: adding 2 for them")
        ranks = sorted(set(ranks) | {2})
    tools = build_tools(a.no_mpi or not any(i.startswith("mpi") for i in impls + load_impls))
    os.makedirs(OUT, exist_ok=True)
    # the anchors: installed (first use) and checked once, before any timing
    astatus = {}
    load_anchors = [BA.split_impl(i)[0] for i in load_impls if BA.split_impl(i)]
    need = (anchors if colls_c else []) + [x for x in load_anchors if not (colls_c and x in anchors)]
    if need:
        astatus, tools["p2p"] = BA.prepare(need, ANCHORS, log)
    for i in list(load_impls):
        if BA.split_impl(i) and astatus.get(BA.split_impl(i)[0]) is not None:
            log(f"bench: load: {i} left out: {astatus[BA.split_impl(i)[0]]}")
            load_impls.remove(i)
    if not colls_c:
        anchors = []
    anchors = [x for x in anchors if astatus.get(x, "") is None]
    aimpls = BA.impl_names(anchors)
    force_oversub = os.environ.get("BENCH_OVERSUB", "") not in ("", "0")
    askip = {}  # (impl, coll, n) -> why not measured
    osc = {}
    if wcolls and not a.no_mpi:
        osc = probe_osc(impls, tools)
        for impl, comp in osc.items():
            log(f"bench: {impl} for put/get: mpirun {' '.join(MPI_WIN_OPTS[impl]) or '(defaults)'} -> {comp}")
    skip = {(i, c) for i in WIN_IMPLS if i in MPI_WIN_OPTS and not osc.get(i, "").startswith("osc ")
            for c in WIN_COLLS}

    raw, mem = {}, {}
    failures, afailures = [], []
    t_start = time.time()
    if colls:  # --colls none (make bench-load): the load part alone
        for run in range(1, a.runs + 1):
            RUN_NOW[0] = run
            for size, bw in memcpy_rows(tools).items():
                mem.setdefault(size, []).append(bw)
            for n in ranks:
                for coll in colls:
                    if (n != 2) if coll in WIN_COLLS else (n not in ranks_c):
                        continue
                    for impl in impls + (aimpls if coll not in WIN_COLLS else []):
                        if impl in aimpls:
                            why = BA.applies(impl, coll, n, astatus, tools["p2p"], force_oversub)
                            if why:
                                if run == 1 and (BA.split_impl(impl)[0], coll, n) not in askip:
                                    askip[(BA.split_impl(impl)[0], coll, n)] = why
                                    log(f"bench: {BA.split_impl(impl)[0]} {coll} n={n}: not measured: {why}")
                                continue
                        elif not applies(impl, coll, n) or (impl, coll) in skip:
                            continue
                        rows = measure_or_report(impl, coll, n, tools, None, run, failures, afailures)
                        put_rows(raw, run, impl, n, coll, rows)
                    took = {}
                    for r in TIMING:
                        if r[0] == run and r[2] == n and r[3] == coll:
                            took[r[1]] = took.get(r[1], 0.0) + r[6]
                    log(f"bench: run {run}/{a.runs} n={n} {coll} done ({time.time() - t_start:.0f} s; " +
                        " ".join(f"{k} {v:.0f}" for k, v in took.items()) + ")")

        if a.more > 0 and colls_c:
            more_runs(raw, a.runs, a.more, tools, anchors, ranks_c, colls_c, impls, failures, afailures, t_start)

        with open(os.path.join(OUT, "raw.csv"), "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["run", "impl", "ranks", "collective", "size", "time_us", "busbw_GBps"])
            for (run, impl, n, coll, size), (t, bw) in sorted(raw.items()):
                w.writerow([run, impl, n, coll, size, t, bw])
        med = median_table(raw)
        memmed = {s: statistics.median(v) for s, v in mem.items()}
        with open(os.path.join(OUT, "median.csv"), "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["impl", "ranks", "collective", "size", "time_us", "busbw_GBps", "runs"])
            for (impl, n, coll, size), (t, bw, k) in sorted(med.items()):
                w.writerow([impl, n, coll, size, t, bw, k])
            for s, bw in sorted(memmed.items()):
                w.writerow(["memcpy", 1, "memcpy", s, "", bw, len(mem[s])])

        def get(impl, n, coll, size, col=1):
            v = med.get((impl, n, coll, size))
            return v[col] if v else None

        # One table of ratios: busbw of ours-c over each reference (> 1: we are faster).
        refs = [i for i in ("mpi-shm", "gloo", "ours-py") if i in impls]
        rrows = []
        if colls_c:
            print(f"\n# make bench: {a.runs} run(s), medians; ratio = busbw(ours-c) / busbw(reference)"
                  f" (same sizes, same run); ours-tcp / mpi-tcp in the last column")
            hdr = f"{'ranks':>5} {'collective':<15}{'size':>6} {'ours us':>9} {'ours GB/s':>9}" + "".join(
                f" {('x ' + r):>9}" for r in refs) + f" {'tcp/mpitcp':>10}"
            print(hdr)
        for n in ranks_c:
            for coll in colls_c:
                for size in SIZES:
                    ours = get("ours-c", n, coll, size)
                    ot = get("ours-c", n, coll, size, 0)
                    if ours is None:
                        continue
                    rs = [ratio(ours, get(r, n, coll, size)) for r in refs]
                    tr = ratio(get("ours-tcp", n, coll, size), get("mpi-tcp", n, coll, size))
                    rrows.append([n, coll, size, ot, ours, *rs, tr])
                    print(f"{n:>5} {coll:<15}{fmt_size(size):>6} {ot:>9.2f} {ours:>9.3f}" + "".join(
                        f" {x:>9.2f}" if x is not None else f" {'-':>9}" for x in rs) +
                        (f" {tr:>10.2f}" if tr is not None else f" {'-':>10}"))
        with open(os.path.join(OUT, "ratios.csv") if colls_c else os.devnull, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["ranks", "collective", "size", "ours_time_us", "ours_busbw_GBps",
                        *[f"ratio_vs_{r}" for r in refs], "ratio_tcp_vs_mpi_tcp"])
            w.writerows(rrows)

        if colls_c:
            print_targets(get, ranks_c, [c for c in colls_c if c in COLLS], memmed)
            anchor_report(get, anchors, astatus, askip, ranks_c, colls_c)
        if wcolls:
            window_report(get, wcolls, impls, osc)
        if not a.no_dtypes and "ours-c" in impls and any(c in DT_COLLS for c in colls_c):
            kernel_report(tools)
        if not a.no_plot:
            plot(med, memmed, ranks, colls, impls + aimpls)
    if colls:
        timing_report(time.time() - t_start)
        placement_report()
    if load_impls:
        def measure8(impl, n):
            return measure(impl, "all_reduce", n, tools, [(8, 8)], place=False)[8][0]
        failures += bench_load.run_load(measure8, run_cmd, tools, OUT, a.runs, load_impls, load_ranks, log,
                                        BUILD, ROOT)
    if colls_c or load_impls:
        bench_targets.print_issue16(OUT)
    for f in failures:
        log("bench: failed: " + f.splitlines()[0])
    for f in afailures:
        log("bench: anchor failed (left out of its points): " + f.splitlines()[0])
    log(f"bench: results in {OUT} ({time.time() - t_start:.0f} s)")
    return 1 if failures else 0


def more_runs(raw, runs, more, tools, anchors, ranks, colls, impls, failures, afailures, t_start):
    """Close calls: the points the runs so far leave within
    bench_targets.CLOSE of their target (bench_targets.contested) get `more`
    further runs of the implementations that decide them, interleaved as
    the runs were, at those sizes only; their medians are then over
    runs + more launches (median.csv's runs column says which)."""
    med = median_table(raw)

    def get(impl, n, coll, size, col=1):
        v = med.get((impl, n, coll, size))
        return v[col] if v else None

    groups = {k: v for k, v in bench_targets.contested(get, anchors, ranks).items()
              if k[1] in colls}
    if not groups:
        log("bench: no close calls: no further runs")
        return
    log(f"bench: close calls (within {bench_targets.CLOSE}x of a target): {more} more run(s) of " +
        "; ".join(f"n={n} {c} {','.join(i)} at {','.join(fmt_size(s) for s in ss)}"
                  for (n, c), (i, ss) in sorted(groups.items())))
    for run in range(runs + 1, runs + more + 1):
        RUN_NOW[0] = run
        for (n, coll), (group, sizes) in sorted(groups.items()):
            big = [s for s in sizes if s > 8]
            ranges = ([(8, 8)] if 8 in sizes else []) + ([(big[0], big[-1])] if big else [])
            for impl in group:
                if impl not in impls and not BA.split_impl(impl):
                    continue
                rows = measure_or_report(impl, coll, n, tools, ranges, run, failures, afailures)
                put_rows(raw, run, impl, n, coll, rows, sizes)
        log(f"bench: close calls, run {run}/{runs + more} done ({time.time() - t_start:.0f} s)")


def anchor_report(get, anchors, astatus, askip, ranks, colls):
    """One ratio table per anchor (bench/results/ratios_<anchor>.csv)."""
    for a, why in astatus.items():
        if why is not None:
            print(f"\n# anchor {a} ({BA.LABEL[a]}): SKIPPED, {why}")
    if not anchors:
        return
    print(f"\n# anchors ({', '.join(anchors)}); medians over runs. Every ratio is "
          "busbw(ours) / busbw(anchor) at the same point, which is time(anchor) / time(ours) "
          "(the same size and busbw factor on both sides), so > 1: we are faster, for the "
          "latency rows (8 B, send_recv) as for the bandwidth rows.")
    print("#   ours/best = ours-c over the best (highest busbw) anchor in shared memory at that point; "
          "tcp/best = ours-tcp over the best anchor with TCP. Runs of a busy-polling anchor "
          f"({', '.join(sorted(BA.BUSY_POLL))}) with more ranks than cores ({BA.ncpu()}) are "
          "OVERSUBSCRIBED, collapse to time slices and are left out of best (and not run unless "
          "BENCH_OVERSUB=1).")

    def f(x, w, p=2):
        return f" {x:>{w}.{p}f}" if x is not None else f" {'-':>{w}}"

    for a in anchors:
        at = a + "-tcp"
        print(f"\n# anchor {a}: {BA.LABEL[a]}; '{a}' shared memory, '{at}' TCP (run_anchor.sh {a} ... [tcp])")
        for (x, coll, n), why in sorted(askip.items()):
            if x == a:
                print(f"#   not measured: {coll} at {n} ranks: {why}")
        print(f"{'ours/best':>9} {'best':<10}{'ranks':>5} {'collective':<15}{'size':>6} {'ours us':>9} "
              f"{(a + ' us'):>12} {('x ' + a):>10} {'tcp us':>9} {(at + ' us'):>14} {('tcp x ' + at):>14} "
              f"{'tcp/best':>9} note")
        rows = []
        for n in ranks:
            for coll in colls:
                for size in SIZES:
                    ours, ot = get("ours-c", n, coll, size), get("ours-c", n, coll, size, 0)
                    tcp, tt = get("ours-tcp", n, coll, size), get("ours-tcp", n, coll, size, 0)
                    if ours is None and tcp is None:
                        continue
                    bb, bi = BA.best(get, anchors, n, coll, size, False)
                    tb, _ = BA.best(get, anchors, n, coll, size, True)
                    am, amt = get(a, n, coll, size), get(a, n, coll, size, 0)
                    atb, att = get(at, n, coll, size), get(at, n, coll, size, 0)
                    note = ";".join(x for x in (
                        "OVERSUBSCRIBED" if (a, n) in OVERSUB_SEEN or (at, n) in OVERSUB_SEEN else "",
                        "not best: collapsing" if BA.collapsing(a, n) and am is not None else "") if x)
                    row = [ratio(ours, bb), bi, n, coll, size, ot, amt, ratio(ours, am), tt, att,
                           ratio(tcp, atb), ratio(tcp, tb), note]
                    rows.append(row)
                    print(f"{f(row[0], 9)[1:]} {(bi or '-'):<10}{n:>5} {coll:<15}{fmt_size(size):>6}"
                          f"{f(ot, 9)}{f(amt, 12)}{f(row[7], 10)}{f(tt, 9)}{f(att, 14)}{f(row[10], 14)}"
                          f"{f(row[11], 9)} {note}")
        with open(os.path.join(OUT, f"ratios_{a}.csv"), "w", newline="") as fh:
            w = csv.writer(fh)
            w.writerow(["ours_over_best_anchor", "best_anchor", "ranks", "collective", "size", "ours_time_us",
                        f"{a}_time_us", f"ratio_vs_{a}", "ours_tcp_time_us", f"{at}_time_us",
                        f"ratio_tcp_vs_{at}", "ours_tcp_over_best_tcp_anchor", "note"])
            w.writerows(rows)


def print_targets(get, ranks, colls, memmed):
    print("\n# targets (issue 4), 2 ranks unless said; medians over runs")
    out = []

    def target(name, ok, detail):
        out.append(ok)
        print(f"  [{'PASS' if ok else 'MISS' if ok is not None else 'N/A '}] {name}: {detail}")

    def worst(n, impl_ref, cs, sizes, want):
        """Smallest ratio busbw(ours-c)/busbw(ref) over (coll, size); want: threshold."""
        worst_r, where = None, None
        for c in cs:
            for s in sizes:
                r = ratio(get("ours-c", n, c, s), get(impl_ref, n, c, s))
                if r is not None and (worst_r is None or r < worst_r):
                    worst_r, where = r, f"{c} {fmt_size(s)}"
        if worst_r is None:
            return None, "not measured"
        return worst_r >= want, f"lowest ratio {worst_r:.2f} at {where} (want >= {want})"

    if 2 in ranks and "all_reduce" in colls:
        o, m = get("ours-c", 2, "all_reduce", 8, 0), get("mpi-shm", 2, "all_reduce", 8, 0)
        target("all_reduce 8 B latency <= Open MPI shm", None if m is None or o is None else o <= m,
               f"ours {o} us, MPI {m} us")
    if 2 in ranks:
        target("busbw >= Open MPI shm, every size, 5 collectives", *worst(2, "mpi-shm", colls, SIZES, 1.0))
        target(">= 20x Gloo at every size <= 64 KiB", *worst(2, "gloo", colls, [s for s in SIZES if s <= 64 << 10], 20.0))
        target(">= 3x Gloo at every size >= 1 MiB", *worst(2, "gloo", colls, [s for s in SIZES if s >= 1 << 20], 3.0))
        o, mc = get("ours-c", 2, "all_reduce", 64 << 20), memmed.get(64 << 20)
        target("all_reduce 64 MiB busbw >= 40% of memcpy", None if o is None or mc is None else o >= 0.4 * mc,
               f"ours {o} GB/s, memcpy {mc} GB/s" + (f" ({100 * o / mc:.0f}%)" if o and mc else ""))
        o, m = get("ours-tcp", 2, "all_reduce", 8, 0), get("mpi-tcp", 2, "all_reduce", 8, 0)
        target("TCP forced: all_reduce 8 B latency <= Open MPI TCP", None if m is None or o is None else o <= m,
               f"ours {o} us, MPI {m} us")
        o, m = get("ours-tcp", 2, "all_reduce", 64 << 20), get("mpi-tcp", 2, "all_reduce", 64 << 20)
        target("TCP forced: all_reduce 64 MiB busbw >= 0.8x Open MPI TCP",
               None if m is None or o is None else o >= 0.8 * m, f"ours {o} GB/s, MPI {m} GB/s")
    if 4 in ranks:
        target("4 ranks: busbw >= Open MPI shm at every size >= 64 KiB",
               *worst(4, "mpi-shm", colls, [s for s in SIZES if s >= 64 << 10], 1.0))
    return out


def window_report(get, wcolls, impls, osc):
    """The put/get ratio table (bench/results/ratios_window.csv) and the issue's
    window targets (issue 15), 2 ranks."""
    refs = [i for i in ("mpi-shm", "mpi-oscsm") if i in impls]
    print("\n# one-sided windows, 2 ranks (rank 0 origin, rank 1 target); medians; ratio = "
          "bandwidth(ours-c) / bandwidth(reference), > 1: we are faster; ours-tcp / mpi-tcp last")
    for impl in ("mpi-shm", "mpi-oscsm", "mpi-tcp"):
        if impl in impls:
            print(f"#   {impl}: mpirun {' '.join(MPI_WIN_OPTS[impl]) or '(defaults)'} -> "
                  f"{osc.get(impl, 'not measured')}")
    hdr = f"{'op':<4}{'size':>6} {'ours us':>9} {'ours GB/s':>9}" + "".join(
        f" {(r + ' us'):>13} {('x ' + r):>11}" for r in refs) + f" {'tcp us':>9} {'mpitcp us':>9} {'tcp/mpitcp':>10}"
    print(hdr)
    rows = []
    for op in wcolls:
        for size in SIZES:
            ours, ot = get("ours-c", 2, op, size), get("ours-c", 2, op, size, 0)
            if ours is None:
                continue
            rs = [(get(r, 2, op, size, 0), ratio(ours, get(r, 2, op, size))) for r in refs]
            tt, mt = get("ours-tcp", 2, op, size, 0), get("mpi-tcp", 2, op, size, 0)
            tr = ratio(get("ours-tcp", 2, op, size), get("mpi-tcp", 2, op, size))
            rows.append([op, size, ot, ours, *[x for pair in rs for x in pair], tt, mt, tr])

            def f(x, w, p=2):
                return f" {x:>{w}.{p}f}" if x is not None else f" {'-':>{w}}"
            print(f"{op:<4}{fmt_size(size):>6}{f(ot, 9)}{f(ours, 9, 3)}" +
                  "".join(f"{f(t, 13)}{f(r, 11)}" for t, r in rs) + f"{f(tt, 9)}{f(mt, 9)}{f(tr, 10)}")
    with open(os.path.join(OUT, "ratios_window.csv"), "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["op", "size", "ours_time_us", "ours_GBps",
                    *[x for r in refs for x in (f"{r}_time_us", f"ratio_vs_{r}")],
                    "ours_tcp_time_us", "mpi_tcp_time_us", "ratio_tcp_vs_mpi_tcp"])
        w.writerows(rows)

    print("\n# targets (issue 15), 2 ranks, shared memory; medians over runs; MPI = Open MPI's "
          "default osc component (mpi-shm)")

    def target(name, ok, detail):
        print(f"  [{'PASS' if ok else 'MISS' if ok is not None else 'N/A '}] {name}: {detail}")

    def lat(ref):
        o, m = get("ours-c", 2, "put", 8, 0), get(ref, 2, "put", 8, 0)
        return (None if o is None or m is None else o <= m), f"ours {o} us, {ref} {m} us"

    def bw(ref):
        worst_r, where = None, None
        for op in wcolls:
            for s in SIZES:
                if s < 64 << 10:
                    continue
                r = ratio(get("ours-c", 2, op, s), get(ref, 2, op, s))
                if r is not None and (worst_r is None or r < worst_r):
                    worst_r, where = r, f"{op} {fmt_size(s)}"
        if worst_r is None:
            return None, "not measured"
        return worst_r >= 1.0, f"lowest ratio {worst_r:.2f} at {where} (want >= 1)"

    if "put" in wcolls:
        target("put latency <= MPI_Put's at 8 B (shm)", *lat("mpi-shm"))
    target(f"{' and '.join(wcolls)} bandwidth >= MPI's at every size >= 64 KiB (shm)", *bw("mpi-shm"))
    if "mpi-oscsm" in impls:
        print("# for reference, against Open MPI's osc sm (not the issue's target):")
        if "put" in wcolls:
            target("put latency <= MPI_Put's (osc sm) at 8 B", *lat("mpi-oscsm"))
        target(f"{' and '.join(wcolls)} bandwidth >= MPI's (osc sm) at every size >= 64 KiB", *bw("mpi-oscsm"))


def plot(med, memmed, ranks, colls, impls):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log("bench: matplotlib is not installed: no plot (make bench installs it into .venv)")
        return
    for n in ranks:
        ncolls = [c for c in colls if any(nn == n and cc == c for (_, nn, cc, _) in med)]
        if not ncolls:
            continue
        fig, axes = plt.subplots(1, len(ncolls), figsize=(4.2 * len(ncolls), 4), squeeze=False)
        colour = {}
        for ax, coll in zip(axes[0], ncolls):
            for impl in impls:
                pts = sorted((s, v[1]) for (i, nn, c, s), v in med.items() if i == impl and nn == n and c == coll)
                if pts:
                    # one colour per library, TCP dashed; ours thick
                    base = "ours" if impl in ("ours-c", "ours-tcp") else impl[:-4] if impl.endswith("-tcp") \
                        else "mpi" if impl == "mpi-shm" else impl
                    ax.plot([p[0] for p in pts], [max(p[1], 1e-7) for p in pts], marker=".", label=impl,
                            color=colour.setdefault(base, f"C{len(colour) % 10}"),
                            linestyle="--" if impl.endswith("-tcp") else "-",
                            linewidth=2.2 if base == "ours" else 1.0)
            if memmed:
                pts = sorted(memmed.items())
                ax.plot([p[0] for p in pts], [p[1] for p in pts], "k:", label="memcpy")
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_title(f"{coll}, {n} ranks")
            ax.set_xlabel("size (bytes)")
            ax.set_ylabel("busbw (GB/s)")
            ax.grid(True, which="both", alpha=0.3)
        axes[0][0].legend(fontsize=7)
        fig.tight_layout()
        path = os.path.join(OUT, f"busbw_{n}ranks.png")
        fig.savefig(path, dpi=90)
        plt.close(fig)
        log(f"bench: wrote {path}")


if __name__ == "__main__":
    sys.exit(main())
