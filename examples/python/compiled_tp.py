#!/usr/bin/env python3
"""A tensor-parallel MLP under torch.compile(fullgraph=True), on CPU.

Megatron-style: the first Linear is split by columns (each rank holds
hidden/N of its outputs), the second by rows; one all_reduce
(torchcomms.functional, a torch custom operator with an autograd formula)
sums the partial outputs. The forward is one compiled graph with no graph
break; its backward (compiled by AOTAutograd) runs the all_reduce's
derivative. Every rank checks its output and its
gradient shards against the unsharded model computed locally from the same
seed (float64, to 1e-6).

    torchrun --nproc_per_node=2 examples/python/compiled_tp.py
"""

import sys

import torch

import torchcomms
import torchcomms.functional as F
from torchcomms import ReduceOp

BATCH, DIM, HIDDEN = 8, 16, 32


def main() -> int:
    comm = torchcomms.new_comm("cpu", torch.device("cpu"), name="tp")
    rank, n = comm.get_rank(), comm.get_size()
    assert HIDDEN % n == 0, f"HIDDEN={HIDDEN} must divide by the {n} ranks"
    shard = slice(rank * HIDDEN // n, (rank + 1) * HIDDEN // n)

    torch.manual_seed(0)  # the same full weights and input on every rank
    w1 = torch.randn(DIM, HIDDEN, dtype=torch.float64)
    w2 = torch.randn(HIDDEN, DIM, dtype=torch.float64)
    x = torch.randn(BATCH, DIM, dtype=torch.float64)

    # this rank's shards
    w1s = w1[:, shard].clone().requires_grad_()
    w2s = w2[shard, :].clone().requires_grad_()

    @torch.compile(fullgraph=True)
    def step(x, w1s, w2s):
        partial = torch.relu(x @ w1s) @ w2s           # this rank's share of y
        y = F.all_reduce(comm, partial, ReduceOp.SUM)  # y on every rank
        loss = (y * y).sum() / n                       # each rank's share of the loss
        return y, loss

    y, loss = step(x, w1s, w2s)
    loss.backward()  # the compiled backward graph (AOTAutograd), collectives included

    # the unsharded reference
    rw1, rw2 = w1.clone().requires_grad_(), w2.clone().requires_grad_()
    ry = torch.relu(x @ rw1) @ rw2
    (ry * ry).sum().backward()

    diff = max((y - ry).abs().max().item(),
               (w1s.grad - rw1.grad[:, shard]).abs().max().item(),
               (w2s.grad - rw2.grad[shard, :]).abs().max().item())
    ok = diff <= 1e-6
    # every rank's verdict, on rank 0
    verdicts = torch.tensor([1.0 if ok else 0.0], dtype=torch.float64)
    comm.all_reduce(verdicts, ReduceOp.MIN)
    worst = torch.tensor([diff], dtype=torch.float64)
    comm.all_reduce(worst, ReduceOp.MAX)
    if rank == 0:
        if verdicts.item() == 1.0:
            print(f"compiled TP MLP (forward + backward) matches the unsharded reference "
                  f"on {n} ranks (max |diff| {worst.item():.1e})")
        else:
            print(f"compiled TP MLP differs from the reference by {worst.item():.3e}")
    comm.finalize()
    return 0 if verdicts.item() == 1.0 else 1


if __name__ == "__main__":
    sys.exit(main())
