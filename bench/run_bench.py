"""make bench: our cpu backend against Gloo, Open MPI and memcpy, side by side.

    .venv/bin/python bench/run_bench.py [--runs 3] [--ranks 2,4] [--colls ...]

For each run (runs are interleaved, so drift hits every implementation alike),
each rank count and each collective, it measures over 8 B and 16 B .. 64 MiB
(x4 steps, so 64 KiB, 1 MiB and 64 MiB are exact points):

  ours-c      build/tcperf under build/tcrun (shared memory: the default here)
  ours-py     python -m torchcomms.perf under build/tcrun (torch tensors)
  ours-tcp    build/tcperf with TORCHCOMMS_CPU_TRANSPORT=tcp
  gloo        ../shared/bench/gloo_perf.py (torch.distributed, Gloo)
  mpi-shm     ../shared/bench/mpi_perf.c under mpirun (Open MPI's default:
              shared memory)
  mpi-tcp     the same with --mca btl self,tcp
  memcpy      ../shared/bench/memcpy_bw.c (one thread, once per run)

Iterations follow the anchors' rule for everyone (1000 below 64 KiB, 100
below 4 MiB, 10 from 4 MiB; 5 warm-up). Writes bench/results/raw.csv (every
row of every run), bench/results/median.csv (median over runs),
bench/results/ratios.csv, bench/results/busbw_<N>ranks.png, and prints one
table of ratios and the issue's targets with PASS/MISS.
"""
import argparse
import csv
import os
import shutil
import socket
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ANCHORS = os.path.normpath(os.environ.get("TC_BENCH_ANCHORS", os.path.join(ROOT, "..", "shared", "bench")))
BUILD = os.environ.get("TC_BUILD_DIR", os.path.join(ROOT, "build"))
OUT = os.path.join(ROOT, "bench", "results")
COLLS = ["all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all"]
MPI_NAME = {"all_reduce": "allreduce", "all_gather": "allgather", "reduce_scatter": "reduce_scatter",
            "broadcast": "bcast", "all_to_all": "alltoall"}
IMPLS = ["ours-c", "ours-py", "ours-tcp", "gloo", "mpi-shm", "mpi-tcp"]
SIZES = [8] + [16 * 4 ** k for k in range(12)]  # 8 B, 16 B .. 64 MiB
MPIRUN = ["mpirun", "--allow-run-as-root", "--oversubscribe"]


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
    f = 2 * (n - 1) / n if coll == "all_reduce" else 1.0 if coll == "broadcast" else (n - 1) / n
    return size / (time_us * 1e-6) / 1e9 * f


def run_cmd(cmd, env=None, timeout=600):
    e = dict(os.environ, OMP_NUM_THREADS="1")
    e.update(env or {})
    t0 = time.time()
    p = subprocess.run(cmd, env=e, capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {p.returncode}:\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}")
    return p.stdout, time.time() - t0


def size_ranges():
    """(min, max) calls covering SIZES with x4 steps."""
    return [(8, 8), (16, SIZES[-1])]


SETTLE_S = float(os.environ.get("BENCH_SETTLE_S", "0.5"))


def measure(impl, coll, n, tools):
    rows = {}
    for lo, hi in size_ranges():
        # the previous job's processes may still be exiting (mpirun's daemons,
        # torch's workers): a sub-millisecond 8 B measurement must not share
        # the cores with them
        time.sleep(SETTLE_S)
        if impl in ("ours-c", "ours-tcp", "ours-py"):
            prog = [tools["tcperf"]] if impl != "ours-py" else [tools["python"], "-m", "torchcomms.perf"]
            cmd = [tools["tcrun"], "-n", str(n), *prog, "-c", coll, "-b", str(lo), "-e", str(hi),
                   "-f", "4", "-n", "0", "-w", "5", "-t", "120"]
            env = {"TORCHCOMMS_CPU_TRANSPORT": "tcp"} if impl == "ours-tcp" else None
            out, _ = run_cmd(cmd, env)
        elif impl == "gloo":
            cmd = [tools["python"], os.path.join(ANCHORS, "gloo_perf.py"), "--nproc", str(n), "--coll", coll,
                   "--min-bytes", str(lo), "--max-bytes", str(hi), "--factor", "4", "--port", str(free_port())]
            out, _ = run_cmd(cmd)
        else:
            btl = ["--mca", "btl", "self,tcp"] if impl == "mpi-tcp" else []
            cmd = [*MPIRUN, *btl, "-np", str(n), tools["mpi_perf"], MPI_NAME[coll], str(lo), str(hi)]
            out, _ = run_cmd(cmd)
        want = [lo * 4 ** k for k in range(64) if lo * 4 ** k <= hi]
        times = parse_times(out)
        if len(times) != len(want):
            raise RuntimeError(f"expected {len(want)} rows, got {len(times)}:\n{out[-2000:]}")
        rows.update({size: (t, busbw(coll, n, size, t)) for size, t in zip(want, times)})
    return rows


def memcpy_rows(tools):
    out, _ = run_cmd([tools["memcpy_bw"]])
    r = {}
    for line in out.splitlines():
        f = line.split()
        if f and f[0].isdigit():
            r[int(f[0])] = float(f[1])
    return r


def build_tools(skip_mpi):
    os.makedirs(os.path.join(BUILD, "bench"), exist_ok=True)
    tools = {"tcrun": os.path.join(BUILD, "tcrun"), "tcperf": os.path.join(BUILD, "tcperf"),
             "python": sys.executable,
             "memcpy_bw": os.path.join(BUILD, "bench", "memcpy_bw"),
             "mpi_perf": os.path.join(BUILD, "bench", "mpi_perf")}
    for t in ("tcrun", "tcperf"):
        if not os.access(tools[t], os.X_OK):
            sys.exit(f"bench: {tools[t]} is missing: run `make build` first")
    if not os.path.isfile(os.path.join(ANCHORS, "memcpy_bw.c")):
        sys.exit(f"bench: the anchor benchmarks are not in {ANCHORS} (a checkout beside ../shared, "
                 "or TC_BENCH_ANCHORS=/path/to/shared/bench)")
    subprocess.run(["cc", "-O2", "-o", tools["memcpy_bw"], os.path.join(ANCHORS, "memcpy_bw.c")], check=True)
    if not skip_mpi:
        if not shutil.which("mpicc") or not shutil.which("mpirun"):
            sys.exit("bench: Open MPI is missing (mpicc, mpirun): `make bench` installs Debian's "
                     "openmpi-bin and libopenmpi-dev; or pass --no-mpi")
        subprocess.run(["mpicc", "-O2", "-o", tools["mpi_perf"], os.path.join(ANCHORS, "mpi_perf.c")], check=True)
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



def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=int(os.environ.get("BENCH_RUNS", "3")))
    ap.add_argument("--ranks", default=os.environ.get("BENCH_RANKS", "2,4"))
    ap.add_argument("--colls", default=os.environ.get("BENCH_COLLS", ",".join(COLLS)))
    ap.add_argument("--impls", default=os.environ.get("BENCH_IMPLS", ",".join(IMPLS)))
    ap.add_argument("--no-mpi", action="store_true", help="skip Open MPI (when it cannot be installed)")
    ap.add_argument("--no-plot", action="store_true")
    a = ap.parse_args()
    ranks = [int(x) for x in a.ranks.split(",")]
    colls = [c for c in a.colls.split(",") if c]
    impls = [i for i in a.impls.split(",") if i and not (a.no_mpi and i.startswith("mpi"))]
    for c in colls:
        if c not in COLLS:
            sys.exit(f"bench: unknown collective {c!r} (one of {', '.join(COLLS)})")
    tools = build_tools(a.no_mpi or not any(i.startswith("mpi") for i in impls))
    os.makedirs(OUT, exist_ok=True)

    raw, mem = {}, {}
    failures = []
    t_start = time.time()
    for run in range(1, a.runs + 1):
        for size, bw in memcpy_rows(tools).items():
            mem.setdefault(size, []).append(bw)
        for n in ranks:
            for coll in colls:
                for impl in impls:
                    try:
                        rows = measure(impl, coll, n, tools)
                    except (RuntimeError, subprocess.TimeoutExpired) as e:
                        failures.append(f"run {run} {impl} {coll} n={n}: {e}")
                        log(f"bench: FAILED {impl} {coll} n={n}: {str(e)[:300]}")
                        continue
                    for size, v in rows.items():
                        raw[(run, impl, n, coll, size)] = v
                log(f"bench: run {run}/{a.runs} n={n} {coll} done ({time.time() - t_start:.0f} s)")

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
    print(f"\n# make bench: {a.runs} run(s), medians; ratio = busbw(ours-c) / busbw(reference)"
          f" (same sizes, same run); ours-tcp / mpi-tcp in the last column")
    hdr = f"{'ranks':>5} {'collective':<15}{'size':>6} {'ours us':>9} {'ours GB/s':>9}" + "".join(
        f" {('x ' + r):>9}" for r in refs) + f" {'tcp/mpitcp':>10}"
    print(hdr)
    for n in ranks:
        for coll in colls:
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
    with open(os.path.join(OUT, "ratios.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["ranks", "collective", "size", "ours_time_us", "ours_busbw_GBps",
                    *[f"ratio_vs_{r}" for r in refs], "ratio_tcp_vs_mpi_tcp"])
        w.writerows(rrows)

    print_targets(get, ranks, colls, memmed)
    if not a.no_plot:
        plot(med, memmed, ranks, colls, impls)
    for f in failures:
        log("bench: failed: " + f.splitlines()[0])
    log(f"bench: results in {OUT} ({time.time() - t_start:.0f} s)")
    return 1 if failures else 0


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


def plot(med, memmed, ranks, colls, impls):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log("bench: matplotlib is not installed: no plot (make bench installs it into .venv)")
        return
    for n in ranks:
        fig, axes = plt.subplots(1, len(colls), figsize=(4.2 * len(colls), 4), squeeze=False)
        for ax, coll in zip(axes[0], colls):
            for impl in impls:
                pts = sorted((s, v[1]) for (i, nn, c, s), v in med.items() if i == impl and nn == n and c == coll)
                if pts:
                    ax.plot([p[0] for p in pts], [max(p[1], 1e-7) for p in pts], marker=".", label=impl)
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
