#!/usr/bin/env python3
"""DistributedDataParallel over torchcomms, on CPU.

The "torchcomms" c10d backend (registered by torchcomms.register_c10d_backend())
makes torch.distributed's default process group run on a TorchComm: DDP
broadcasts rank 0's parameters and averages the gradients (all_reduce, one per
bucket, asynchronous, read through their futures) over it. Each rank trains on
its own shard of a learnable regression task; rank 0 prints the loss per step
(the mean over the ranks). At the end every rank checks that its parameters
are bit-identical to rank 0's and that the loss went down.

    torchrun --nproc_per_node=2 examples/python/train_ddp.py
"""

import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import torchcomms


def main() -> int:
    torchcomms.register_c10d_backend()
    dist.init_process_group(backend="torchcomms")  # rank and size from torchrun
    rank, world_size = dist.get_rank(), dist.get_world_size()

    torch.manual_seed(1234 + rank)  # different on purpose: DDP broadcasts rank 0's
    model = nn.Sequential(nn.Linear(16, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(),
                          nn.Linear(64, 1))
    ddp = DDP(model, bucket_cap_mb=0.01)  # a few buckets: several all_reduces in flight
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)

    gen = torch.Generator().manual_seed(42)
    w_true = torch.randn(16, 1, generator=gen)
    gen.manual_seed(1000 + rank)
    x = torch.randn(128, 16, generator=gen)
    y = torch.tanh(x @ w_true) + 0.01 * torch.randn(128, 1, generator=gen)

    losses = []
    for step in range(20):
        opt.zero_grad()
        loss = nn.functional.mse_loss(ddp(x), y)
        loss.backward()  # DDP all-reduces the gradients here
        opt.step()
        mean_loss = loss.detach().clone()
        dist.all_reduce(mean_loss, op=dist.ReduceOp.AVG)
        losses.append(mean_loss.item())
        if rank == 0:
            print(f"step {step:2d}  loss {losses[-1]:.6f}", flush=True)

    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    ref = flat.clone()
    dist.broadcast(ref, src=0)
    identical = torch.equal(flat, ref)
    dist.destroy_process_group()

    if not identical:
        print(f"rank {rank}: FAILED: parameters differ from rank 0's", file=sys.stderr)
        return 1
    if not losses[-1] < losses[0]:
        print(f"rank {rank}: FAILED: the loss did not go down: {losses}", file=sys.stderr)
        return 1
    if rank == 0:
        print(f"parameters identical on all {world_size} ranks; "
              f"loss {losses[0]:.4f} -> {losses[-1]:.4f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
