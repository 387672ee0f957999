"""alternate.py -- one collective's latency in launches that alternate between
builds and anchors, in an order rotated every round (docs/benchmarks.md, "One
clock read per express operation": with a fixed order the launch right after
an anchor's measured slower, up to 0.195 against 0.157 us for two copies of
one build at 8 bytes).

  python3 bench/alternate.py ROUNDS COLLECTIVE NRANKS IMPL [IMPL ...]

IMPL: a build directory (its tcrun and tcperf), optionally with settings,
BUILD:NAME=VALUE,NAME=VALUE; or an anchor of ../shared/bench/anchors
(ompi, mpich, impi, ccl; run_anchor.sh, its cache in ANCHOR_CACHE), over
TCP with -tcp (ompi-tcp; ours: BUILD:TORCHCOMMS_CPU_TRANSPORT=tcp). Sizes:
LO and HI in bytes (default 8 and 8). Prints the median time per operation
(us) of every size and IMPL; SPREAD=1 adds each one's range. ITERS: our
launches' operations per size (tcperf -n; default 0, its own choice: about
a second; ITERS=2000000 at 8 B gives steadier medians).
Example: SPREAD=1 python3 bench/alternate.py 12 broadcast 2 build ompi
"""
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ANCHOR = os.path.join(HERE, "..", "..", "shared", "bench", "anchors", "run_anchor.sh")
ANCHORS = ("ompi", "mpich", "impi", "ccl")


def run(impl, coll, n, lo, hi, csv):
    """{size: us} of one launch."""
    base, _, tcp = impl.partition("-")
    if base in ANCHORS and tcp in ("", "tcp"):
        out = subprocess.run([ANCHOR, base, coll, n, lo, hi] + (["tcp"] if tcp else []),
                             capture_output=True, text=True).stdout
        rows = [line.split() for line in out.splitlines()]
        return {int(r[0]): float(r[2]) for r in rows if len(r) > 2 and r[0].isdigit()}
    build, _, settings = impl.partition(":")
    env = dict(os.environ)
    for kv in filter(None, settings.split(",")):
        k, v = kv.split("=", 1)
        env[k] = v
    subprocess.run([os.path.join(build, "tcrun"), "-n", n, os.path.join(build, "tcperf"),
                    "-c", coll, "-b", lo, "-e", hi, "-n", os.environ.get("ITERS", "0"), "-w", "5",
                    "--csv", csv],
                   capture_output=True, text=True, env=env, check=False)
    with open(csv) as f:
        rows = [line.split(",") for line in f.read().splitlines()[1:]]
    # tcperf's CSV: size in column 2, us per operation in column 7
    return {int(r[2]): float(r[7]) for r in rows if len(r) > 7}


def main():
    if len(sys.argv) < 5:
        sys.exit(__doc__)
    rounds, coll, n, impls = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4:]
    lo, hi = os.environ.get("LO", "8"), os.environ.get("HI", "8")
    res = {}
    with tempfile.TemporaryDirectory() as tmp:
        csv = os.path.join(tmp, "tcperf.csv")
        for r in range(rounds):
            k = r % len(impls)
            for impl in impls[k:] + impls[:k]:
                for size, us in run(impl, coll, n, lo, hi, csv).items():
                    res.setdefault((impl, size), []).append(us)
    sizes = sorted({s for (_, s) in res})
    print("size " + " ".join(f"{i:>14}" for i in impls))
    for s in sizes:
        line = f"{s:>8} " + " ".join(
            f"{statistics.median(res[(i, s)]):14.3f}" if (i, s) in res else " " * 14
            for i in impls)
        if os.environ.get("SPREAD"):
            line += "   spread " + " ".join(f"{min(res[(i, s)]):.2f}-{max(res[(i, s)]):.2f}"
                                         for i in impls if (i, s) in res)
        print(line)


if __name__ == "__main__":
    main()
