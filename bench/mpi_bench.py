#!/usr/bin/env python3
"""make bench-mpi (also part of make bench): the mpi backend against raw MPI
and against our cpu backend, side by side in one run (issue 18, point 4).

For each MPI the plugin was built with (build/mpi/<flavour>/, make
mpi-plugins) and each collective and size, three programs run under the
same launcher and rank count, interleaved, REPS times each:

  raw   bench/mpi_raw.c: blocking MPI_Allreduce / MPI_Bcast /
        MPI_Allgather after MPI_Init, as a plain MPI program calls them,
        built with that MPI's mpicc
  mpi   tools/tcperf -B mpi: torchcomms' API over the mpi backend
  cpu   tools/tcperf over our cpu backend (shared memory), launched by tcrun

All time = average per iteration (after a barrier, back to back: 20000
iterations at 8 B, 1000 at 32 KiB, 100 at 512 KiB), the maximum over ranks;
the table gives the median of the REPS runs. The
target is the layer's overhead, mpi - raw, at most 1 us at 8 bytes
(all_reduce). Rows go to bench/results/mpi.csv.

    bench/mpi_bench.py BUILD_DIR [--reps 5] [--ranks 2] [--flavours openmpi,mpich]
"""
import argparse
import csv
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RAW_SRC = ROOT / "bench" / "mpi_raw.c"
PREFIX = {"openmpi": ROOT / ".deps" / "openmpi-5.0.11", "mpich": ROOT / ".deps" / "mpich-5.0.2"}
COLLS = [("all_reduce", "allreduce"), ("broadcast", "bcast"), ("all_gather", "allgather")]
SIZES = {8: 20000, 32768: 1000, 524288: 100}  # bytes: iterations
TARGET_US = 1.0


def launcher(flavour, n, plugin_dir):
    p = PREFIX[flavour]
    if flavour == "openmpi":
        return [str(p / "bin" / "mpirun"), "--allow-run-as-root", "--oversubscribe", "-np", str(n),
                "--mca", "pml", "ob1", "--mca", "btl", "self,sm",
                "-x", f"TORCHCOMMS_BACKEND_LIB_PATH_MPI={plugin_dir}", "-x", "OMP_NUM_THREADS=1"]
    return [str(p / "bin" / "mpiexec"), "-launcher", "fork", "-n", str(n),
            "-genv", "TORCHCOMMS_BACKEND_LIB_PATH_MPI", str(plugin_dir)]


def time_us(out):
    """time_us of the one row: mpi_raw prints "bytes time_us", tcperf its
    nccl-tests columns (time_us the sixth)."""
    for line in out.splitlines():
        f = line.split()
        if not f or line.lstrip().startswith("#") or not re.match(r"^\d+$", f[0]):
            continue
        return float(f[1]) if len(f) == 2 else float(f[5])
    return None


def run(cmd, timeout=300):
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    t = time_us(r.stdout) if r.returncode == 0 else None
    if t is None:
        sys.exit(f"bench-mpi: failed ({r.returncode}): {' '.join(cmd)}\n{r.stdout[-2000:]}{r.stderr[-2000:]}")
    return t


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("build")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--flavours", default="openmpi,mpich")
    a = ap.parse_args()
    build = Path(a.build).resolve()
    src = RAW_SRC
    tcperf = build / "tcperf"
    rows = []
    for fl in a.flavours.split(","):
        plugin = build / "mpi" / fl
        if not (plugin / "libtorchcomms-mpi.so").exists():
            print(f"# {fl}: no plugin in {plugin} (make mpi-plugins): skipped")
            continue
        raw = plugin / "mpi_raw"
        if not raw.exists() or raw.stat().st_mtime < src.stat().st_mtime:
            subprocess.run([str(PREFIX[fl] / "bin" / "mpicc"), "-O2", "-o", str(raw), str(src)], check=True)
        L = launcher(fl, a.ranks, plugin)
        for coll, mcoll in COLLS:
            for size, iters in SIZES.items():
                res = {"raw": [], "mpi": [], "cpu": []}
                perf = [str(tcperf), "-c", coll, "-b", str(size), "-e", str(size), "-n", str(iters),
                        "-m", "avg"]
                for _ in range(a.reps):
                    res["raw"].append(run(L + [str(raw), mcoll, str(size), str(iters)]))
                    res["mpi"].append(run(L + perf + ["-B", "mpi"]))
                    res["cpu"].append(run([str(build / "tcrun"), "-n", str(a.ranks)] + perf))
                med = {k: statistics.median(v) for k, v in res.items()}
                rows.append({"mpi": fl, "coll": coll, "bytes": size, "ranks": a.ranks,
                             "raw_us": med["raw"], "mpi_us": med["mpi"], "cpu_us": med["cpu"],
                             "overhead_us": med["mpi"] - med["raw"], "mpi_over_raw": med["mpi"] / med["raw"],
                             "cpu_over_raw": med["cpu"] / med["raw"]})
    if not rows:
        print("bench-mpi: nothing measured")
        return 0
    print(f"# mpi backend vs raw MPI (mpi_raw.c, blocking calls) vs our cpu backend; {a.ranks} ranks, "
          f"median of {a.reps} interleaved runs, us per operation (max over ranks)")
    print(f"{'mpi':8} {'coll':11} {'bytes':>8} {'raw':>9} {'ours/mpi':>9} {'ours/cpu':>9} "
          f"{'overhead':>9} {'mpi/raw':>8} {'cpu/raw':>8}")
    for r in rows:
        print(f"{r['mpi']:8} {r['coll']:11} {r['bytes']:>8} {r['raw_us']:9.2f} {r['mpi_us']:9.2f} "
              f"{r['cpu_us']:9.2f} {r['overhead_us']:+9.2f} {r['mpi_over_raw']:8.2f} {r['cpu_over_raw']:8.2f}")
    for r in rows:
        if r["coll"] == "all_reduce" and r["bytes"] == 8:
            ok = r["overhead_us"] <= TARGET_US
            print(f"{'PASS' if ok else 'MISS'} {r['mpi']}: the layer's overhead at 8 B all_reduce is "
                  f"{r['overhead_us']:+.2f} us (target <= {TARGET_US} us)")
    out = ROOT / "bench" / "results"
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "mpi.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    print(f"# rows in {out / 'mpi.csv'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
