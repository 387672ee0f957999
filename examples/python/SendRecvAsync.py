#!/usr/bin/env python3
"""Asynchronous send/recv around a ring with torchcomms on CPU.

Rank r sends a tensor filled with r to rank r+1 and receives one from rank
r-1 (mod world size), issuing both with async_op=True and then waiting on the
two TorchWork handles. Operations of one communicator run in issue order, so
even ranks send first and odd ranks receive first, as in the blocking version.

    torchrun --nproc_per_node=4 examples/python/SendRecvAsync.py
"""

import sys

import torch
from torchcomms import new_comm


def main() -> int:
    device = torch.device("cpu")
    torchcomm = new_comm("cpu", device, name="main_comm")

    rank = torchcomm.get_rank()
    world_size = torchcomm.get_size()
    print(f"Rank {rank}/{world_size}: Starting asynchronous send/recv example on device {device}",
          flush=True)

    tensor_size = 1024
    send_tensor = torch.full((tensor_size,), float(rank), dtype=torch.float32, device=device)
    recv_tensor = torch.zeros(tensor_size, dtype=torch.float32, device=device)

    send_rank = (rank + 1) % world_size
    recv_rank = (rank - 1 + world_size) % world_size
    print(f"Rank {rank}: Sending to rank {send_rank}, receiving from rank {recv_rank}", flush=True)

    send_work = recv_work = None
    if world_size == 1:
        recv_tensor.copy_(send_tensor)  # a ring of one: nothing to exchange
    elif rank % 2 == 0:
        send_work = torchcomm.send(send_tensor, send_rank, async_op=True)
        recv_work = torchcomm.recv(recv_tensor, recv_rank, async_op=True)
    else:
        recv_work = torchcomm.recv(recv_tensor, recv_rank, async_op=True)
        send_work = torchcomm.send(send_tensor, send_rank, async_op=True)

    if send_work is not None:
        send_work.wait()
        print(f"Rank {rank}: Send operation completed", flush=True)
    if recv_work is not None:
        recv_work.wait()
        print(f"Rank {rank}: Receive operation completed", flush=True)

    ok = bool((recv_tensor == float(recv_rank)).all())
    torchcomm.finalize()
    if not ok:
        print(f"Rank {rank}: FAILED: expected {float(recv_rank)}, got {recv_tensor[0].item()}",
              file=sys.stderr)
        return 1
    print(f"Rank {rank}: Asynchronous send/recv example completed", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
