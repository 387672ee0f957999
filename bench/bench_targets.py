"""The targets of issue 16 with PASS / MISS / N/A, from a results directory.

    .venv/bin/python bench/bench_targets.py [bench/results]     (make bench-targets)

make bench (bench/run_bench.py) prints this section last; this module reads
only the CSVs a run leaves behind, so the section can be printed again from
a finished run without measuring anything:

  median.csv   impl, ranks, collective, size, time_us, busbw_GBps, runs
               (the medians over the interleaved runs; make bench)
  load.csv     impl, ranks, condition (quiet | loaded), time_us, runs
               (8 B all_reduce; make bench-load / run_bench.py --load)
  idle.csv     impl, ranks, rank, wall_s, user_s, sys_s, cpu_pct, runs
               (CPU a rank burns in a blocking wait; make bench-load)

"Best anchor" at a point: the PyPI-wheel anchor (bench/bench_anchors.py:
ompi, mpich, impi, ccl, and ccl-mpi / ccl-impi when they ran) in shared
memory with the highest busbw there, i.e. the lowest median time; runs of a
busy-polling anchor with more ranks than cores (collapsing) never count.
Every comparison is between medians at the same (ranks, collective, size).
"""
import csv
import os
import statistics
import sys
import time

import bench_anchors as BA

COLLS = ["all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all"]
SIZES = [8] + [16 * 4 ** k for k in range(12)]  # make bench's sizes: 8 B, 16 B x 4^k .. 64 MiB
# point 5: ours-c with tcperf -d float32,DTYPE (run_bench.py's implementations):
# one launch measures the 16-bit dtype and float32 side by side, and its
# float32 rows are kept as implementation IMPL + DTYPE_REF, the ratio's
# denominator (the launch's placement of the virtual CPUs, which can change a
# time 2-3x from launch to launch, then cancels out of the ratio)
DTYPE_IMPLS = {"ours-c-bf16": "bfloat16", "ours-c-fp16": "float16"}
DTYPE_REF = "-f32"
DTYPE_COLLS = ["all_reduce", "reduce_scatter"]
DTYPE_MIN = 8 << 10  # point 5 compares the sizes from 8 KiB
BIG = 64 << 10  # point 4: every size from 64 KiB
AR_ABS_US = 0.35  # point 2: all_reduce 8 B at 2 ranks
PY_GAP_US = 0.5  # point 6
LOAD_QUIET_X = 3.0  # point 3: 2 ranks loaded <= 3x ours quiet
LOAD_OMPI_X = {2: 1.0, 4: 2.0, 8: 2.0}  # point 3: loaded <= x * ompi loaded
NOT_COLLAPSING_4 = ["ompi", "impi"]  # point 4 at 4 ranks (issue 16's list)


def fmt_size(b):
    for unit, s in (("M", 1 << 20), ("K", 1 << 10)):
        if b >= s and b % s == 0:
            return f"{b // s}{unit}"
    return f"{b} B" if b < 1024 else str(b)


def _num(x):
    return float(x) if x not in ("", None) else None


class Results:
    """The CSVs of one results directory; get() as run_bench.py's."""

    def __init__(self, d):
        self.dir = d
        self.med, self.mem, self.runs = {}, {}, []
        self.load, self.idle, self.files = {}, [], {}
        p = os.path.join(d, "median.csv")
        if os.path.isfile(p):
            self.files["median.csv"] = os.path.getmtime(p)
            with open(p, newline="") as f:
                for r in csv.DictReader(f):
                    if r["impl"] == "memcpy":
                        self.mem[int(r["size"])] = _num(r["busbw_GBps"])
                        continue
                    self.med[(r["impl"], int(r["ranks"]), r["collective"], int(r["size"]))] = (
                        _num(r["time_us"]), _num(r["busbw_GBps"]))
                    self.runs.append(int(r["runs"]))
        p = os.path.join(d, "load.csv")
        if os.path.isfile(p):
            self.files["load.csv"] = os.path.getmtime(p)
            with open(p, newline="") as f:
                for r in csv.DictReader(f):
                    self.load[(r["impl"], int(r["ranks"]), r["condition"])] = (_num(r["time_us"]), int(r["runs"]))
        p = os.path.join(d, "idle.csv")
        if os.path.isfile(p):
            self.files["idle.csv"] = os.path.getmtime(p)
            with open(p, newline="") as f:
                self.idle = list(csv.DictReader(f))

    def get(self, impl, n, coll, size, col=1):
        v = self.med.get((impl, n, coll, size))
        return v[col] if v else None

    def sizes(self, impl, n, coll):
        return sorted(s for (i, nn, c, s) in self.med if i == impl and nn == n and c == coll)

    def anchors(self):
        """The anchors with rows here, in BA.KNOWN's order (shared memory names)."""
        seen = {BA.split_impl(i)[0] for (i, _, _, _) in self.med if BA.split_impl(i)}
        return [a for a in BA.KNOWN if a in seen]

    def best(self, anchors, n, coll, size):
        """(time_us, busbw, impl) of the best shared-memory anchor at a point,
        collapsing runs left out; (None, None, None) if none ran there."""
        bw, impl = BA.best(self.get, anchors, n, coll, size, False)
        return (self.get(impl, n, coll, size, 0), bw, impl) if impl else (None, None, None)


class Printer:
    def __init__(self, out):
        self.out, self.counts = out, {"PASS": 0, "MISS": 0, "N/A ": 0}

    def line(self, ok, name, detail):
        tag = "PASS" if ok else "MISS" if ok is not None else "N/A "
        self.counts[tag] += 1
        print(f"  [{tag}] {name}: {detail}", file=self.out)

    def note(self, text):
        print(f"         {text}", file=self.out)

    def head(self, text):
        print(f"# {text}", file=self.out)


def _us(x):
    if x is None:
        return "-"
    return f"{x:.3f} us" if x < 10 else f"{x:.1f} us" if x < 1000 else f"{x:.0f} us"


def point1(R, P):
    P.head("point 1: make bench against every anchor (shm and TCP, 2 and 4 ranks, five collectives + send_recv)")
    if not R.med:
        P.line(None, "every anchor measured", "no median.csv here (run make bench)")
        return
    for a in BA.DEFAULT.split(","):
        missing, skipped = [], []
        for n in (2, 4):
            if BA.collapsing(a, n):
                skipped.append(n)  # not run there (busy-polls on fewer cores than ranks), by design
                continue
            for impl in (a, a + "-tcp"):
                lacks = [c for c in COLLS + ["send_recv"] if not R.sizes(impl, n, c)]
                if lacks:
                    missing.append(f"{impl} at {n} ranks: {','.join(lacks)}")
        ran = [n for n in (2, 4) if n not in skipped]
        P.line(not missing, f"{a} ({BA.LABEL[a]}) measured",
               f"shm and tcp at {','.join(map(str, ran))} ranks: " +
               (f"not measured: {'; '.join(missing)}" if missing else "every collective and send_recv") +
               (f"; not run at {','.join(map(str, skipped))} ranks (busy-polls, {BA.ncpu()} cores: collapses)"
                if skipped else ""))
    others = [x for x in ("gloo", "mpi-shm", "mpi-tcp") if any(k[0] == x for k in R.med)]
    P.note(f"also measured: {', '.join(others + (['memcpy'] if R.mem else [])) or 'nothing else'}")


def point2(R, P, anchors):
    P.head("point 2: small messages at the floor (2 ranks, shared memory, 8 B, median time; "
           "best anchor = lowest time)")
    for coll in COLLS + ["send_recv"]:
        o = R.get("ours-c", 2, coll, 8, 0)
        bt, _, bi = R.best(anchors, 2, coll, 8)
        name = f"{coll} 8 B <= best anchor" + (" (informational)" if coll == "send_recv" else "")
        if o is None or bt is None:
            P.line(None, name, "not measured" + (" (ours)" if o is None else " (no anchor)"))
            continue
        P.line(o <= bt, name, f"ours {_us(o)}, best {bi} {_us(bt)} (ours/best time {o / bt:.2f})")
    o = R.get("ours-c", 2, "all_reduce", 8, 0)
    P.line(None if o is None else o <= AR_ABS_US, f"all_reduce 8 B <= {AR_ABS_US} us",
           f"ours {_us(o)}" if o is not None else "not measured")


def _ge_best(R, P, n, coll, refs, label):
    sizes = [s for s in R.sizes("ours-c", n, coll) if s >= BIG]
    if not sizes:
        P.line(None, label, "not measured (ours)")
        return
    fails, noref, worst = [], [], None
    for s in sizes:
        o = R.get("ours-c", n, coll, s)
        _, bw, bi = R.best(refs, n, coll, s)
        if bw is None:
            noref.append(fmt_size(s))
            continue
        r = o / bw
        if worst is None or r < worst[0]:
            worst = (r, s, bi)
        if r < 1.0:
            fails.append(f"{fmt_size(s)} x{r:.2f} ({bi})")
    if worst is None:
        P.line(None, label, "no anchor measured at these sizes")
        return
    detail = (f"{len(sizes) - len(noref)} sizes {fmt_size(sizes[0])}..{fmt_size(sizes[-1])}, "
              f"lowest ours/best busbw x{worst[0]:.2f} at {fmt_size(worst[1])} ({worst[2]})")
    if fails:
        detail += f"; below at {', '.join(fails)}"
    if noref:
        detail += f"; no anchor at {', '.join(noref)}"
    P.line(not fails, label, detail)


def point4(R, P, anchors):
    P.head(f"point 4: large messages (every size >= {fmt_size(BIG)}, busbw, shared memory)")
    for coll in COLLS:
        _ge_best(R, P, 2, coll, anchors, f"2 ranks {coll} >= every anchor ({','.join(anchors) or 'none'})")
    refs = [a for a in NOT_COLLAPSING_4 if a in anchors]
    for coll in COLLS:
        _ge_best(R, P, 4, coll, refs, f"4 ranks {coll} >= best of {','.join(refs) or 'ompi,impi (none ran)'}")


def point5(R, P):
    P.head(f"point 5: bf16 / fp16 busbw >= 90% of float32's at the same byte size (2 ranks, shm, sizes from "
           f"{fmt_size(DTYPE_MIN)}; tcperf -d float32,DTYPE: both in each launch, side by side)")
    for coll in DTYPE_COLLS:
        for impl, dt in DTYPE_IMPLS.items():
            label = f"{coll} {dt} >= 0.9x float32"
            ref = impl + DTYPE_REF
            sizes = [s for s in R.sizes(impl, 2, coll) if s >= DTYPE_MIN and R.get(ref, 2, coll, s)]
            if not sizes:
                P.line(None, label, f"not measured ({impl}: run make bench with it in --impls)")
                continue
            rs = [(s, R.get(impl, 2, coll, s) / R.get(ref, 2, coll, s)) for s in sizes]
            w = min(rs, key=lambda x: x[1])
            P.line(w[1] >= 0.9, label, f"lowest x{w[1]:.2f} at {fmt_size(w[0])}; "
                   + " ".join(f"{fmt_size(s)}:{r:.2f}" for s, r in rs))


def point6(R, P):
    P.head(f"point 6: Python at the C floor (2 ranks, 8 B: time(ours-py) - time(ours-c) <= {PY_GAP_US} us)")
    for coll in COLLS + ["send_recv"]:
        c, py = R.get("ours-c", 2, coll, 8, 0), R.get("ours-py", 2, coll, 8, 0)
        if c is None or py is None:
            P.line(None, f"{coll} py - c <= {PY_GAP_US} us", "not measured")
            continue
        P.line(py - c <= PY_GAP_US, f"{coll} py - c <= {PY_GAP_US} us",
               f"ours-py {_us(py)}, ours-c {_us(c)}, difference {py - c:.3f} us")


def point3(R, P):
    P.head("point 3: steady under load (8 B all_reduce, shared memory, a busy loop on every core; "
           "make bench-load)")
    if not R.load:
        P.line(None, "under load", "not measured (no load.csv: run make bench-load)")
    else:
        def t(impl, n, cond):
            v = R.load.get((impl, n, cond))
            return v[0] if v else None

        ranks = sorted({n for (_, n, _) in R.load})
        runs = sorted({v[1] for v in R.load.values()})
        P.note(f"medians over {'/'.join(map(str, runs))} samples (runs x BENCH_LOAD_REPEAT launches); time per "
               "all_reduce (1000 calls timed as a whole, max over ranks), quiet -> loaded:")
        for impl in sorted({i for (i, _, _) in R.load}):
            P.note(f"{impl:<8} " + "   ".join(
                f"{n} ranks {_us(t(impl, n, 'quiet'))} -> {_us(t(impl, n, 'loaded'))}" for n in ranks))
        oq, ol, ml = t("ours-c", 2, "quiet"), t("ours-c", 2, "loaded"), t("ompi", 2, "loaded")
        P.line(None if oq is None or ol is None else ol <= LOAD_QUIET_X * oq,
               f"2 ranks loaded <= {LOAD_QUIET_X:g}x ours quiet",
               f"loaded {_us(ol)}, quiet {_us(oq)}" + (f" (x{ol / oq:.1f})" if oq and ol else ""))
        for n, x in LOAD_OMPI_X.items():
            ol, ml = t("ours-c", n, "loaded"), t("ompi", n, "loaded")
            P.line(None if ol is None or ml is None else ol <= x * ml,
                   f"{n} ranks loaded <= {x:g}x ompi loaded",
                   ("not measured" if ol is None or ml is None else
                    f"ours {_us(ol)}, ompi {_us(ml)} (ours/ompi {ol / ml:.2f})"))
    if R.idle:
        P.note("idle cost of a blocking wait (a barrier whose last rank comes ~2 s later; CPU time user+sys "
               "of the waiting ranks, medians):")
        for r in R.idle:
            if r["cpu_pct"] in ("", "-"):
                continue
            P.note(f"{r['impl']:<8} {r['ranks']} ranks, rank {r['rank']}: wait {float(r['wall_s']):.2f} s, "
                   f"CPU {float(r['user_s']) + float(r['sys_s']):.3f} s ({float(r['cpu_pct']):.1f}% of a core)")
    else:
        P.note("idle cost: not measured (no idle.csv: run make bench-load)")


# Close calls (run_bench.py --more): a point whose measure is within this
# factor of its target either way gets more interleaved launches.
CLOSE = 1.25


def _close(x, want):
    return x is not None and want / CLOSE <= x <= want * CLOSE


def contested(get, anchors, ranks):
    """The points whose PASS / MISS the runs so far leave close: a measure
    within CLOSE of its target, on either side. get as Results.get (a
    median table of the runs so far). Returns {(ranks, collective): (impls,
    sizes)}: the implementations whose medians decide those points, and
    the sizes, sorted. Points 2, 4, 5 and 6 (point 3 has its own runs)."""
    out = {}

    def add(n, coll, impls, size):
        e = out.setdefault((n, coll), (set(), set()))
        e[0].update(impls)
        e[1].add(size)

    def best(refs, n, coll, size):
        return BA.best(get, refs, n, coll, size, False)

    if 2 in ranks:
        for coll in COLLS:  # point 2: ours time / best time <= 1 (send_recv: informational)
            o, (_, bi) = get("ours-c", 2, coll, 8, 0), best(anchors, 2, coll, 8)
            bt = get(bi, 2, coll, 8, 0) if bi else None
            if o is not None and bt and _close(o / bt, 1.0):
                add(2, coll, ["ours-c"] + [a for a in anchors if not BA.collapsing(a, 2)], 8)
        if _close(get("ours-c", 2, "all_reduce", 8, 0), AR_ABS_US):
            add(2, "all_reduce", ["ours-c"], 8)
        for coll in DTYPE_COLLS:  # point 5: busbw ratio >= 0.9
            for impl in DTYPE_IMPLS:
                for s in _sizes(get, impl, coll):  # one launch gives both
                    if s >= DTYPE_MIN and _close(_div(get(impl, 2, coll, s), get(impl + DTYPE_REF, 2, coll, s)), 0.9):
                        add(2, coll, [impl], s)
        for coll in COLLS + ["send_recv"]:  # point 6: py - c <= 0.5 us
            c, py = get("ours-c", 2, coll, 8, 0), get("ours-py", 2, coll, 8, 0)
            if c is not None and py is not None and _close(py - c, PY_GAP_US):
                add(2, coll, ["ours-c", "ours-py"], 8)
    for n in ranks:  # point 4: busbw ratio >= 1 from 64 KiB
        refs = anchors if n == 2 else [a for a in NOT_COLLAPSING_4 if a in anchors]
        for coll in COLLS:
            for s in _sizes(get, "ours-c", coll, n):
                bw, _ = best(refs, n, coll, s)
                if s >= BIG and _close(_div(get("ours-c", n, coll, s), bw), 1.0):
                    add(n, coll, ["ours-c"] + [a for a in refs if not BA.collapsing(a, n)], s)
    return {k: (sorted(v[0]), sorted(v[1])) for k, v in out.items()}


def _div(a, b):
    return a / b if a is not None and b else None


def _sizes(get, impl, coll, n=2):
    """The sizes of make bench (SIZES) where impl has a median."""
    return [s for s in SIZES if get(impl, n, coll, s) is not None]


def print_issue16(d, out=sys.stdout):
    """Prints the issue-16 targets section from the CSVs in directory d;
    returns {"PASS": k, "MISS": k, "N/A ": k}."""
    R = Results(d)
    P = Printer(out)
    anchors = R.anchors()
    when = ", ".join(f"{k} {time.strftime('%Y-%m-%d %H:%M', time.localtime(v))}" for k, v in R.files.items())
    runs = sorted(set(R.runs))
    print(f"\n# targets (issue 16), from {d} ({when or 'no CSVs'}); medians over "
          f"{'/'.join(map(str, runs)) or '-'} interleaved runs; anchors {', '.join(anchors) or 'none'}",
          file=out)
    point1(R, P)
    point2(R, P, anchors)
    point3(R, P)
    point4(R, P, anchors)
    point5(R, P)
    point6(R, P)
    c = P.counts
    print(f"# targets (issue 16): {c['PASS']} PASS, {c['MISS']} MISS, {c['N/A ']} N/A", file=out)
    return c


def median_rows(rows, key, val):
    """Medians of val(row) grouped by key(row): {key: (median, count)}."""
    g = {}
    for r in rows:
        g.setdefault(key(r), []).append(val(r))
    return {k: (statistics.median(v), len(v)) for k, v in g.items()}


if __name__ == "__main__":
    here = os.path.dirname(os.path.abspath(__file__))
    d = sys.argv[1] if len(sys.argv) > 1 else os.path.join(here, "results")
    if not os.path.isdir(d):
        sys.exit(f"bench_targets: {d} is not a directory (a results directory of make bench)")
    print_issue16(d)
