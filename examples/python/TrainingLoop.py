#!/usr/bin/env python3
"""Data-parallel training with torchcomms on CPU.

Each rank trains the same small MLP on its own random data. The initial
parameters are broadcast from rank 0; after every backward pass each gradient
is averaged across ranks with all_reduce(ReduceOp.AVG) (issued async, all in
flight together, then waited on), so every rank applies the same update.
Rank 0 prints the loss; at the end the parameters are checked to be
bit-identical on every rank.

    torchrun --nproc_per_node=2 examples/python/TrainingLoop.py
"""

import sys

import torch
from torch import nn
from torchcomms import new_comm, ReduceOp


def main() -> int:
    device = torch.device("cpu")
    comm = new_comm("cpu", device, name="main_comm")
    rank = comm.get_rank()
    world_size = comm.get_size()

    torch.manual_seed(1234 + rank)  # different on purpose: broadcast fixes it
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1)).to(device)
    with torch.no_grad():
        for p in model.parameters():
            comm.broadcast(p, 0, async_op=False)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)

    # A learnable target: y = x . w_true + noise, a different shard per rank.
    gen = torch.Generator().manual_seed(42)
    w_true = torch.randn(16, 1, generator=gen)
    gen.manual_seed(1000 + rank)
    x = torch.randn(256, 16, generator=gen)
    y = x @ w_true + 0.01 * torch.randn(256, 1, generator=gen)
    x, y = x.to(device), y.to(device)

    steps = 30
    first = last = None
    for step in range(steps):
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        works = [comm.all_reduce(p.grad, ReduceOp.AVG, async_op=True)
                 for p in model.parameters()]
        for w in works:
            w.wait()
        opt.step()

        # The global loss: the mean of the per-rank losses.
        global_loss = loss.detach().clone().reshape(1)
        comm.all_reduce(global_loss, ReduceOp.AVG, async_op=False)
        if first is None:
            first = global_loss.item()
        last = global_loss.item()
        if rank == 0 and (step % 5 == 0 or step == steps - 1):
            print(f"step {step:3d}  loss {last:.6f}", flush=True)

    # Every rank must hold exactly the same parameters.
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    everyone = torch.empty(world_size * flat.numel(), dtype=flat.dtype, device=device)
    comm.all_gather_single(everyone, flat, async_op=False)
    identical = all(torch.equal(row, flat) for row in everyone.view(world_size, -1))
    comm.finalize()

    if not identical:
        print(f"Rank {rank}: FAILED: parameters differ across ranks", file=sys.stderr)
        return 1
    if not last < first:
        print(f"Rank {rank}: FAILED: loss did not decrease ({first} -> {last})", file=sys.stderr)
        return 1
    if rank == 0:
        print(f"parameters identical on all {world_size} ranks; loss {first:.4f} -> {last:.4f}",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
