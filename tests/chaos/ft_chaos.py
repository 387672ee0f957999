#!/usr/bin/env python3
"""Chaos runs of examples/python/fault_tolerant_training.py (make chaos-ft).

RUNS jobs for every world size (3, 4) and transport (shm, tcp), each with a
random victim, kill step and point in the step (seeded: --seed). Every job
must recover (the survivors go on, the replacement joins, every worker exits
0) with final parameters bitwise equal to the failure-free reference and no
shared-memory segment of its workers left in /dev/shm. Prints one line per
job, then: recovered n/n, time from the kill to the first step completed by
the survivors (median, max) per configuration and overall, and the
torchcomms names in /dev/shm before and after (all of them, any job's: the
per-job check above is the one that counts ours).

    .venv/bin/python tests/chaos/ft_chaos.py --runs 20 --seed 1

A failed job prints its seed; rerun it alone with
    .venv/bin/python examples/python/fault_tolerant_training.py -n N --seed SEED
(and TORCHCOMMS_CPU_TRANSPORT=tcp for a tcp job).
"""

import argparse
import os
import random
import statistics
import sys
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# imported by name: the workers (multiprocessing, forkserver) find their
# function by module name
sys.path.insert(0, str(ROOT / "examples" / "python"))
import fault_tolerant_training as ft  # noqa: E402


def shm_names():
    return sorted(n for n in os.listdir("/dev/shm") if n.startswith("torchcomms"))


def ms(xs):
    return f"median {statistics.median(xs) * 1e3:.1f} ms, max {max(xs) * 1e3:.1f} ms"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=20, help="jobs per world size and transport")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--world-sizes", default="3,4")
    ap.add_argument("--transports", default="shm,tcp")
    ap.add_argument("--steps", type=int, default=30)
    args = ap.parse_args()

    rng = random.Random(args.seed)
    before = shm_names()
    results = {}  # (n, transport) -> [recovery seconds of the jobs that passed]
    failures = []
    for transport in args.transports.split(","):
        for n in map(int, args.world_sizes.split(",")):
            results[(n, transport)] = []
            for i in range(args.runs):
                seed = rng.randrange(1 << 30)
                try:  # the workers' own errors go to stderr as they happen
                    s = ft.run(n, args.steps, seed, transport=transport, quiet=True)
                    problems = ([] if s["equal"] else
                                [f"parameters differ (max |diff| {s['max_diff']:.1e})"])
                    problems += [f"left in /dev/shm: {s['shm_left']}"] if s["shm_left"] else []
                    line = (f"worker {s['killed']} killed at step {s['kill_step']:2d} "
                            f"({s['kill_phase']:<17}) recovered in "
                            f"{s['recovery_s'] * 1e3:6.1f} ms, resumed at step "
                            f"{s['resumed_step']:2d}, max |diff| {s['max_diff']:.1e}")
                except Exception:
                    problems, line = [traceback.format_exc(limit=3)], "FAILED"
                print(f"{transport} n={n} run {i + 1:2d} seed {seed:10d}: {line}"
                      + ("" if not problems else "\n  " + "\n  ".join(problems)), flush=True)
                if problems:
                    failures.append((transport, n, seed))
                else:
                    results[(n, transport)].append(s["recovery_s"])
    after = shm_names()

    print("\n== fault-tolerant training chaos: "
          f"{args.runs} runs x world sizes {args.world_sizes} x {args.transports} ==")
    for (n, transport), rec in results.items():
        print(f"{transport} n={n}: recovered {len(rec)}/{args.runs}"
              + (f", kill -> resumed: {ms(rec)}" if rec else ""))
    everything = [r for rec in results.values() for r in rec]
    total = args.runs * len(results)
    print(f"all: recovered {len(everything)}/{total}"
          + (f", kill -> resumed: {ms(everything)}" if everything else ""))
    print(f"/dev/shm torchcomms names: {len(before)} before, {len(after)} after"
          + (f" (new: {sorted(set(after) - set(before))})" if set(after) - set(before) else ""))
    if failures:
        print(f"FAILED: {failures}")
    return 1 if failures or set(after) - set(before) else 0


if __name__ == "__main__":
    sys.exit(main())
