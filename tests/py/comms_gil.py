#!/usr/bin/env python3
"""Proves that torchcomms releases the GIL while it blocks (2 ranks).

    TORCHCOMM_RANK=r TORCHCOMM_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=p \\
        python tests/py/comms_gil.py DIR

Rank 0 blocks in three calls that cannot finish before rank 1 joins:
new_comm, a synchronous all_reduce and TorchWork.wait() of an async one.
During each, a Python thread of rank 0 counts to 200 and only then writes a
file DIR/<phase>; rank 1 joins each phase only once that file exists. So
every call returns only if the helper thread ran while the main thread was
inside it, i.e. with the GIL released. Rank 1 gives up after 20 s (and
fails) instead of hanging when the GIL is held.
"""
import os
import sys
import threading
import time
from pathlib import Path

import torch

import torchcomms

STEPS = 200


def wait_file(path, timeout=20.0):
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


def main():
    rank = int(os.environ["TORCHCOMM_RANK"])
    d = Path(sys.argv[1])
    phases = ["create", "sync", "async"]
    if rank == 1:
        ok = True
        for phase in phases:
            if not wait_file(d / phase):
                print(f"rank 1: FAIL: rank 0 never signalled '{phase}' (GIL held?)",
                      flush=True)
                ok = False
            if phase == "create":
                comm = torchcomms.new_comm("cpu", "cpu", name="gil")
            else:
                t = torch.ones(8)
                comm.all_reduce(t, torchcomms.ReduceOp.SUM)
                ok = ok and bool((t == 2).all())
        comm.finalize()
        return 0 if ok else 1

    counter = [0]
    seen = {}
    comm = None

    def helper(name, started):
        started.wait()
        time.sleep(0.1)  # the main thread is inside the blocking call by now
        for _ in range(STEPS):
            counter[0] += 1
            time.sleep(0.0005)
        (d / name).touch()

    def blocking(phase):
        nonlocal comm
        if phase == "create":
            comm = torchcomms.new_comm("cpu", "cpu", name="gil")
            return True
        t = torch.ones(8)
        if phase == "sync":
            comm.all_reduce(t, torchcomms.ReduceOp.SUM)
        else:
            w = comm.all_reduce(t, torchcomms.ReduceOp.SUM, async_op=True)
            w.wait()
        return bool((t == 2).all())

    ok = True
    for phase in phases:
        started = threading.Event()
        th = threading.Thread(target=helper, args=(phase, started))
        th.start()
        before = counter[0]
        started.set()
        ok = blocking(phase) and ok
        seen[phase] = counter[0] - before
        th.join()
    comm.finalize()
    ok = ok and all(v == STEPS for v in seen.values())
    print(f"rank 0: counted during blocking calls: {seen}", flush=True)
    print("GIL OK" if ok else "rank 0: FAIL", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
