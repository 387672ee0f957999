"""mh_torch.py -- the Python check of the multi-host test bed (bed.sh test):
one torchcomms communicator on backend "cpu" across the emulated hosts
(rank and store from tcrun's torchrun-style environment), one all_reduce of
a torch tensor checked exactly, and an all_gather of the host names showing
that the ranks run on the hosts tcrun says (GROUP_RANK)."""

import os
import socket
import sys

import torch
import torchcomms


def main() -> int:
    comm = torchcomms.new_comm("cpu", torch.device("cpu"), name="mh_py")
    rank, size = comm.get_rank(), comm.get_size()
    node = int(os.environ["GROUP_RANK"])
    t = torch.arange(1000, dtype=torch.float32) + float(rank + 1)
    comm.all_reduce(t, torchcomms.ReduceOp.SUM, async_op=False)
    want = torch.arange(1000, dtype=torch.float32) * size + size * (size + 1) / 2
    if not torch.equal(t, want):
        bad = int((t != want).nonzero()[0])
        print(f"mh_torch: rank {rank}: FAIL all_reduce sum: t[{bad}] = {t[bad].item()}, "
              f"expected {want[bad].item()}", file=sys.stderr, flush=True)
        return 1
    host = socket.gethostname()
    mine = torch.zeros(64, dtype=torch.uint8)
    mine[: len(host)] = torch.tensor(list(host.encode()), dtype=torch.uint8)
    mine[63] = node
    hosts = torch.zeros(64 * size, dtype=torch.uint8)
    comm.all_gather_single(hosts, mine, async_op=False)
    names = {}
    for r in range(size):
        row = hosts[64 * r: 64 * (r + 1)]
        names.setdefault(int(row[63]), set()).add(bytes(row[:63].tolist()).rstrip(b"\0"))
    distinct = {n for s in names.values() for n in s}
    if any(len(s) != 1 for s in names.values()) or len(distinct) != len(names):
        print(f"mh_torch: rank {rank}: FAIL host names by node: {names}", file=sys.stderr,
              flush=True)
        return 1
    comm.finalize()
    print(f"mh_torch: rank {rank} of {size} on host {host}: all_reduce of a torch tensor "
          f"over {len(names)} hosts exact; OK", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
