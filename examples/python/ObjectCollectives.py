#!/usr/bin/env python3
"""Object collectives (torchcomms.objcol) on CPU: any picklable Python
object instead of a tensor.

    torchrun --nproc_per_node=4 examples/python/ObjectCollectives.py

With the default serializer (torch.save) only "weights-only safe" objects
(containers, numbers, strings, tensors, None) are accepted on the receiving
side; pass weights_only=False for arbitrary objects, from trusted peers only.
"""

import sys

import torch
from torchcomms import new_comm, objcol


def main() -> int:
    device = torch.device("cpu")
    comm = new_comm("cpu", device, name="main_comm")
    rank = comm.get_rank()
    world_size = comm.get_size()
    errors = []

    def check(what, got, expected):
        if got != expected:
            errors.append(f"{what}: got {got!r}, expected {expected!r}")

    def obj_of(r):
        return {"rank": r, "name": f"worker-{r}", "values": list(range(r + 1))}

    # all_gather_object: every rank gets everybody's object.
    gathered = [None] * world_size
    objcol.all_gather_object(comm, gathered, obj_of(rank))
    check("all_gather_object", gathered, [obj_of(r) for r in range(world_size)])

    # gather_object: only the root gets the list.
    root = world_size - 1
    out = [None] * world_size if rank == root else None
    objcol.gather_object(comm, obj_of(rank), root, out)
    if rank == root:
        check("gather_object", out, [obj_of(r) for r in range(world_size)])

    # broadcast_object_list: rank 0's list replaces everybody's.
    config = ["lr", 0.1, {"layers": [4, 8, 4]}, None]
    objects = list(config) if rank == 0 else [None] * len(config)
    objcol.broadcast_object_list(comm, objects, root=0)
    check("broadcast_object_list", objects, config)

    # scatter_object_list: rank i gets the i-th object of the root's list.
    out = [None]
    inputs = [("shard", r, "x" * r) for r in range(world_size)] if rank == 0 else None
    objcol.scatter_object_list(comm, 0, out, inputs)
    check("scatter_object_list", out[0], ("shard", rank, "x" * rank))

    # send_object_list / recv_object_list around a ring. The calls block, so
    # rank 0 sends first and every other rank receives first: the messages
    # travel around the ring without a cycle of waiting senders.
    if world_size > 1:
        nxt, prv = (rank + 1) % world_size, (rank - 1) % world_size
        msg = [f"hello from {rank}", torch.full((3,), float(rank))]
        got = [None, None]
        if rank == 0:
            objcol.send_object_list(comm, msg, dst=nxt)
            objcol.recv_object_list(comm, got, src=prv)
        else:
            objcol.recv_object_list(comm, got, src=prv)
            objcol.send_object_list(comm, msg, dst=nxt)
        check("recv_object_list[0]", got[0], f"hello from {prv}")
        if not torch.equal(got[1], torch.full((3,), float(prv))):
            errors.append(f"recv_object_list[1]: got {got[1]!r}")

    print(f"Rank {rank}: all_gather_object -> {[g['name'] for g in gathered]}", flush=True)
    comm.finalize()
    if errors:
        for e in errors:
            print(f"Rank {rank}: FAILED: {e}", file=sys.stderr)
        return 1
    print(f"Rank {rank}: Object collectives example completed", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
