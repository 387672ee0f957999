#!/usr/bin/env python3
"""scaling.py -- the bootstrap cost of a communicator by number of ranks
(issue 17, point 2): runs tools/tcscale.c under tcrun at each N over TCP
(TORCHCOMMS_CPU_TRANSPORT=tcp) and over the default transport (shared
memory on one host: TORCHCOMMS_CPU_TRANSPORT unset), and writes

    <out>/scaling.csv   one row per run: N, transport, exit status, the
                        run's wall time, then tcscale's min/median/max over
                        ranks of every figure (see tools/tcscale.c)
    <out>/scaling.md    the table (store requests per rank for creation and
                        split, creation time, sockets per rank after one
                        8-byte all_reduce), failures with their error

    python3 bench/scaling.py [--build build] [--out bench/results]
                             [--sizes 2,4,...,256] [--transports tcp,shm]
                             [--timeout 600]

Oversubscribed runs (N far above the cores) are for counts and
correctness, not speed. TORCHCOMM_TIMEOUT_SECONDS is set to --timeout for
the ranks (unless already set) and tcrun stops a run after --timeout plus a
margin; a failed or stopped run is recorded with its exit status and the
last lines of its output, and the next run goes on. Python 3 standard
library only.
"""
import argparse
import csv
import os
import resource
import subprocess
import sys
import time

SIZES = [2, 4, 8, 16, 32, 64, 128, 256]


def run_one(build, n, transport, timeout, tmpcsv):
    env = dict(os.environ)
    env.setdefault("TORCHCOMM_TIMEOUT_SECONDS", str(timeout))
    if transport == "tcp":
        env["TORCHCOMMS_CPU_TRANSPORT"] = "tcp"
    else:  # the default: shared memory between ranks of one host
        env.pop("TORCHCOMMS_CPU_TRANSPORT", None)
    if os.path.exists(tmpcsv):
        os.unlink(tmpcsv)
    cmd = [os.path.join(build, "tcrun"), "-n", str(n), "--timeout",
           str(int(timeout + 60)), os.path.join(build, "tcscale"), "--csv",
           tmpcsv, "--label", transport]
    t0 = time.monotonic()
    p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True)
    wall = time.monotonic() - t0
    row = None
    if p.returncode == 0 and os.path.exists(tmpcsv):
        with open(tmpcsv) as f:
            rows = list(csv.DictReader(f))
        row = rows[-1] if rows else None
    tail = "\n".join(p.stdout.strip().splitlines()[-6:])
    return p.returncode, wall, row, tail, " ".join(cmd)


def fmt(v):
    x = float(v)
    return str(int(x)) if x == int(x) else "%.3g" % x


def mmm(row, name):
    return "%s / %s / %s" % (fmt(row[name + "_min"]), fmt(row[name + "_med"]),
                             fmt(row[name + "_max"]))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default="build")
    ap.add_argument("--out", default="bench/results")
    ap.add_argument("--sizes", default=",".join(map(str, SIZES)))
    ap.add_argument("--transports", default="tcp,shm")
    ap.add_argument("--timeout", type=float, default=600.0)
    a = ap.parse_args()
    sizes = [int(s) for s in a.sizes.split(",") if s]
    transports = [t for t in a.transports.split(",") if t]
    for t in transports:
        if t not in ("tcp", "shm"):
            sys.exit("scaling.py: unknown transport '%s' (tcp or shm)" % t)
    os.makedirs(a.out, exist_ok=True)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = 2 * max(sizes) + 64  # a rank: its peers and a few more
    if soft < need and hard >= need:
        resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))
        soft = need
    print("scaling.py: %d cores, RLIMIT_NOFILE %d per process; sizes %s; "
          "transports %s" % (os.cpu_count(), soft, sizes, transports),
          flush=True)
    tmpcsv = os.path.join(a.out, ".scaling_run.csv")
    results = []
    for transport in transports:
        for n in sizes:
            rc, wall, row, tail, cmd = run_one(a.build, n, transport,
                                               a.timeout, tmpcsv)
            status = "ok" if rc == 0 and row else "FAILED (exit %d)" % rc
            print("  %-3s n=%-4d %-18s %7.1f s  %s" % (
                transport, n, status, wall,
                tail.splitlines()[-1] if tail else ""), flush=True)
            results.append((n, transport, rc, wall, row, tail, cmd))
    if os.path.exists(tmpcsv):
        os.unlink(tmpcsv)

    # CSV: the driver's columns, then tcscale's
    fields = []
    for r in results:
        if r[4]:
            fields = [k for k in r[4].keys() if k not in ("n", "transport")]
            break
    path_csv = os.path.join(a.out, "scaling.csv")
    with open(path_csv, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["n", "transport", "exit", "run_wall_s"] + fields)
        for n, t, rc, wall, row, _, _ in results:
            w.writerow([n, t, rc, "%.2f" % wall] +
                       [row[k] if row else "" for k in fields])

    lines = [
        "| N | transport | create: store requests per rank (min / med / max) "
        "| create: median of each kind (set get add check wait delete) "
        "| create time, s (med / max) | sockets per rank after one 8 B "
        "all_reduce (min / med / max) | first all_reduce: store requests "
        "(max) | split in 2: store requests (min / med / max) | split time, "
        "s (med / max) | sockets after the half's all_reduce (med) | whole "
        "run, s |",
        "|---:|---|---|---|---|---|---|---|---|---|---:|"]
    failures = []
    for n, t, rc, wall, row, tail, cmd in results:
        if not row:
            lines.append("| %d | %s | failed (exit %d) | | | | | | | | %.2f |"
                         % (n, t, rc, wall))
            failures.append((n, t, rc, tail, cmd))
            continue
        kinds = " ".join(fmt(row["create_%s_med" % k]) for k in
                         ("set", "get", "add", "check", "wait", "delete"))
        lines.append(
            "| %d | %s | %s | %s | %s / %s | %s | %s | %s | %s / %s | %s | "
            "%.2f |" % (
                n, t, mmm(row, "create_req"), kinds,
                "%.3f" % float(row["create_s_med"]),
                "%.3f" % float(row["create_s_max"]), mmm(row, "sockets"),
                fmt(row["ar_req_max"]), mmm(row, "split_req"),
                "%.3f" % float(row["split_s_med"]),
                "%.3f" % float(row["split_s_max"]),
                fmt(row["split_sockets_med"]), wall))
    md = ["# Bootstrap cost by number of ranks (bench/scaling.py)", "",
          "Measured by `tools/tcscale.c` under `tcrun -n N` on %d cores "
          "(oversubscribed above that: counts and correctness, not speed); "
          "medians of an even count are the lower middle value; sockets "
          "exclude the store client's own connection(s). CSV: "
          "`scaling.csv`." % os.cpu_count(), ""] + lines
    if failures:
        md += ["", "Failures:", ""]
        for n, t, rc, tail, cmd in failures:
            md += ["- N=%d %s: exit %d, `%s`:" % (n, t, rc, cmd), "",
                   "  ```", *("  " + l for l in tail.splitlines()),
                   "  ```"]
    path_md = os.path.join(a.out, "scaling.md")
    with open(path_md, "w") as f:
        f.write("\n".join(md) + "\n")
    print("scaling.py: wrote %s and %s" % (path_csv, path_md))
    print("\n".join(lines))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
