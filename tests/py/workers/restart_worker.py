"""A job that dies after creating communicators in attempts 0 and 1 and
succeeds in attempt 2 (torchrun --max-restarts=2): every attempt must start
promptly, whatever the attempts before it left in torchrun's store."""
import os
import sys
import time

import torch
from torchcomms import ReduceOp, new_comm


def main() -> int:
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    t0 = time.monotonic()
    comm = new_comm("cpu", torch.device("cpu"), name="main")
    rank, size = comm.get_rank(), comm.get_size()
    sub = comm.split(list(range(size)), "sub")  # a second communicator's keys too
    took = time.monotonic() - t0
    t = torch.full((5,), float(rank + 1))
    comm.all_reduce(t, ReduceOp.SUM, async_op=False)
    sub.all_reduce(t, ReduceOp.MAX, async_op=False)
    want = size * (size + 1) / 2
    assert t.tolist() == [want] * 5, t.tolist()
    print(f"attempt {attempt} rank {rank}: created in {took:.2f} s, sum ok", flush=True)
    if attempt < 2:
        # every rank's line is out before any rank dies (torchrun stops the
        # others at the first death: a rank still printing would lose it)
        comm.barrier(async_op=False)
        # dies without finalize, like a job that crashed after creation
        os._exit(17 if rank == size - 1 else 0)
    sub.finalize()
    comm.finalize()
    print(f"attempt {attempt} rank {rank}: done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
