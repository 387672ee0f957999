"""DDP over a _BackendWrapper whose communicator is reconfigured after a rank
dies (tests/py/test_c10d_reconfigure.py).

usage: ddp_reconfig_worker.py RANK WORLD STORE_PORT OUTDIR MODE
MODE: "same" (keep the DDP object across the reconfigure, calling
ddp._update_process_group(group) after it) or "new" (wrap the model in a new
DDP after it).

Every rank: a communicator with enable_reconfigure=True (no members yet),
wrapped in a _BackendWrapper; the init handles are exchanged through the
test's TCPStore and the group reconfigured into WORLD ranks; DDP (float64
model, SGD) trains STEPS_BEFORE steps. Then rank VICTIM SIGKILLs itself; the
survivors' next step fails (the allreduce of DDP's backward names the dead
peer), they abort the group, exchange new handles, reconfigure into the
WORLD-1 survivors (the old rank VICTIM+1 becomes rank VICTIM) and train
STEPS_AFTER steps: the failed step again, then the next ones, on the smaller
group. The batch of (step, rank) is fixed, so the test recomputes every
step in one process.

Writes OUTDIR/rank{RANK}.json: ranks/sizes seen, the parameters after every
step, the error of the failed step, which DDP went on.
"""

import json
import os
import signal
import sys
import time
import traceback
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn

import torchcomms
from torchcomms._backend_wrapper import _BackendWrapper

STEPS_BEFORE = 2
STEPS_AFTER = 3
VICTIM = 1
TIMEOUT = timedelta(seconds=20)


def make_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 3)).double()


def batch(step, rank):
    g = torch.Generator().manual_seed(100 * step + rank)
    return torch.randn(4, 5, generator=g, dtype=torch.float64), \
        torch.randn(4, 3, generator=g, dtype=torch.float64)


def train_step(ddp, opt, step, rank):
    opt.zero_grad()
    x, y = batch(step, rank)
    nn.functional.mse_loss(ddp(x), y).backward()
    opt.step()


def params(model):
    return [p.detach().flatten().tolist() for p in model.parameters()]


def exchange(store, comm, round_, members, me):
    """Publishes this rank's init handle for `round_`; the members' handles
    (in the order of `members`)."""
    store.set(f"handle/{round_}/{me}", comm.get_init_handle())
    store.wait([f"handle/{round_}/{m}" for m in members], TIMEOUT)
    return [store.get(f"handle/{round_}/{m}").decode() for m in members]


def main():
    rank, world, port, outdir, mode = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), \
        sys.argv[4], sys.argv[5]
    out = {"rank": rank, "mode": mode, "seen": [], "params": [], "errors": []}
    path = os.path.join(outdir, f"rank{rank}.json")
    store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=TIMEOUT,
                          wait_for_workers=False)
    comm = torchcomms.new_comm("cpu", torch.device("cpu"), name="ddp", timeout=TIMEOUT,
                               enable_reconfigure=True)
    pg = _BackendWrapper(comm, store=store)
    out["seen"].append([pg.rank(), pg.size()])  # no members yet: -1, 0

    # configuration 1: every rank, ranks as given
    pg.reconfigure(1, exchange(store, comm, 1, range(world), rank), timeout=TIMEOUT).wait()
    out["seen"].append([pg.rank(), pg.size(), dist.get_world_size(pg)])
    model = make_model()
    ddp = nn.parallel.DistributedDataParallel(model, process_group=pg)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(STEPS_BEFORE):
        train_step(ddp, opt, step, pg.rank())
        out["params"].append(params(model))

    if rank == VICTIM:
        with open(path, "w") as f:
            json.dump(out, f)
        os.kill(os.getpid(), signal.SIGKILL)

    # the next step fails: a member is gone
    t0 = time.monotonic()
    try:
        train_step(ddp, opt, STEPS_BEFORE, pg.rank())
        out["errors"].append("the step with a dead member did not fail")
    except RuntimeError as e:
        out["failed_step"] = {"error": str(e)[:400], "seconds": time.monotonic() - t0}

    # recovery: abort, then reconfigure into the survivors (same order)
    pg.abort()
    survivors = [r for r in range(world) if r != VICTIM]
    pg.reconfigure(2, exchange(store, comm, 2, survivors, rank), timeout=TIMEOUT).wait()
    out["seen"].append([pg.rank(), pg.size(), dist.get_world_size(pg)])
    if mode == "new":
        ddp = nn.parallel.DistributedDataParallel(model, process_group=pg)
    else:
        # the same DDP: its reducer still holds the state of the backward that
        # failed (among it the divisor, the old world size, which it would
        # apply once more); torch's _update_process_group resets it
        ddp._update_process_group(pg)
    for step in range(STEPS_BEFORE, STEPS_BEFORE + STEPS_AFTER):
        try:
            train_step(ddp, opt, step, pg.rank())
        except Exception as e:  # noqa: BLE001  reported to the test
            out["errors"].append(f"step {step}: {type(e).__name__}: {str(e)[:600]}")
            break
        out["params"].append(params(model))

    store.set(f"done/{rank}", "1")
    store.wait([f"done/{r}" for r in survivors], TIMEOUT)
    pg.shutdown()
    with open(path, "w") as f:
        json.dump(out, f)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception:  # noqa: BLE001
        traceback.print_exc()
        sys.exit(1)
