#!/usr/bin/env python3
"""A 1-D halo exchange written with one-sided windows (torchcomms'
TorchCommWindow: put, signal, wait_signal).

The heat equation u_t = u_xx on a ring of CELLS cells, split evenly across
the ranks. Every step, each rank needs the last cell of its left neighbour
and the first cell of its right neighbour (its "halos"). Instead of a
send/recv pair, each rank *puts* its two edge cells straight into its
neighbours' windows and signals them; a rank posts nothing to receive: it
waits for its neighbours' signals, and the values are already in its
window. The halo slots alternate between two copies by step parity, so a
neighbour one step ahead never overwrites a halo still being read.

On one host the window is shared memory the neighbours map (a put is a
copy into the neighbour's memory); over TCP (TORCHCOMMS_CPU_TRANSPORT=tcp,
or several hosts) the neighbour's window service writes it.

Every rank then sends its cells to rank 0 (all_gather), which checks them
against the same steps computed on the whole ring in one process.

    torchrun --nproc_per_node=4 examples/python/window_put_signal.py
"""

import sys

import torch
from torchcomms import new_comm

CELLS = 240
STEPS = 200
ALPHA = 0.25


def step(u: torch.Tensor, left: torch.Tensor, right: torch.Tensor) -> torch.Tensor:
    """One explicit step on cells u with the neighbouring cells left and right."""
    ext = torch.cat([left, u, right])
    return u + ALPHA * (ext[:-2] - 2 * u + ext[2:])


def initial() -> torch.Tensor:
    x = torch.arange(CELLS, dtype=torch.float64)
    return torch.exp(-((x - CELLS / 3) ** 2) / 50.0) + (x > 2 * CELLS / 3).double()


def main() -> int:
    device = torch.device("cpu")
    comm = new_comm("cpu", device, name="halo_comm")
    rank, n = comm.get_rank(), comm.get_size()
    if CELLS % n:
        print(f"Rank {rank}: {CELLS} cells do not split over {n} ranks", file=sys.stderr)
        return 1
    m = CELLS // n
    left_rank, right_rank = (rank - 1) % n, (rank + 1) % n
    u = initial()[rank * m:(rank + 1) * m].clone()

    # This rank's window: [from the left (even step), from the left (odd),
    #                      from the right (even), from the right (odd)].
    # tensor_register moves `halo` onto the window's memory: it reads what
    # the neighbours put.
    halo = torch.zeros(4, dtype=torch.float64, device=device)
    win = comm.new_window()
    win.tensor_register(halo)

    for s in range(STEPS):
        p = s % 2
        # my first cell is my left neighbour's "from the right" halo, my last
        # cell my right neighbour's "from the left" halo
        win.put(u[:1], left_rank, 2 + p, async_op=False)
        win.put(u[-1:], right_rank, p, async_op=False)
        win.signal(left_rank, async_op=False)
        win.signal(right_rank, async_op=False)
        # one signal from each neighbour (twice the same rank on a ring of 2)
        win.wait_signal(left_rank, async_op=False)
        win.wait_signal(right_rank, async_op=False)
        u = step(u, halo[p:p + 1], halo[2 + p:3 + p])

    win.tensor_deregister()  # collective: a barrier first, then the window goes

    gathered = [torch.empty(m, dtype=torch.float64) for _ in range(n)]
    comm.all_gather(gathered, u, async_op=False)
    ok = True
    if rank == 0:
        ref = initial()
        for _ in range(STEPS):
            ref = step(ref, ref[-1:], ref[:1])
        got = torch.cat(gathered)
        ok = torch.equal(got, ref)
        if ok:
            print(f"window_put_signal: heat equation, {CELLS} cells, {STEPS} steps: the halo "
                  f"exchange matches the reference on {n} ranks", flush=True)
        else:
            worst = (got - ref).abs().max().item()
            print(f"window_put_signal: FAILED: differs from the reference by up to {worst}",
                  file=sys.stderr)
    comm.finalize()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
