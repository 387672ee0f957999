"""dtype_ratio.py -- bfloat16 and float16 busbw as a fraction of float32's
(issue 16, point 5), each measured in the same tcperf launch (`tcperf -d
float32,bfloat16,float16 -R 3`: every dtype in each round, order rotated),
for one or more builds of libtorchcomms in launches rotated every round.

  python3 bench/dtype_ratio.py ROUNDS COLLECTIVE LIBDIR [LIBDIR ...]

LIBDIR: a directory holding a libtorchcomms.so.0, put first on
LD_LIBRARY_PATH of build/tcrun and build/tcperf (their RUNPATH gives way
to it), so two builds of the library compare in one run. Before each
launch it waits for the near placement as make bench does (run_bench.py's
wait_near: build/tcplacement_probe, up to BENCH_PLACEMENT_WAIT_S, here 60 s
unless set). Prints, per LIBDIR and 16-bit dtype, the median
over rounds of float32's time / the 16-bit dtype's time at each size.
SIZES: tcperf's size flags (default "-b 8K -e 2M"); ITERS: operations per
size (default 10000). BUILD: the build directory (default build).
Example: python3 bench/dtype_ratio.py 8 reduce_scatter /tmp/old /tmp/new
(docs/benchmarks.md, "The 16-bit kernels without prefetches on Zen 4 too").
"""
import os
import statistics
import subprocess
import sys

os.environ.setdefault("BENCH_PLACEMENT_WAIT_S", "60")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from run_bench import wait_near  # noqa: E402


def launch(build, coll, libdir, sizes, iters):
    env = dict(os.environ, LD_LIBRARY_PATH=libdir)
    cmd = [os.path.join(build, "tcrun"), "-n", "2", os.path.join(build, "tcperf"), "-c", coll,
           "-d", "float32,bfloat16,float16", *sizes, "-n", iters, "-R", "3"]
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, check=True).stdout
    times = {}
    for line in out.splitlines():
        f = line.split()
        if len(f) >= 6 and f[0].isdigit():
            times[(f[2], int(f[0]))] = float(f[5])
    return times


def main():
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    rounds, coll, libdirs = int(sys.argv[1]), sys.argv[2], sys.argv[3:]
    build = os.environ.get("BUILD", "build")
    sizes = os.environ.get("SIZES", "-b 8K -e 2M").split()
    iters = os.environ.get("ITERS", "10000")
    ratios = {}
    for r in range(rounds):
        for lib in libdirs[r % len(libdirs):] + libdirs[:r % len(libdirs)]:
            wait_near({"probe": os.path.join(build, "tcplacement_probe")})
            t = launch(build, coll, lib, sizes, iters)
            for (dt, size), tm in t.items():
                if dt != "float32":
                    ratios.setdefault((lib, dt, size), []).append(t[("float32", size)] / tm)
    all_sizes = sorted({k[2] for k in ratios})
    for lib in libdirs:
        for dt in ("bfloat16", "float16"):
            cells = " ".join(f"{s // 1024}K:{statistics.median(ratios[(lib, dt, s)]):.3f}"
                             for s in all_sizes if (lib, dt, s) in ratios)
            print(f"{lib} {dt:>9} {cells}")


if __name__ == "__main__":
    main()
