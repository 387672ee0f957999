#!/usr/bin/env python3
"""Ranks as threads of one Python process (torchft's and torch's threaded
test cases run replica groups that way): 2 threads, each rank r of one
communicator over a shared torch HashStore, N 8-byte all_reduces each;
prints the slower thread's time per operation.

It shows what the GIL costs when a peer rank is another thread of the same
interpreter (docs/benchmarks.md, "the GIL kept over a call that does not
block"): the extension keeps the GIL over a call only when its thread is
the interpreter's only Python thread, so here every call lets it go.

Run: .venv/bin/python bench/py_threads.py [N]   (default 2000)
"""
import os
import sys
import threading
import time

import torch
import torch.distributed as dist

import torchcomms


def main():
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
    for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHCOMM_RANK",
              "TORCHCOMM_SIZE"):
        os.environ.pop(k, None)
    store = dist.HashStore()
    per_op, errors = {}, []

    def body(r):
        try:
            c = torchcomms.new_comm("cpu", "cpu", name="py_threads", store=store, rank=r, size=2)
            t = torch.ones(2)
            for _ in range(50):  # warm-up
                c.all_reduce(t, torchcomms.ReduceOp.MAX)
            t0 = time.perf_counter()
            for _ in range(n):
                c.all_reduce(t, torchcomms.ReduceOp.MAX)
            per_op[r] = (time.perf_counter() - t0) / n * 1e6
            c.finalize()
        except BaseException as e:  # noqa: B902 -- reported below
            errors.append(f"rank {r}: {e!r}")

    threads = [threading.Thread(target=body, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        print("\n".join(errors), file=sys.stderr)
        return 1
    print(f"2 ranks as threads, 8-byte all_reduce: {max(per_op.values()):.1f} us/op")
    return 0


if __name__ == "__main__":
    sys.exit(main())
