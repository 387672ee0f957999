#!/usr/bin/env python3
"""Soak test: a long mixed loop of small operations from Python, with the
process's resident memory and open descriptors flat.

    .venv/bin/python tests/soak/soak.py [--ops 1000000] [--ranks 2]
        [--rss-growth-kib 2048] [--timeout 1800]

The launcher (this script without --worker) starts --ranks processes of
this script (--worker; rank 0 hosts the store on MASTER_ADDR:MASTER_PORT)
and waits for them with a deadline. Each rank creates one communicator with
`torchcomms.new_comm("cpu", torch.device("cpu"))` and issues --ops
operations: a fixed cycle of all_reduce (sync and async), broadcast,
reduce, all_gather (list and single), reduce_scatter_single,
all_to_all_single, send/recv, a batch of send/recv, barrier, and an
async pair waited together, on tensors of 1 to 64 elements, some allocated
fresh every time (so tensor references held by async operations are
exercised) and every result checked exactly (torch.equal).

After a warm-up (10% of the operations, at least 2,000) each rank samples
its resident set (/proc/self/statm: resident and shared), the number of
entries of /proc/self/fd and of /proc/self/task (threads); it samples again
at the end, after gc.collect(). It fails when its private resident memory
(resident - shared: see statm_kib) grew by more than --rss-growth-kib, or
when the descriptor or thread counts changed. Each
rank prints one JSON line with its figures; the launcher prints a summary
and exits non-zero when a rank failed, hung or exceeded a bound.

`make soak` runs 10^6 operations per rank; tests/py/test_soak.py runs a
short version (20,000) inside `make test`.
"""
import argparse
import gc
import json
import os
import socket
import subprocess
import sys
import time

PAGE = os.sysconf("SC_PAGE_SIZE")


def statm_kib():
    """(resident, shared) from /proc/self/statm, KiB. `shared` counts the
    file-backed and shared-memory pages; the shared-memory transport's
    segments (4 MiB per rank by default, every rank maps all of them) enter
    RSS page by page as the rings advance, so a small-message loop shows RSS
    climbing for a while and then levelling off. Private memory (resident
    minus shared) is what a leak makes grow; that is what is bounded."""
    with open("/proc/self/statm") as f:
        v = f.read().split()
    return int(v[1]) * PAGE // 1024, int(v[2]) * PAGE // 1024


def count(path):
    return len(os.listdir(path))


def sample():
    gc.collect()
    rss, shared = statm_kib()
    return {"rss_kib": rss, "shared_kib": shared, "private_kib": rss - shared,
            "fds": count("/proc/self/fd"), "threads": count("/proc/self/task")}


def worker(args):
    import torch
    import torchcomms
    from torchcomms import ReduceOp

    torch.set_num_threads(1)
    comm = torchcomms.new_comm("cpu", torch.device("cpu"), name="soak")
    r, n = comm.get_rank(), comm.get_size()
    other = (r + 1) % n
    prev = (r - 1) % n

    # fixed inputs and their expected results (small exact integers)
    k = 16
    ones = torch.ones(k, dtype=torch.float32)
    sum_exp = torch.full((k,), float(n * (n + 1) // 2))
    gath_exp = torch.arange(n, dtype=torch.int64).repeat_interleave(8)
    rs_in = torch.arange(n * 4, dtype=torch.float32)
    rs_exp = (torch.arange(4, dtype=torch.float32) + 4 * r) * n
    a2a_in = torch.arange(n * 2, dtype=torch.int32) + 100 * r
    a2a_exp = torch.cat([torch.tensor([2 * r, 2 * r + 1], dtype=torch.int32) + 100 * q
                         for q in range(n)])
    gather_out = [torch.empty(3, dtype=torch.float64) for _ in range(n)]
    gather_exp = [torch.full((3,), float(q)) .double() for q in range(n)]
    ar_out = torch.empty(n * 8, dtype=torch.int64)
    a2a_out = torch.empty(n * 2, dtype=torch.int32)
    rs_out = torch.empty(4, dtype=torch.float32)
    recv_buf = torch.empty(5, dtype=torch.int16)
    batch_recv = torch.empty(7, dtype=torch.bfloat16)
    failures = []

    def check(ok, what, step):
        if not ok:
            failures.append(f"step {step}: {what}")
            raise SystemExit(f"[rank {r}] wrong result at step {step}: {what}")

    def op_all_reduce(step):
        t = torch.full((k,), float(r + 1))          # a fresh tensor every time
        comm.all_reduce(t, ReduceOp.SUM, async_op=False)
        check(torch.equal(t, sum_exp), "all_reduce", step)

    def op_all_reduce_async(step):
        t = torch.full((k,), float(r + 1))
        w = comm.all_reduce(t, ReduceOp.SUM, async_op=True)
        del t                                          # the work keeps it alive
        w.wait()

    def op_broadcast(step):
        t = torch.full((9,), 7.0) if r == step % n else torch.zeros(9)
        comm.broadcast(t, step % n, async_op=False)
        check(bool((t == 7.0).all()), "broadcast", step)

    def op_reduce(step):
        t = ones.clone()
        comm.reduce(t, 0, ReduceOp.SUM, async_op=False)
        check(r != 0 or bool((t == float(n)).all()), "reduce", step)

    def op_all_gather_single(step):
        comm.all_gather_single(ar_out, torch.full((8,), r, dtype=torch.int64), async_op=False)
        check(torch.equal(ar_out, gath_exp), "all_gather_single", step)

    def op_all_gather(step):
        outs = [torch.empty(2, dtype=torch.uint8) for _ in range(n)]
        comm.all_gather(outs, torch.full((2,), r, dtype=torch.uint8), async_op=False)
        check(all(int(o[1]) == q for q, o in enumerate(outs)), "all_gather", step)

    def op_reduce_scatter(step):
        comm.reduce_scatter_single(rs_out, rs_in, ReduceOp.SUM, async_op=False)
        check(torch.equal(rs_out, rs_exp), "reduce_scatter_single", step)

    def op_all_to_all(step):
        comm.all_to_all_single(a2a_out, a2a_in, async_op=False)
        check(torch.equal(a2a_out, a2a_exp), "all_to_all_single", step)

    def op_send_recv(step):
        if n < 2:
            return
        mine = torch.full((5,), r + step % 100, dtype=torch.int16)
        if r % 2 == 0:
            comm.send(mine, other, async_op=False)
            comm.recv(recv_buf, prev, async_op=False)
        else:
            comm.recv(recv_buf, prev, async_op=False)
            comm.send(mine, other, async_op=False)
        check(int(recv_buf[4]) == prev + step % 100, "send/recv", step)

    def op_batch(step):
        b = comm.batch_op_create()
        b.send(torch.full((7,), float(r), dtype=torch.bfloat16), other)
        b.recv(batch_recv, prev)
        b.issue(async_op=True).wait()
        check(float(batch_recv[0]) == float(prev), "batch", step)

    def op_barrier(step):
        comm.barrier(async_op=False)

    def op_gather_pair(step):
        w1 = comm.gather(gather_out if r == 0 else [], torch.full((3,), float(r)).double(),
                         0, async_op=True)
        t = torch.full((k,), float(r + 1))
        w2 = comm.all_reduce(t, ReduceOp.SUM, async_op=True)
        w1.wait()
        w2.wait()
        check(torch.equal(t, sum_exp), "async pair all_reduce", step)
        check(r != 0 or all(torch.equal(a, b) for a, b in zip(gather_out, gather_exp)),
              "gather", step)

    cycle = [op_all_reduce, op_all_reduce_async, op_broadcast, op_reduce,
             op_all_gather_single, op_all_gather, op_reduce_scatter, op_all_to_all,
             op_send_recv, op_batch, op_barrier, op_gather_pair]
    # with an odd cycle length (n odd) send/recv would deadlock: it pairs
    # even with odd ranks only, so require an even world for it
    if n % 2:
        cycle.remove(op_send_recv)
    skip = set(filter(None, args.skip.split(",")))
    cycle = [f for f in cycle if f.__name__[3:] not in skip]

    warm = max(2000, args.ops // 10)
    before = None
    t0 = time.monotonic()
    t_warm = t0
    ops = 0
    step = 0
    while ops < args.ops:
        if ops >= warm and before is None:
            comm.barrier(async_op=False)
            before = sample()
            t_warm = time.monotonic()
            ops_warm = ops
        fn = cycle[step % len(cycle)]
        fn(step)
        ops += 2 if fn in (op_send_recv, op_gather_pair) else 1
        step += 1
    t1 = time.monotonic()
    if before is None:
        before = sample()
        ops_warm = ops
        t_warm = t1
    comm.barrier(async_op=False)
    after = sample()
    comm.finalize()
    res = {"rank": r, "ops": ops, "seconds": round(t1 - t0, 3),
           "rate": round((ops - ops_warm) / max(t1 - t_warm, 1e-9)),
           "before": before, "after": after,
           "rss_growth_kib": after["rss_kib"] - before["rss_kib"],
           "private_growth_kib": after["private_kib"] - before["private_kib"]}
    print("SOAK " + json.dumps(res), flush=True)
    bad = []
    if res["private_growth_kib"] > args.rss_growth_kib:
        bad.append(f"private RSS grew by {res['private_growth_kib']} KiB "
                   f"(bound {args.rss_growth_kib})")
    if after["fds"] != before["fds"]:
        bad.append(f"open descriptors {before['fds']} -> {after['fds']}")
    if after["threads"] != before["threads"]:
        bad.append(f"threads {before['threads']} -> {after['threads']}")
    for b in bad:
        print(f"[rank {r}] FAIL: {b}", file=sys.stderr, flush=True)
    return 1 if bad else 0


OP_NAMES = ("all_reduce", "all_reduce_async", "broadcast", "reduce",
            "all_gather_single", "all_gather", "reduce_scatter", "all_to_all",
            "send_recv", "batch", "barrier", "gather_pair")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(args):
    env = {k: v for k, v in os.environ.items()
           if k not in ("TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_RUN_ID",
                        "TORCHCOMM_RANK", "TORCHCOMM_SIZE", "LOCAL_RANK")}
    env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()),
               WORLD_SIZE=str(args.ranks), OMP_NUM_THREADS="1")
    procs = []
    for r in range(args.ranks):
        e = dict(env, RANK=str(r))
        cmd = [sys.executable, os.path.abspath(__file__), "--worker", "--ops", str(args.ops),
               "--rss-growth-kib", str(args.rss_growth_kib)]
        if args.skip:
            cmd += ["--skip", args.skip]
        procs.append(subprocess.Popen(cmd, env=e, stdout=subprocess.PIPE, text=True))
    deadline = time.monotonic() + args.timeout
    results, failed = [], []
    for r, p in enumerate(procs):
        try:
            out, _ = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            for q in procs:
                q.wait()
            print(f"soak: rank {r} did not finish within {args.timeout} s (hang?)")
            return 1
        for line in out.splitlines():
            if line.startswith("SOAK "):
                results.append(json.loads(line[5:]))
            else:
                print(line)
        if p.returncode != 0:
            failed.append(f"rank {r} exited with {p.returncode}")
    for res in sorted(results, key=lambda x: x["rank"]):
        b, a = res["before"], res["after"]
        print(f"soak rank {res['rank']}: {res['ops']} ops in {res['seconds']} s "
              f"({res['rate']} ops/s after warm-up); RSS {b['rss_kib']} -> {a['rss_kib']} KiB "
              f"({res['rss_growth_kib']:+d}; private {b['private_kib']} -> {a['private_kib']}, "
              f"{res['private_growth_kib']:+d}; shared {b['shared_kib']} -> "
              f"{a['shared_kib']}), fds {b['fds']} -> {a['fds']}, "
              f"threads {b['threads']} -> {a['threads']}")
    if len(results) != args.ranks:
        failed.append(f"{args.ranks - len(results)} rank(s) reported nothing")
    for f in failed:
        print(f"soak: FAIL: {f}")
    return 1 if failed else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ops", type=int, default=1_000_000, help="operations per rank")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--rss-growth-kib", type=int, default=2048)
    ap.add_argument("--timeout", type=float, default=1800, help="seconds, whole run")
    ap.add_argument("--skip", default="",
                    help="operations left out of the cycle, comma-separated: "
                         + ", ".join(OP_NAMES))
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    sys.exit(worker(args) if args.worker else launch(args))


if __name__ == "__main__":
    main()
