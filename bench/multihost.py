#!/usr/bin/env python3
"""multihost.py -- make bench-multihost: collectives across emulated hosts
(issue 17, point 5), our cpu backend against Open MPI, side by side.

    python3 bench/multihost.py [--layouts 2,2:2,2,2,2] [--colls all_reduce,all_gather]
                               [--min 8] [--max 64M] [--runs 3] [--impls hier,flat,mpi[,mpi-sm]]
                               [--mpi auto|debian|ompi5|none] [--rate 10gbit] [--out bench/results]

For each layout (ranks per emulated host; default 2 hosts x 2 ranks, then
4 hosts x 2 ranks) it brings up a bed of tests/multihost/bed.sh (network +
UTS namespaces on a bridge, links shaped by tc) and, in each of --runs runs,
for each collective, measures every implementation over the sizes 8 B and
16 B .. --max in x4 steps (so 1 MiB and 64 MiB are exact points), the
implementations' order rotated from run to run (interleaved, so drift hits
all alike):

  hier  build/tcperf under one build/tcrun per host (tcrun --nnodes H
        --node-rank i --master-addr 10.77.0.1), TORCHCOMMS_CPU_HIER=1: the
        hierarchical algorithms (shared memory inside a host, TCP between
        hosts), where the library has them
  flat  the same with TORCHCOMMS_CPU_HIER=0: flat algorithms, TCP between
        every pair
  mpi   ../shared/bench/mpi_perf.c under mpirun across the same namespaces:
        a hostfile of the hosts' addresses (10.77.0.<i+1> slots=<ranks>),
        bench/mh_rsh.sh as plm_rsh_agent (it runs Open MPI's daemon in host
        i's namespaces), --mca pml ob1 --mca btl tcp,self --mca
        btl_tcp_if_include 10.77.0.0/24 (TCP between every pair, like flat).
        --mpi debian: Debian's Open MPI (mpirun, mpicc; the default when
        installed); ompi5: Open MPI 5.0.11 from the PyPI wheel, installed and
        built by ../shared/bench/anchors/run_anchor.sh into $ANCHOR_CACHE.
  mpi-sm (only with --impls ...,mpi-sm) the same with btl self,vader,tcp (Open
        MPI 5: self,sm,tcp): shared memory between the ranks of a host, the
        MPI counterpart of hier

Iterations follow the anchors' rule for all (1000 below 64 KiB, 100 below
4 MiB, 10 from 4 MiB; 5 warm-ups; time = max over ranks). When a layout has
more ranks than this machine has cores, the ranks would busy-poll each
other off the cores (each emulated host believes it has the machine's
cores): ours then get TORCHCOMMS_CPU_SPIN_US=0 (unless set) and Open MPI
--mca mpi_yield_when_idle 1; the report says so.

Writes <out>/multihost_raw.csv (every measurement), <out>/multihost.csv
(medians over runs) and <out>/multihost.md (one table per layout and
collective: time and busbw of hier, flat and MPI, and time ratios), and
prints the tables. Needs root (network namespaces): without it, or when the
bed cannot run here, it prints "SKIP: <why>" and exits 0. Exit status 1
when a measurement failed (the others are kept). Python 3 standard library
only.
"""
import argparse
import csv
import datetime
import os
import platform
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from run_bench import busbw, fmt_size, parse_times  # noqa: E402  (nccl-tests columns, ours and MPI's)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BED = os.path.join(ROOT, "tests", "multihost", "bed.sh")
RSH = os.path.join(ROOT, "bench", "mh_rsh.sh")
ANCHORS = os.path.normpath(os.environ.get("TC_BENCH_ANCHORS", os.path.join(ROOT, "..", "shared", "bench")))
NET = "10.77.0"
MPI_NAME = {"all_reduce": "allreduce", "all_gather": "allgather", "reduce_scatter": "reduce_scatter",
            "broadcast": "bcast", "all_to_all": "alltoall"}
IMPLS = ["hier", "flat", "mpi", "mpi-sm"]
LABEL = {"hier": "hier", "flat": "flat", "mpi": "MPI", "mpi-sm": "MPI-sm"}
CHILDREN = []  # Popen objects running now (each its own process group)


def log(*a):
    print("multihost:", *a, file=sys.stderr, flush=True)


def parse_bytes(s):
    m = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(s[-1:].upper(), 1)
    return int(s[:-1] if m > 1 else s) * m


def sizes_between(lo, hi):
    """8 B and 16 B x 4^k within [lo, hi] (the sizes of make bench)."""
    return [s for s in [8] + [16 * 4 ** k for k in range(16)] if lo <= s <= hi]


def ranges_of(sizes):
    """(min, max) launches covering sizes with x4 steps: 8 alone, 16.. the rest."""
    r = []
    if 8 in sizes:
        r.append((8, 8))
    rest = [s for s in sizes if s != 8]
    if rest:
        r.append((rest[0], rest[-1]))
    return r


def kill_group(p):
    try:
        os.killpg(p.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        p.wait(timeout=5)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        p.wait()


def run_parallel(cmds, env, timeout):
    """Runs the commands at once, each in its own process group; returns
    (status of each, stdout+stderr of each). On a failure or the timeout the
    others are stopped."""
    outs, procs = [], []
    try:
        for c in cmds:
            f = tempfile.TemporaryFile(mode="w+")
            outs.append(f)
            p = subprocess.Popen(c, env=env, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
            procs.append(p)
            CHILDREN.append(p)
        deadline = time.monotonic() + timeout
        live = list(procs)
        failed = False
        while live:
            for p in list(live):
                if p.poll() is not None:
                    live.remove(p)
                    failed = failed or p.returncode != 0
            if live and (failed or time.monotonic() > deadline):
                if not failed:
                    log(f"timeout after {timeout} s: stopping {len(live)} process group(s)")
                for p in live:
                    kill_group(p)
                live = []
            if live:
                try:
                    live[0].wait(timeout=0.05)
                except subprocess.TimeoutExpired:
                    pass
        texts = []
        for f in outs:
            f.seek(0)
            texts.append(f.read())
        return [p.returncode for p in procs], texts
    finally:
        for p in procs:
            if p.poll() is None:
                kill_group(p)
            if p in CHILDREN:
                CHILDREN.remove(p)
        for f in outs:
            f.close()


class Bench:
    def __init__(self, a):
        self.a = a
        self.build = os.path.abspath(a.build)
        self.port = 29700
        self.bed = None
        self.raw = {}  # (run, layout, impl, coll, size) -> (time_us, busbw)
        self.failures = []  # (layout, run, impl, coll, what)
        self.shaping = {}  # layout -> bed.sh's shaping line
        self.oversub = {}  # layout -> bool
        self.probe = {}  # (layout, impl) -> what rank 0 logged about the hierarchy

    # --- the bed -------------------------------------------------------
    def clean_stale_beds(self):
        """Removes beds of earlier runs of this script that were killed (id mhb<pid>, pid gone)."""
        out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        ids = set()
        for line in out.splitlines():
            name = line.split()[0] if line.split() else ""
            if name.startswith("tcmh-mhb") and "-" in name[5:]:
                ids.add(name[5:].split("-")[0])
        for bid in ids:
            pid = bid[3:]
            alive = False
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    alive = b"multihost.py" in f.read()
            except OSError:
                pass
            if pid.isdigit() and not alive:
                log(f"removing bed {bid}, left by run {pid} (gone)")
                subprocess.run([BED, "down", "--id", bid])

    def bed_up(self, layout):
        self.bed = f"mhb{os.getpid()}"
        p = subprocess.run([BED, "up", "--id", self.bed, "--layout", layout, "--rate", self.a.rate],
                           capture_output=True, text=True, env=dict(os.environ, BUILD=self.build))
        if p.returncode != 0:
            self.bed_down()
            sys.exit(f"multihost: bed.sh up --layout {layout} failed ({p.returncode}):\n{p.stdout}{p.stderr}")
        line = [x for x in p.stderr.splitlines() if "link shaping" in x]
        self.shaping[layout] = line[-1].split("link shaping: ", 1)[1] if line else "?"
        log(f"layout {layout}: bed {self.bed} up; link shaping: {self.shaping[layout]}")

    def bed_down(self):
        if self.bed:
            subprocess.run([BED, "down", "--id", self.bed])
            self.bed = None

    # --- the implementations -------------------------------------------
    def next_port(self):
        self.port += 1
        if self.port > 29999:
            self.port = 29701
        return self.port

    def run_ours(self, impl, layout, coll, lo, hi, extra_env=None, iters="0", warmup="5"):
        n = [int(x) for x in layout.split(",")]
        env = dict(os.environ, TORCHCOMMS_CPU_HIER="1" if impl == "hier" else "0", OMP_NUM_THREADS="1")
        env.update(extra_env or {})
        if self.oversub[layout]:
            env.setdefault("TORCHCOMMS_CPU_SPIN_US", "0")
        env.setdefault("TORCHCOMM_TIMEOUT_SECONDS", str(self.a.timeout))
        port = self.next_port()
        cmds = []
        for i, r in enumerate(n):
            cmds.append([BED, "exec", "--id", self.bed, str(i), "--",
                         os.path.join(self.build, "tcrun"), "--nnodes", str(len(n)), "--node-rank", str(i),
                         "--master-addr", f"{NET}.1", "--port", str(port), "--join-timeout", "60",
                         "--timeout", str(self.a.timeout + 30), "-n", str(r), "--",
                         os.path.join(self.build, "tcperf"), "-c", coll, "-b", str(lo), "-e", str(hi),
                         "-f", "4", "-n", iters, "-w", warmup, "-t", str(self.a.timeout)])
        st, texts = run_parallel(cmds, env, self.a.timeout + 60)
        if any(st):
            bad = next(i for i, s in enumerate(st) if s)
            raise RuntimeError(f"host {bad} exited {st[bad]}:\n" + texts[bad][-1500:])
        return texts[0]

    def run_mpi(self, impl, layout, coll, lo, hi):
        n = [int(x) for x in layout.split(",")]
        hostfile = os.path.join(self.tmp, f"hosts_{layout.replace(',', '_')}")
        with open(hostfile, "w") as f:
            for i, r in enumerate(n):
                f.write(f"{NET}.{i + 1} slots={r}\n")
        cmd = [BED, "exec", "--id", self.bed, "0", "--", self.mpirun, *self.mpi_extra,
               "--allow-run-as-root", "--hostfile", hostfile, "-np", str(sum(n)),
               "--mca", "plm_rsh_agent", RSH, "--mca", "pml", "ob1",
               "--mca", "btl", "tcp,self" if impl == "mpi" else f"self,{self.mpi_sm},tcp",
               "--mca", "btl_tcp_if_include", f"{NET}.0/24", "--mca", "oob_tcp_if_include", f"{NET}.0/24"]
        if self.oversub[layout]:
            cmd += ["--mca", "mpi_yield_when_idle", "1"]
        cmd += [self.mpi_perf, MPI_NAME[coll], str(lo), str(hi)]
        env = dict(os.environ, MH_BED_ID=self.bed, OMP_NUM_THREADS="1")
        st, texts = run_parallel([cmd], env, self.a.timeout + 60)
        if st[0]:
            raise RuntimeError(f"mpirun exited {st[0]}:\n" + texts[0][-1500:])
        return texts[0]

    def probe_hier(self, layout):
        """What hier and flat run on this bed: rank 0's init line
        "hierarchical: H hosts, ..." (TORCHCOMMS_LOG=info), or its absence."""
        for impl in ("hier", "flat"):
            if impl not in self.impls:
                continue
            try:
                out = self.run_ours(impl, layout, "all_reduce", 8, 8, iters="1", warmup="0",
                                    extra_env={"TORCHCOMMS_LOG": "info", "TORCHCOMMS_LOG_SUBSYS": "init"})
            except RuntimeError as e:
                self.probe[(layout, impl)] = f"probe failed: {str(e).splitlines()[0]}"
                continue
            m = re.search(r"\[rank 0 [^]]*\] init: communicator [^:]*: (hierarchical: [^;]*)", out)
            self.probe[(layout, impl)] = m.group(1) if m else "flat (no 'hierarchical:' line)"
            want = impl == "hier"
            if bool(m) != want:
                self.failures.append((layout, 0, impl, "probe", f"TORCHCOMMS_CPU_HIER={int(want)} ran "
                                      f"{'hierarchical' if m else 'flat'}: {self.probe[(layout, impl)]}"))
            log(f"layout {layout}: {impl}: {self.probe[(layout, impl)]}")

    def measure(self, run, layout, impl, coll, sizes):
        n = sum(int(x) for x in layout.split(","))
        for lo, hi in ranges_of(sizes):
            want = [s for s in sizes if lo <= s <= hi]
            time.sleep(self.a.settle)  # the last job's processes may still be exiting
            t0 = time.monotonic()
            try:
                out = self.run_mpi(impl, layout, coll, lo, hi) if impl.startswith("mpi") else \
                    self.run_ours(impl, layout, coll, lo, hi)
                times = parse_times(out)
                if len(times) != len(want):
                    raise RuntimeError(f"expected {len(want)} rows, got {len(times)}:\n{out[-1500:]}")
            except RuntimeError as e:
                log(f"FAIL run {run} layout {layout} {impl} {coll} {lo}..{hi}: {e}")
                self.failures.append((layout, run, impl, coll, f"{lo}..{hi}: {str(e).splitlines()[0]}"))
                continue
            for s, t in zip(want, times):
                self.raw[(run, layout, impl, coll, s)] = (t, busbw(coll, n, s, t))
            log(f"run {run} layout {layout} {impl:4} {coll} {fmt_size(lo)}..{fmt_size(hi)}: "
                f"{time.monotonic() - t0:.1f} s; {fmt_size(want[0])} {times[0]:.1f} us, "
                f"{fmt_size(want[-1])} {times[-1]:.1f} us")

    # --- setup ------------------------------------------------------------
    def setup_mpi(self):
        """Picks the MPI and builds mpi_perf with it; sets self.mpirun, self.mpi_perf, self.mpi_label."""
        kind = self.a.mpi
        if kind == "auto":
            kind = "debian" if shutil.which("mpirun") and shutil.which("mpicc") else "ompi5"
        self.mpi_extra = []
        src = os.path.join(ANCHORS, "mpi_perf.c")
        if kind != "none" and not os.path.isfile(src):
            sys.exit(f"multihost: no {src} (../shared beside the checkout, or TC_BENCH_ANCHORS=/path/to/shared/bench)")
        if kind == "debian":
            if not shutil.which("mpirun") or not shutil.which("mpicc"):
                sys.exit("multihost: --mpi debian: no mpirun/mpicc (apt-get install openmpi-bin libopenmpi-dev)")
            self.mpirun = shutil.which("mpirun")
            os.makedirs(os.path.join(self.build, "bench"), exist_ok=True)
            self.mpi_perf = os.path.join(self.build, "bench", "mpi_perf")
            subprocess.run(["mpicc", "-O2", "-o", self.mpi_perf, src], check=True)
            ver = subprocess.run([self.mpirun, "--version"], capture_output=True, text=True).stdout.split("\n")[0]
            self.mpi_label = f"{ver.replace('mpirun (Open MPI)', 'Open MPI').strip()} (Debian)"
            self.mpi_sm = "vader"  # Open MPI 4's shared-memory BTL
        elif kind == "ompi5":
            script = os.path.join(ANCHORS, "anchors", "run_anchor.sh")
            cache = os.environ.get("ANCHOR_CACHE", "/tmp/anchor-cache")
            log(f"installing/building Open MPI 5 with {script} (cache {cache})")
            p = subprocess.run([script, "ompi", "all_reduce", "1", "8", "8"], capture_output=True, text=True)
            if p.returncode != 0:
                sys.exit(f"multihost: {script} failed:\n{p.stdout}{p.stderr}")
            prefix = os.path.join(cache, "openmpi-5.0.11")
            self.mpirun = os.path.join(prefix, "bin", "mpirun")
            self.mpi_perf = os.path.join(cache, "bin", "mpi_perf_ompi")
            self.mpi_extra = ["--prefix", prefix]  # the daemons on the other hosts find prted there
            self.mpi_label = "Open MPI 5.0.11 (PyPI wheel)"
            self.mpi_sm = "sm"
        elif kind == "none":
            self.mpi_label = None
        else:
            sys.exit(f"multihost: --mpi {kind}: want auto, debian, ompi5 or none")

    def main(self):
        a = self.a
        p = subprocess.run([BED, "check"], capture_output=True, text=True)
        if p.returncode == 77:
            why = p.stdout.strip().removeprefix("SKIP: ") or "the multi-host bed cannot run here"
            print(f"SKIP: make bench-multihost: {why}")
            return 0
        if p.returncode != 0:
            sys.exit(f"multihost: bed.sh check failed ({p.returncode}):\n{p.stdout}{p.stderr}")
        for t in ("tcrun", "tcperf"):
            if not os.access(os.path.join(self.build, t), os.X_OK):
                sys.exit(f"multihost: no {os.path.join(self.build, t)}: run `make build` first")
        self.setup_mpi()
        impls = [x for x in a.impls.split(",") if x]
        for x in impls:
            if x not in IMPLS:
                sys.exit(f"multihost: unknown implementation {x} (want {','.join(IMPLS)})")
        if not self.mpi_label:
            impls = [x for x in impls if not x.startswith("mpi")]
        self.impls = impls
        env_help = subprocess.run([os.path.join(self.build, "tcrun"), "--help-env"], capture_output=True,
                                  text=True).stdout
        self.hier_known = "TORCHCOMMS_CPU_HIER" in env_help
        if not self.hier_known:
            log("TORCHCOMMS_CPU_HIER is not a setting of this build (tcrun --help-env): hier runs what flat runs")
        sizes = sizes_between(parse_bytes(a.min), parse_bytes(a.max))
        if not sizes:
            sys.exit(f"multihost: no size between {a.min} and {a.max} (sizes: 8 B, 16 B x 4^k)")
        self.sizes = sizes
        layouts = [x for x in a.layouts.split(":") if x]
        colls = [x for x in a.colls.split(",") if x]
        for c in colls:
            if c not in MPI_NAME:
                sys.exit(f"multihost: unknown collective {c} (want {','.join(MPI_NAME)})")
        self.layouts, self.colls = layouts, colls
        cores = os.cpu_count() or 1
        self.clean_stale_beds()
        self.tmp = tempfile.mkdtemp(prefix="tcmh-bench.")
        t_all = time.monotonic()
        try:
            for layout in layouts:
                self.oversub[layout] = sum(int(x) for x in layout.split(",")) > cores
                self.bed_up(layout)
                try:
                    if self.hier_known:
                        self.probe_hier(layout)
                    for run in range(1, a.runs + 1):
                        for coll in colls:
                            k = (run - 1) % len(impls)
                            for impl in impls[k:] + impls[:k]:  # rotated per run
                                self.measure(run, layout, impl, coll, sizes)
                finally:
                    self.bed_down()
        finally:
            shutil.rmtree(self.tmp, ignore_errors=True)
        self.elapsed = time.monotonic() - t_all
        self.report()
        return 1 if self.failures else 0

    # --- output ---------------------------------------------------------
    def medians(self):
        g = {}
        for (run, layout, impl, coll, size), v in self.raw.items():
            g.setdefault((layout, impl, coll, size), []).append(v)
        return {k: (statistics.median(x[0] for x in v), statistics.median(x[1] for x in v), len(v),
                    min(x[0] for x in v), max(x[0] for x in v)) for k, v in g.items()}

    def report(self):
        a = self.a
        os.makedirs(a.out, exist_ok=True)
        with open(os.path.join(a.out, "multihost_raw.csv"), "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["run", "layout", "hosts", "ranks", "impl", "collective", "size", "time_us", "busbw_GBps"])
            for (run, layout, impl, coll, size), (t, bw) in sorted(self.raw.items()):
                n = [int(x) for x in layout.split(",")]
                w.writerow([run, layout, len(n), sum(n), impl, coll, size, f"{t:.2f}", f"{bw:.6g}"])
        med = self.medians()
        with open(os.path.join(a.out, "multihost.csv"), "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["layout", "hosts", "ranks", "impl", "collective", "size", "time_us_median",
                        "busbw_GBps_median", "runs", "time_us_min", "time_us_max"])
            for (layout, impl, coll, size), (t, bw, k, tmin, tmax) in sorted(med.items()):
                n = [int(x) for x in layout.split(",")]
                w.writerow([layout, len(n), sum(n), impl, coll, size, f"{t:.2f}", f"{bw:.6g}", k,
                            f"{tmin:.2f}", f"{tmax:.2f}"])

        def t_of(layout, impl, coll, s):
            v = med.get((layout, impl, coll, s))
            return v[0] if v else None

        def bw_of(layout, impl, coll, s):
            v = med.get((layout, impl, coll, s))
            return v[1] if v else None

        def f_us(x):
            return "-" if x is None else (f"{x:.0f}" if x >= 100 else f"{x:.1f}")

        def f_bw(x):
            return "-" if x is None else f"{x:.3g}"

        def f_r(x, y):
            return "-" if x is None or not y else f"{x / y:.2f}"

        cores = os.cpu_count()
        L = [f"# Multi-host collectives ({datetime.date.today().isoformat()}, {platform.node()}, {cores} cores)", ""]
        L.append(f"make bench-multihost: `{' '.join(['bench/multihost.py', *sys.argv[1:]])}`; "
                 f"{a.runs} run(s), medians; {self.elapsed:.0f} s in all. Emulated hosts of tests/multihost/bed.sh "
                 f"(network + UTS namespaces on a bridge). Time in microseconds (max over ranks), busbw in GB/s "
                 f"(nccl-tests factors); ratios are of times (< 1: the first is faster).")
        L.append("")
        L.append("- hier: our cpu backend, `TORCHCOMMS_CPU_HIER=1`" +
                 ("" if self.hier_known else " -- **not a setting of this build: hier ran the flat algorithms**"))
        L.append("- flat: our cpu backend, `TORCHCOMMS_CPU_HIER=0` (TCP between every pair)")
        if "mpi" in self.impls or "mpi-sm" in self.impls:
            L.append(f"- MPI: {self.mpi_label}, pml ob1, btl tcp,self (TCP between every pair), `mpi_perf.c` "
                     f"under mpirun across the namespaces (bench/mh_rsh.sh as plm_rsh_agent)")
        if "mpi-sm" in self.impls:
            L.append(f"- MPI-sm: the same with btl self,{self.mpi_sm},tcp (shared memory inside a host)")
        if "mpi" not in self.impls:
            L.append("- MPI: not measured (--mpi none or --impls without mpi)")
        for layout in self.layouts:
            n = [int(x) for x in layout.split(",")]
            L.append(f"- layout {layout}: {len(n)} hosts, {sum(n)} ranks; link shaping: {self.shaping.get(layout)}" +
                     (f"; oversubscribed ({sum(n)} ranks on {cores} cores): ours with TORCHCOMMS_CPU_SPIN_US="
                      f"{os.environ.get('TORCHCOMMS_CPU_SPIN_US', '0')}, MPI with mpi_yield_when_idle 1"
                      if self.oversub.get(layout) else ""))
            for impl in ("hier", "flat"):
                if (layout, impl) in self.probe:
                    L.append(f"  - {impl} on {layout}: {self.probe[(layout, impl)]} (rank 0's init log)")
        if self.a.runs > 1:  # how far the runs disagree: the noise floor of the ratios
            spread = []
            for i in self.impls:
                r = [v[4] / v[3] for k, v in med.items() if k[1] == i and v[3] > 0 and v[2] > 1]
                if r:
                    spread.append(f"{i} {statistics.median(r):.2f} (worst {max(r):.2f})")
            L.append("- run-to-run spread, max/min time over the runs, median over all points: " + ", ".join(spread))
        cols = [i for i in IMPLS if i in self.impls or i in ("hier", "flat", "mpi")]
        pairs = [(x, y) for x, y in (("hier", "flat"), ("hier", "mpi"), ("flat", "mpi"), ("hier", "mpi-sm"))
                 if x in cols and y in cols]
        for layout in self.layouts:
            n = [int(x) for x in layout.split(",")]
            for coll in self.colls:
                L += ["", f"## {coll}, {len(n)} hosts x {layout.replace(',', '/')} ranks ({sum(n)} ranks)", ""]
                L.append("| size | " + " | ".join(f"{LABEL[c]} us" for c in cols) + " | " +
                         " | ".join(f"{LABEL[x]}/{LABEL[y]}" for x, y in pairs) + " | " +
                         " | ".join(f"{LABEL[c]} busbw" for c in cols) + " |")
                L.append("|---:" * (1 + 2 * len(cols) + len(pairs)) + "|")
                for s in self.sizes:
                    t = {c: t_of(layout, c, coll, s) for c in cols}
                    bw = {c: bw_of(layout, c, coll, s) for c in cols}
                    L.append(f"| {fmt_size(s)} | " + " | ".join(f_us(t[c]) for c in cols) + " | " +
                             " | ".join(f_r(t[x], t[y]) for x, y in pairs) + " | " +
                             " | ".join(f_bw(bw[c]) for c in cols) + " |")
        if self.failures:
            L += ["", "## Failures", ""]
            L += [f"- layout {lay}, run {r}, {i} {c}: {w}" for lay, r, i, c, w in self.failures]
        text = "\n".join(L) + "\n"
        with open(os.path.join(a.out, "multihost.md"), "w") as f:
            f.write(text)
        print(text)
        log(f"wrote {a.out}/multihost_raw.csv, multihost.csv, multihost.md")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layouts", default="2,2:2,2,2,2", help="layouts separated by ':' (default 2,2:2,2,2,2)")
    ap.add_argument("--colls", default="all_reduce,all_gather")
    ap.add_argument("--min", default="8", help="smallest size (default 8)")
    ap.add_argument("--max", default="64M", help="largest size (default 64M)")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--impls", default="hier,flat,mpi", help="of hier,flat,mpi,mpi-sm (default hier,flat,mpi)")
    ap.add_argument("--mpi", default="auto", help="auto (debian when installed, else ompi5), debian, ompi5, none")
    ap.add_argument("--rate", default="10gbit", help="bed.sh --rate of every link (0: unshaped)")
    ap.add_argument("--timeout", type=int, default=600, help="seconds per launch (default 600)")
    ap.add_argument("--settle", type=float, default=0.5, help="seconds between launches (default 0.5)")
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results"))
    a = ap.parse_args()
    if a.runs < 1:
        sys.exit("multihost: --runs must be >= 1")

    def on_signal(sig, _frame):
        raise SystemExit(f"multihost: signal {sig}: stopping")
    for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(s, on_signal)
    b = Bench(a)
    try:
        return b.main()
    finally:
        for p in list(CHILDREN):
            kill_group(p)
        b.bed_down()


if __name__ == "__main__":
    sys.exit(main())
