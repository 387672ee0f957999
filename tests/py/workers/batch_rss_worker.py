"""One rank of tests/py/test_handles_rss.py: --issues Python batch issues
(batch_op_create, send, recv, issue) after --warmup more, sampling the
resident set before and after; prints one line "BATCHRSS {json}".

With 2 ranks each batch sends to and receives from the other rank; with 1,
a self send/recv. Issues alternate between synchronous and asynchronous
(issue(async_op=True).wait()). The first pass through the shared-memory transport's rings
pages them in (they enter RSS as shared pages, up to their fixed size: 2 x 2
MiB per peer at the default TORCHCOMMS_SHM_BYTES), so the warm-up must cover
more bytes than a ring; what comes after must not grow.
"""
import argparse
import gc
import json
import os
import sys
import time

PAGE = os.sysconf("SC_PAGE_SIZE")


def statm_kib():
    with open("/proc/self/statm") as f:
        v = f.read().split()
    return int(v[1]) * PAGE // 1024, int(v[2]) * PAGE // 1024


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--issues", type=int, default=60000)
    ap.add_argument("--warmup", type=int, default=40000)
    args = ap.parse_args()
    import torch
    import torchcomms

    torch.set_num_threads(1)
    comm = torchcomms.new_comm("cpu", torch.device("cpu"), name="batch-rss")
    r, n = comm.get_rank(), comm.get_size()
    other, prev = (r + 1) % n, (r - 1) % n
    out = torch.empty(7, dtype=torch.float32)
    mine = torch.full((7,), float(r), dtype=torch.float32)

    def one(i):
        b = comm.batch_op_create()
        b.send(mine, other)
        b.recv(out, prev)
        if i % 2:
            b.issue(async_op=True).wait()
        else:
            b.issue(async_op=False)
        if i % 1000 == 0 and float(out[6]) != float(prev):
            raise SystemExit(f"[rank {r}] wrong value at issue {i}: {out.tolist()}")

    for i in range(args.warmup):
        one(i)
    comm.barrier(async_op=False)
    gc.collect()
    rss0, sh0 = statm_kib()
    t0 = time.monotonic()
    for i in range(args.issues):
        one(i)
    t1 = time.monotonic()
    comm.barrier(async_op=False)
    gc.collect()
    rss1, sh1 = statm_kib()
    comm.finalize()
    print("BATCHRSS " + json.dumps({
        "rank": r, "issues": args.issues, "warmup": args.warmup, "seconds": round(t1 - t0, 2),
        "rss_kib": [rss0, rss1], "private_kib": [rss0 - sh0, rss1 - sh1]}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
