"""make bench-load (bench/run_bench.py --load): issue 16, point 3, steady
under load, and the idle CPU cost of a blocking wait. See docs/benchmarks.md.

For each run (--runs; interleaved: every run measures every implementation
quiet, then every one loaded):

  quiet   8 B all_reduce at 2, 4 and 8 ranks (--load-ranks) for ours-c
          (tcperf), ompi (Open MPI 5, run_anchor.sh) and mpi-shm (Debian's
          Open MPI, mpi_perf.c); 1000 timed iterations after 5 warm-ups,
          time per call = the maximum over ranks, as everywhere in make bench
  loaded  the same with a CPU hog on every core: one process per core
          (ncpu: the cores this process may run on) running a pure-Python
          busy loop at normal priority (stress-ng --cpu N if installed and
          BENCH_HOG=stress-ng), started before and killed after the loaded
          block, always (also on Ctrl-C, an exception or SIGTERM; each hog
          also dies with its parent through PR_SET_PDEATHSIG)
  idle    bench/idle_cost.c at 2 ranks, quiet: one all_reduce, then rank 0
          sleeps 2 s before a barrier the others wait in; the CPU time
          (getrusage: user + sys, all threads) each waiting rank burnt, for
          ours, Open MPI 5 and Debian's Open MPI (MPI_Barrier)

Each point is measured REPEAT times per condition and run (BENCH_LOAD_REPEAT,
default 3: one launch times only ~1 ms, less than a scheduler slice).
Writes load_raw.csv (run, repeat, impl, ranks, condition, time_us), load.csv
(medians over runs x repeats; its runs column counts the samples), idle_raw.csv and idle.csv (medians per impl and rank); the
targets are printed by bench/bench_targets.py (point 3).
"""
import csv
import ctypes
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time

import bench_anchors as BA

LOAD_IMPLS = ["ours-c", "ompi", "mpi-shm"]
LOAD_RANKS = [2, 4, 8]
IDLE_S = 2.0
# launches per point, condition and run: 1000 calls of an 8 B all_reduce take
# about a millisecond, less than a scheduler time slice, so one launch can
# land in a slice where both ranks run and look unloaded; the median over
# several launches (and runs) is steadier. BENCH_LOAD_REPEAT overrides.
REPEAT = int(os.environ.get("BENCH_LOAD_REPEAT", "3"))


class Hog:
    """A CPU hog on every core while in the with-block; killed on exit."""

    def __init__(self, ncpu=None, log=None):
        self.n = ncpu or BA.ncpu()
        self.procs = []
        self.log = log or (lambda *a: None)

    @staticmethod
    def _die_with_parent():
        try:
            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass

    def start(self):
        if os.environ.get("BENCH_HOG") == "stress-ng" and shutil.which("stress-ng"):
            cmds = [["stress-ng", "--cpu", str(self.n), "--quiet"]]
        else:
            cmds = [[sys.executable, "-c", "while True: pass"] for _ in range(self.n)]
        for c in cmds:
            self.procs.append(subprocess.Popen(c, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                               stderr=subprocess.DEVNULL, preexec_fn=self._die_with_parent,
                                               start_new_session=True))
        time.sleep(0.5)  # let the hogs reach the run queue
        self.log(f"bench: load: {len(cmds)} hog process(es) on {self.n} core(s): "
                 f"pids {' '.join(str(p.pid) for p in self.procs)}")

    def stop(self):
        for p in self.procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)  # its own session: stress-ng's workers too
                except ProcessLookupError:
                    pass
        for p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.log(f"bench: load: hog {p.pid} did not exit")
        self.procs = []

    def __enter__(self):
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc):
        self.stop()
        return False


def _sigterm(signum, frame):
    raise SystemExit(128 + signum)  # unwinds through Hog.__exit__


def build_idle(build_dir, root, log):
    """{impl: (env, argv prefix)} for idle_cost at 2 ranks; impls that cannot be
    built are left out with a message."""
    src = os.path.join(root, "bench", "idle_cost.c")
    out = {}
    exe = os.path.join(build_dir, "bench", "idle_cost")
    p = subprocess.run(["cc", "-O2", f"-I{os.path.join(root, 'include')}", "-o", exe, src,
                        f"-L{build_dir}", "-ltorchcomms", f"-Wl,-rpath,{build_dir}"], capture_output=True, text=True)
    if p.returncode == 0:
        out["ours-c"] = ({}, [os.path.join(build_dir, "tcrun"), "-n", "2", exe])
    else:
        log(f"bench: idle_cost (ours) does not build: {p.stderr.strip()[-300:]}")
    ompi_cc = os.path.join(BA.cache(), BA.PREFIX["ompi"], "bin", "mpicc")
    if os.access(ompi_cc, os.X_OK):
        exe = os.path.join(build_dir, "bench", "idle_cost_ompi")
        p = subprocess.run([ompi_cc, "-O2", "-DIDLE_MPI", "-o", exe, src], capture_output=True, text=True)
        if p.returncode == 0:
            out["ompi"] = BA.launch_cmd("ompi", exe, 2, [])
        else:
            log(f"bench: idle_cost (Open MPI 5) does not build: {p.stderr.strip()[-300:]}")
    if shutil.which("mpicc") and shutil.which("mpirun"):
        exe = os.path.join(build_dir, "bench", "idle_cost_mpi")
        p = subprocess.run(["mpicc", "-O2", "-DIDLE_MPI", "-o", exe, src], capture_output=True, text=True)
        if p.returncode == 0:
            out["mpi-shm"] = ({}, ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "2", exe])
    return out


def parse_idle(text):
    """[(rank, wall_s, user_s, sys_s, cpu_pct or None)] from idle_cost's output."""
    rows = []
    for line in text.splitlines():
        f = line.split()
        if len(f) == 5 and f[0].isdigit():
            rows.append((int(f[0]), float(f[1]), float(f[2]), float(f[3]), None if f[4] == "-" else float(f[4])))
    return rows


def run_load(measure8, run_cmd, tools, out_dir, runs, impls, ranks, log, build_dir, root):
    """The load part: measure8(impl, n) -> time_us of one 8 B all_reduce row
    (run_bench.py's measure); run_cmd(argv, env) -> (stdout, secs). Writes the
    CSVs into out_dir; returns a list of failures (strings)."""
    raw, idle_raw, failures = [], [], []
    idle = build_idle(build_dir, root, log)
    old = signal.signal(signal.SIGTERM, _sigterm)
    t0 = time.time()
    try:
        for run in range(1, runs + 1):
            for cond in ("quiet", "loaded"):
                hog = Hog(log=log) if cond == "loaded" else None
                if hog:
                    hog.__enter__()
                try:
                    for n in ranks:
                        for rep in range(1, REPEAT + 1):
                            for impl in impls:
                                try:
                                    t = measure8(impl, n)
                                except (RuntimeError, subprocess.TimeoutExpired) as e:
                                    failures.append(f"load run {run} {impl} n={n} {cond}: {e}")
                                    log(f"bench: load: FAILED {impl} n={n} {cond}: {str(e)[-600:]}")
                                    continue
                                raw.append([run, rep, impl, n, cond, t])
                                log(f"bench: load run {run}/{runs}.{rep} {cond:<6} {impl:<8} n={n}: {t:.2f} us "
                                    f"({time.time() - t0:.0f} s)")
                finally:
                    if hog:
                        hog.__exit__(None, None, None)
            for impl, (env, cmd) in idle.items():
                try:
                    out, _ = run_cmd([*cmd, str(IDLE_S)], env)
                except (RuntimeError, subprocess.TimeoutExpired) as e:
                    failures.append(f"idle run {run} {impl}: {e}")
                    log(f"bench: idle: FAILED {impl}: {str(e)[:300]}")
                    continue
                for rank, wall, user, sys_, pct in parse_idle(out):
                    idle_raw.append([run, impl, 2, rank, wall, user, sys_, pct])
                    if pct is not None:
                        log(f"bench: idle run {run}/{runs} {impl:<8} rank {rank}: waited {wall:.2f} s, "
                            f"CPU {user + sys_:.3f} s ({pct:.1f}%)")
    finally:
        signal.signal(signal.SIGTERM, old)
    with open(os.path.join(out_dir, "load_raw.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["run", "repeat", "impl", "ranks", "condition", "time_us"])
        w.writerows(raw)
    groups = {}
    for run, rep, impl, n, cond, t in raw:
        groups.setdefault((impl, n, cond), []).append(t)
    with open(os.path.join(out_dir, "load.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["impl", "ranks", "condition", "time_us", "runs"])
        for (impl, n, cond), ts in sorted(groups.items()):
            w.writerow([impl, n, cond, statistics.median(ts), len(ts)])
    with open(os.path.join(out_dir, "idle_raw.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["run", "impl", "ranks", "rank", "wall_s", "user_s", "sys_s", "cpu_pct"])
        w.writerows([[*r[:7], "" if r[7] is None else r[7]] for r in idle_raw])
    ig = {}
    for run, impl, n, rank, wall, user, sys_, pct in idle_raw:
        ig.setdefault((impl, n, rank), []).append((wall, user, sys_, pct))
    with open(os.path.join(out_dir, "idle.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["impl", "ranks", "rank", "wall_s", "user_s", "sys_s", "cpu_pct", "runs"])
        for (impl, n, rank), v in sorted(ig.items()):
            pcts = [x[3] for x in v if x[3] is not None]
            w.writerow([impl, n, rank, *(statistics.median(x[k] for x in v) for k in range(3)),
                        statistics.median(pcts) if pcts else "", len(v)])
    log(f"bench: load part done ({time.time() - t0:.0f} s)")
    return failures
