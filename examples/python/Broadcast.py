#!/usr/bin/env python3
"""Broadcast with torchcomms on CPU: rank 0's tensor replaces everybody's.

Rank 0 fills a float64 tensor with 0, 0.5, 1.0, ...; the other ranks start
with -1 and end up with rank 0's values. A second broadcast from the last
rank shows that any rank can be the root.

    torchrun --nproc_per_node=4 examples/python/Broadcast.py
"""

import sys

import torch
from torchcomms import new_comm


def main() -> int:
    device = torch.device("cpu")
    torchcomm = new_comm("cpu", device, name="main_comm")
    rank = torchcomm.get_rank()
    world_size = torchcomm.get_size()

    n = 4096
    root = 0
    if rank == root:
        tensor = torch.arange(n, dtype=torch.float64, device=device) / 2
    else:
        tensor = torch.full((n,), -1.0, dtype=torch.float64, device=device)
    print(f"Rank {rank}: Before Broadcast: {tensor[1].item()}", flush=True)
    torchcomm.broadcast(tensor, root, async_op=False)
    print(f"Rank {rank}: After Broadcast: {tensor[1].item()}", flush=True)
    ok = torch.equal(tensor, torch.arange(n, dtype=torch.float64, device=device) / 2)

    last = world_size - 1
    flag = torch.tensor([rank == last], dtype=torch.bool, device=device)
    torchcomm.broadcast(flag, last, async_op=True).wait()
    ok = ok and bool(flag.item())

    torchcomm.finalize()
    if not ok:
        print(f"Rank {rank}: FAILED: wrong broadcast result", file=sys.stderr)
        return 1
    print(f"Rank {rank}: Broadcast example completed", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
