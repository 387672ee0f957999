"""Ranks calling different collectives: every rank raises at once with a
message naming both sides, nobody gets a result (run under torchrun -n 2 or
3; the last rank is the odd one)."""
import os
import sys
import time
from datetime import timedelta

import torch
from torchcomms import ReduceOp, new_comm


def all_read(n):
    """Waits (through torchrun's store, 30 s at most) until every rank has
    read its own error."""
    import torch.distributed as dist
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                          is_master=False, timeout=timedelta(seconds=30))
    if store.add("mismatch_worker/read", 1) == n:
        store.set("mismatch_worker/all_read", "1")
    store.wait(["mismatch_worker/all_read"])


def main() -> int:
    comm = new_comm("cpu", torch.device("cpu"), name="mm", timeout=30)
    r, n = comm.get_rank(), comm.get_size()
    odd = r == n - 1
    cases = [
        # float32 against int32 of the same byte size
        (lambda: torch.ones(1024, dtype=torch.int32 if odd else torch.float32),
         lambda t: comm.all_reduce(t, ReduceOp.SUM, async_op=False),
         "int32 with SUM"),
        # all_reduce against broadcast: the broadcast side must fail too (the
        # root of a small broadcast over shared memory does not wait for its
        # receivers: it finds the mismatch at its next operation,
        # docs/reliability.md)
        (lambda: torch.ones(256),
         lambda t: ((comm.broadcast(t, n - 1, async_op=False),
                     comm.all_reduce(torch.ones(1), ReduceOp.SUM, async_op=False)) if odd
                    else comm.all_reduce(t, ReduceOp.SUM, async_op=False)),
         "broadcast #1 of 256 float32 from root"),
    ]
    which = int(sys.argv[1])
    make, call, want = cases[which]
    t = make()
    t0 = time.monotonic()
    try:
        call(t)
        print(f"rank {r}: NO ERROR", flush=True)
        return 1
    except RuntimeError as e:
        took = time.monotonic() - t0
        msg = str(e)
        ok = "mismatched collectives" in msg and want in msg and took < 10
        print(f"rank {r}: {'OK' if ok else 'BAD'} {took:.3f}s {msg}", flush=True)
        all_read(n)  # nobody exits (closing its connections) before every rank read its error
        comm.abort()
        return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
