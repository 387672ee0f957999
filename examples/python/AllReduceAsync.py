#!/usr/bin/env python3
"""Asynchronous AllReduce with torchcomms on CPU.

all_reduce(..., async_op=True) returns a TorchWork right away; the result is
in the tensor once work.wait() returns. Several operations can be in flight:
here two tensors are reduced (SUM and MAX) and waited on together.

    torchrun --nproc_per_node=4 examples/python/AllReduceAsync.py
"""

import sys

import torch
from torchcomms import new_comm, ReduceOp


def main() -> int:
    device = torch.device("cpu")
    torchcomm = new_comm("cpu", device, name="main_comm")

    rank = torchcomm.get_rank()
    world_size = torchcomm.get_size()
    print(f"Rank {rank}/{world_size}: Starting asynchronous AllReduce example on device {device}",
          flush=True)

    tensor_size = 1024
    tensor = torch.full((tensor_size,), float(rank + 1), dtype=torch.float32, device=device)
    ranks = torch.full((16,), rank, dtype=torch.int64, device=device)
    print(f"Rank {rank}: Before AllReduce: {tensor[0].item()}", flush=True)

    work = torchcomm.all_reduce(tensor, ReduceOp.SUM, async_op=True)
    work_max = torchcomm.all_reduce(ranks, ReduceOp.MAX, async_op=True)

    # Other work can run here while the reductions progress.
    print(f"Rank {rank}: AllReduce operations started, doing other work...", flush=True)
    local = sum(i * i for i in range(1000))

    work.wait()
    work_max.wait()
    print(f"Rank {rank}: After AllReduce: {tensor[0].item()} (max rank {ranks[0].item()})",
          flush=True)

    expected = world_size * (world_size + 1) / 2
    ok = (bool((tensor == expected).all()) and bool((ranks == world_size - 1).all())
          and work.is_completed() and local == 332833500)
    torchcomm.finalize()
    if not ok:
        print(f"Rank {rank}: FAILED: expected {expected} and max rank {world_size - 1}",
              file=sys.stderr)
        return 1
    print(f"Rank {rank}: Asynchronous AllReduce example completed", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
