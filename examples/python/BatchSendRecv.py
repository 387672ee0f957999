#!/usr/bin/env python3
"""Batched point-to-point with torchcomms on CPU.

Every rank posts a send to every rank (itself included) and a receive from
every rank into one BatchSendRecv, then issues it as one operation: the ops of
a batch may complete in any order, so this all-to-all exchange cannot
deadlock however the calls are ordered. Rank r sends 1000 * r + p to rank p.

    torchrun --nproc_per_node=4 examples/python/BatchSendRecv.py
"""

import sys

import torch
from torchcomms import new_comm


def main() -> int:
    device = torch.device("cpu")
    torchcomm = new_comm("cpu", device, name="main_comm")
    rank = torchcomm.get_rank()
    world_size = torchcomm.get_size()

    count = 8
    sends = [torch.full((count,), 1000 * rank + p, dtype=torch.int32, device=device)
             for p in range(world_size)]
    recvs = [torch.full((count,), -1, dtype=torch.int32, device=device)
             for _ in range(world_size)]

    batch = torchcomm.batch_op_create()
    for p in range(world_size):
        batch.send(sends[p], p)
        batch.recv(recvs[p], p)
    work = batch.issue(async_op=True)
    work.wait()

    print(f"Rank {rank}: received {[t[0].item() for t in recvs]}", flush=True)
    ok = all(bool((recvs[p] == 1000 * p + rank).all()) for p in range(world_size))
    torchcomm.finalize()
    if not ok:
        print(f"Rank {rank}: FAILED: expected {[1000 * p + rank for p in range(world_size)]}",
              file=sys.stderr)
        return 1
    print(f"Rank {rank}: BatchSendRecv example completed", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
