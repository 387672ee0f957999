#!/usr/bin/env python3
"""FSDP2 (fully_shard) over a torchcomms DeviceMesh, on CPU.

torchcomms.device_mesh.init_device_mesh turns a TorchComm into a DeviceMesh:
fully_shard shards every layer's parameters over it, all-gathers them for
forward and backward and reduce-scatters the gradients (ReduceOp.AVG), all on
the TorchComm. Rank 0 prints the loss per step (the mean over the ranks).
Every rank also trains an unsharded copy of the model on the whole batch (all
ranks' shards) and checks that the losses and the final parameters agree to
1e-5.

    torchrun --nproc_per_node=2 examples/python/train_fsdp.py
"""

import copy
import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard

from torchcomms import new_comm
from torchcomms.device_mesh import init_device_mesh


def batch(step: int, rank: int, w_true: torch.Tensor, device: torch.device):
    gen = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randn(32, 16, generator=gen)
    y = torch.tanh(x @ w_true) + 0.01 * torch.randn(32, 1, generator=gen)
    return x.to(device), y.to(device)


def main() -> int:
    device = torch.device("cpu")
    comm = new_comm("cpu", device, name="main_comm")
    mesh = init_device_mesh(mesh_dim_comms=(comm,), mesh_dim_names=("dp",))
    rank, world_size = comm.get_rank(), comm.get_size()

    torch.manual_seed(0)  # the same initial model everywhere
    model = nn.Sequential(nn.Linear(16, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(),
                          nn.Linear(64, 1)).to(device)
    reference = copy.deepcopy(model)  # trained unsharded, on the whole batch
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    w_true = torch.randn(16, 1, generator=torch.Generator().manual_seed(42))

    worst = 0.0
    losses = []
    for step in range(20):
        x, y = batch(step, rank, w_true, device)
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()  # FSDP2 reduce-scatters the gradients here
        opt.step()
        opt.zero_grad()
        mean_loss = loss.detach().clone()
        dist.all_reduce(mean_loss, op=dist.ReduceOp.AVG, group=mesh.get_group())
        losses.append(mean_loss.item())

        xs, ys = zip(*(batch(step, r, w_true, device) for r in range(world_size)))
        ref_loss = nn.functional.mse_loss(reference(torch.cat(xs)), torch.cat(ys))
        ref_loss.backward()
        ref_opt.step()
        ref_opt.zero_grad()
        worst = max(worst, abs(losses[-1] - ref_loss.item()))
        if rank == 0:
            print(f"step {step:2d}  loss {losses[-1]:.6f}  (unsharded reference "
                  f"{ref_loss.item():.6f})", flush=True)

    # full_tensor() all-gathers each sharded parameter (a DTensor)
    param_diff = max((p.full_tensor() - q).abs().max().item()
                     for p, q in zip(model.parameters(), reference.parameters()))
    dist.destroy_process_group()  # the mesh's groups; finalizes the communicator
    comm.finalize()  # a second finalize is harmless

    if worst > 1e-5 or param_diff > 1e-5:
        print(f"rank {rank}: FAILED: differs from the unsharded reference: loss {worst}, "
              f"parameters {param_diff}", file=sys.stderr)
        return 1
    if not losses[-1] < losses[0]:
        print(f"rank {rank}: FAILED: the loss did not go down: {losses}", file=sys.stderr)
        return 1
    if rank == 0:
        print(f"matches the unsharded reference on {world_size} ranks (loss within {worst:.1e}, "
              f"parameters within {param_diff:.1e}); loss {losses[0]:.4f} -> {losses[-1]:.4f}",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
