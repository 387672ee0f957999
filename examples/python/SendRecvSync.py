#!/usr/bin/env python3
"""Synchronous send/recv around a ring with torchcomms on CPU.

Rank r sends a tensor filled with r to rank r+1 and receives one from rank
r-1 (mod world size). Blocking calls in a ring need an order that cannot
deadlock: even ranks send first, odd ranks receive first.

    torchrun --nproc_per_node=4 examples/python/SendRecvSync.py
"""

import sys

import torch
from torchcomms import new_comm


def main() -> int:
    device = torch.device("cpu")
    torchcomm = new_comm("cpu", device, name="main_comm")

    rank = torchcomm.get_rank()
    world_size = torchcomm.get_size()
    print(f"Rank {rank}/{world_size}: Starting synchronous send/recv example on device {device}",
          flush=True)

    tensor_size = 1024
    send_tensor = torch.full((tensor_size,), float(rank), dtype=torch.float32, device=device)
    recv_tensor = torch.zeros(tensor_size, dtype=torch.float32, device=device)

    send_rank = (rank + 1) % world_size
    recv_rank = (rank - 1 + world_size) % world_size
    print(f"Rank {rank}: Sending to rank {send_rank}, receiving from rank {recv_rank}", flush=True)

    if world_size == 1:
        recv_tensor.copy_(send_tensor)  # a ring of one: nothing to exchange
    elif rank % 2 == 0:
        torchcomm.send(send_tensor, send_rank, async_op=False)
        torchcomm.recv(recv_tensor, recv_rank, async_op=False)
    else:
        torchcomm.recv(recv_tensor, recv_rank, async_op=False)
        torchcomm.send(send_tensor, send_rank, async_op=False)

    ok = bool((recv_tensor == float(recv_rank)).all())
    print(f"Rank {rank}: Received {recv_tensor[0].item()} from rank {recv_rank}", flush=True)
    torchcomm.finalize()
    if not ok:
        print(f"Rank {rank}: FAILED: expected {float(recv_rank)}", file=sys.stderr)
        return 1
    print(f"Rank {rank}: Synchronous send/recv example completed", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
