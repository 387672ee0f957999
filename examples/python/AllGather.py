#!/usr/bin/env python3
"""AllGather with torchcomms on CPU: every rank contributes a tensor and
receives everybody's.

Shows the two forms: all_gather into a list of world-size tensors, and
all_gather_single into one tensor of world_size * n elements (rank i's data
at [i * n, (i + 1) * n)).

    torchrun --nproc_per_node=4 examples/python/AllGather.py
"""

import sys

import torch
from torchcomms import new_comm


def main() -> int:
    device = torch.device("cpu")
    torchcomm = new_comm("cpu", device, name="main_comm")
    rank = torchcomm.get_rank()
    world_size = torchcomm.get_size()

    n = 8
    # rank r contributes [100 r, 100 r + 1, ..., 100 r + n - 1]
    mine = torch.arange(n, dtype=torch.int32, device=device) + 100 * rank

    gathered = [torch.empty(n, dtype=torch.int32, device=device) for _ in range(world_size)]
    torchcomm.all_gather(gathered, mine, async_op=False)

    flat = torch.empty(world_size * n, dtype=torch.int32, device=device)
    torchcomm.all_gather_single(flat, mine, async_op=False)

    print(f"Rank {rank}: gathered first elements {[t[0].item() for t in gathered]}", flush=True)

    expected = [torch.arange(n, dtype=torch.int32, device=device) + 100 * r
                for r in range(world_size)]
    ok = all(torch.equal(g, e) for g, e in zip(gathered, expected))
    ok = ok and torch.equal(flat, torch.cat(expected))
    torchcomm.finalize()
    if not ok:
        print(f"Rank {rank}: FAILED: gathered {gathered} / {flat}", file=sys.stderr)
        return 1
    print(f"Rank {rank}: AllGather example completed", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
