#!/usr/bin/env python3
"""Synchronous AllReduce with torchcomms on CPU (the quick start).

Every rank fills a tensor with rank + 1 and sums it across all ranks; the
call blocks until the result is in place.

    torchrun --nproc_per_node=4 examples/python/AllReduceSync.py

prints, for 4 ranks, "Rank r: Before AllReduce: r+1" and
"Rank r: After AllReduce: 10.0" on every rank.
"""

import sys

import torch
from torchcomms import new_comm, ReduceOp


def main() -> int:
    device = torch.device("cpu")
    torchcomm = new_comm("cpu", device, name="main_comm")

    rank = torchcomm.get_rank()
    world_size = torchcomm.get_size()
    print(f"Rank {rank}/{world_size}: Starting synchronous AllReduce example on device {device}",
          flush=True)

    tensor_size = 1024
    tensor = torch.full((tensor_size,), float(rank + 1), dtype=torch.float32, device=device)
    print(f"Rank {rank}: Before AllReduce: {tensor[0].item()}", flush=True)

    # Blocks until every rank has contributed and the sum is in `tensor`.
    torchcomm.all_reduce(tensor, ReduceOp.SUM, async_op=False)
    print(f"Rank {rank}: After AllReduce: {tensor[0].item()}", flush=True)

    expected = world_size * (world_size + 1) / 2
    ok = bool((tensor == expected).all())
    torchcomm.finalize()
    if not ok:
        print(f"Rank {rank}: FAILED: expected {expected} everywhere", file=sys.stderr)
        return 1
    print(f"Rank {rank}: Synchronous AllReduce example completed", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
