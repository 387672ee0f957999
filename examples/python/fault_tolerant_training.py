#!/usr/bin/env python3
"""Fault-tolerant data-parallel training with reconfigurable communicators.

N worker processes train a small MLP on a fixed sequence of global batches.
One worker is SIGKILLed at a random step, at a random point of that step
(before, during or just after the gradient all_reduce). The survivors see
their next operation fail ("peer N closed its connection"), abort, and form
a smaller group with reconfigure(); they take the newest training state
from the memory of whichever of them got furthest (a broadcast) and go on.
Later a replacement worker starts and joins: the group grows back to N at a
step boundary and the newcomer receives the state the same way.

The final parameters are *bitwise* those of a failure-free single-process
run over the same global batches, at any membership (see train_step for
how), and the launcher checks it.

    python examples/python/fault_tolerant_training.py --world-size 3
    TORCHCOMMS_CPU_TRANSPORT=tcp python examples/python/fault_tolerant_training.py -n 4 --seed 7

Roles (one file, two roles):

  launcher (this script's main): hosts the coordination store, which must
    outlive any worker, so no worker hosts it; starts the workers; watches
    them and publishes each membership ("quorum/<generation>" = the list of
    worker ids), as a job scheduler or torchft's lighthouse would; starts
    the replacement; checks the result against its own failure-free run.

  worker (a child process of the launcher): creates one communicator with
    enable_reconfigure=True (no members yet), publishes its init handle
    ("handle/<worker id>"), and for each generation g it belongs to calls
        comm.reconfigure(uuid=g, init_handles=[handles of quorum/g])
    A worker learns that a new generation exists either because an operation
    failed (a member died: the launcher publishes quorum/g+1 without it) or,
    at a step boundary, from rank 0, which looks for quorum/g+1 in the store
    (a worker joined) and tells the others with a broadcast, so all members
    switch at the same step.
"""

import argparse
import json
import multiprocessing as mp
import multiprocessing.connection
import os
import random
import signal
import sys
import time
from datetime import timedelta

import torch
from torch import nn

TIMEOUT = timedelta(seconds=60)  # every wait: store, reconfigure, operations
SEED = 1234
IN_FEATURES, HIDDEN = 8, 32
MICROBATCHES, MICROBATCH = 12, 2  # global batch: 24 samples, split over <= 12 members
GLOBAL_BATCH = MICROBATCHES * MICROBATCH
LR, MOMENTUM = 0.05, 0.9
DTYPE = torch.float64


# ---------------------------------------------------------------- training

def global_batch(step):
    """The global batch of a step, a function of the step alone: any process
    (a survivor re-running a step, the launcher's reference) regenerates it."""
    g = torch.Generator().manual_seed(10_000 + step)
    x = torch.randn(GLOBAL_BATCH, IN_FEATURES, generator=g, dtype=DTYPE)
    y = torch.sin(x.sum(dim=1, keepdim=True)) + 0.1 * torch.randn(GLOBAL_BATCH, 1, generator=g,
                                                                  dtype=DTYPE)
    return x, y


class TrainState:
    """Model, optimizer state (SGD momentum) and the number of completed
    steps. The live state is always a good one: it changes only after the
    step's all_reduce succeeded, so a failed step leaves it as it was."""

    def __init__(self):
        torch.manual_seed(SEED)  # the same initial model everywhere
        self.model = nn.Sequential(nn.Linear(IN_FEATURES, HIDDEN), nn.Tanh(),
                                   nn.Linear(HIDDEN, 1)).to(DTYPE)
        self.params = list(self.model.parameters())
        self.num_params = sum(p.numel() for p in self.params)
        self.momentum = torch.zeros(self.num_params, dtype=DTYPE)
        self.step = 0

    def pack(self):
        """Everything in one float64 tensor (for one broadcast)."""
        flat = nn.utils.parameters_to_vector(self.params).detach()
        return torch.cat([flat, self.momentum, torch.tensor([float(self.step)], dtype=DTYPE)])

    def unpack(self, buf):
        n = self.num_params
        with torch.no_grad():
            nn.utils.vector_to_parameters(buf[:n], self.params)
        self.momentum.copy_(buf[n:2 * n])
        self.step = int(buf[2 * n].item())

    def microbatch_grad(self, x, y):
        loss = ((self.model(x) - y) ** 2).sum()
        grads = torch.autograd.grad(loss, self.params)
        return torch.cat([g.reshape(-1) for g in grads])

    def apply(self, slots):
        """SGD with momentum on the global batch's mean gradient."""
        grad = slots.sum(dim=0) / GLOBAL_BATCH
        self.momentum.mul_(MOMENTUM).add_(grad)
        with torch.no_grad():
            flat = nn.utils.parameters_to_vector(self.params) - LR * self.momentum
            nn.utils.vector_to_parameters(flat, self.params)
        self.step += 1


def my_microbatches(rank, size):
    return range(rank * MICROBATCHES // size, (rank + 1) * MICROBATCHES // size)


def reference_run(steps):
    """The failure-free run: one process, the same global batches."""
    torch.set_num_threads(1)  # as the workers: the same kernels, the same bits
    state = TrainState()
    for _ in range(steps):
        x, y = global_batch(state.step)
        slots = torch.zeros(MICROBATCHES, state.num_params, dtype=DTYPE)
        for m in range(MICROBATCHES):
            rows = slice(m * MICROBATCH, (m + 1) * MICROBATCH)
            slots[m] = state.microbatch_grad(x[rows], y[rows])
        state.apply(slots)
    return state.pack()


# ---------------------------------------------------------------- worker

class Fault:
    """Fault injection: this worker SIGKILLs itself at step `step`, at point
    `phase`, after writing the time to the store (the launcher measures the
    recovery from it)."""

    PHASES = ("before_all_reduce", "during_all_reduce", "after_all_reduce")

    def __init__(self, store, wid, step, phase):
        self.store, self.wid, self.step, self.phase = store, wid, step, phase

    def point(self, step, phase):
        if step == self.step and phase == self.phase:
            self.store.set("fault", json.dumps({"worker": self.wid, "step": step,
                                                "phase": phase, "time": time.time()}))
            os.kill(os.getpid(), signal.SIGKILL)


def store_wait_get(store, key):
    try:
        store.wait([key], TIMEOUT)
    except RuntimeError as e:  # torch's DistStoreError is a RuntimeError
        raise TimeoutError(f"no '{key}' in the store after {TIMEOUT}") from e
    return store.get(key).decode()


def train_step(comm, state, fault):
    """One step on the current members. Each micro-batch's gradient has its
    own row in `slots` (zeros in the rows of other members); all_reduce(SUM)
    then gives every member every row exactly, since adding zeros is exact,
    and the rows are summed in the same order everywhere. So the update is
    bitwise the same at any membership. (Summing locally first, then
    all_reduce, would match only to rounding: the order of the additions
    would depend on the number of members.)"""
    from torchcomms import ReduceOp
    x, y = global_batch(state.step)
    slots = torch.zeros(MICROBATCHES, state.num_params, dtype=DTYPE)
    for m in my_microbatches(comm.get_rank(), comm.get_size()):
        rows = slice(m * MICROBATCH, (m + 1) * MICROBATCH)
        slots[m] = state.microbatch_grad(x[rows], y[rows])
    fault.point(state.step, "before_all_reduce")
    work = comm.all_reduce(slots, ReduceOp.SUM, async_op=True)
    fault.point(state.step, "during_all_reduce")
    work.wait()
    fault.point(state.step, "after_all_reduce")
    state.apply(slots)


def enter_generation(comm, store, state, gen, wid):
    """Become a member of generation `gen`, then take the newest state among
    the members (the lowest rank among those that completed the most steps
    broadcasts it). Returns the members' completed steps."""
    members = json.loads(store_wait_get(store, f"quorum/{gen}"))
    if wid not in members:
        raise LookupError(f"worker {wid} is not in generation {gen}: {members}")
    handles = [store_wait_get(store, f"handle/{w}") for w in members]
    comm.reconfigure(uuid=gen, init_handles=handles, timeout=TIMEOUT).wait()
    steps = torch.zeros(comm.get_size(), dtype=torch.int64)
    comm.all_gather_single(steps, torch.tensor([state.step]), async_op=False)
    holder = int(torch.argmax(steps))  # the first of the maxima
    buf = state.pack()
    comm.broadcast(buf, holder, async_op=False)
    state.unpack(buf)
    return members, steps.tolist()


def next_generation_published(comm, store, gen, wait):
    """Rank 0 looks for quorum/<gen+1> (waiting for it if `wait`) and tells
    the others: every member decides at the same step boundary."""
    flag = torch.zeros(1, dtype=torch.int64)
    if comm.get_rank() == 0:
        key = f"quorum/{gen + 1}"
        if wait:
            store_wait_get(store, key)
        flag[0] = int(store.check([key]))
    comm.broadcast(flag, 0, async_op=False)
    return bool(flag.item())


def worker(wid, gen, port, world_size, steps, transport=None, kill_step=None, kill_phase=None,
           quiet=False):
    """One worker (a child process of the launcher): worker id `wid`, first
    generation `gen`."""
    from torch.distributed import TCPStore
    from torchcomms import new_comm

    torch.set_num_threads(1)
    if transport:  # read when the communicator is created
        os.environ["TORCHCOMMS_CPU_TRANSPORT"] = transport

    def log(msg):
        if not quiet:
            print(f"[worker {wid}] {msg}", flush=True)

    store = TCPStore("127.0.0.1", port, is_master=False, timeout=TIMEOUT)
    comm = new_comm("cpu", torch.device("cpu"), name="ft", enable_reconfigure=True,
                    timeout=TIMEOUT)
    store.set(f"handle/{wid}", comm.get_init_handle())
    fault = Fault(store, wid, kill_step, kill_phase)
    state = TrainState()
    entering, first_step = True, False

    while True:
        try:
            if entering:
                members, completed = enter_generation(comm, store, state, gen, wid)
                entering, first_step = False, True
                if comm.get_rank() == 0:
                    log(f"generation {gen}: workers {members} as ranks 0..{len(members) - 1}, "
                        f"their completed steps {completed}: all continue after step {state.step}")
            finished = state.step == steps
            # A group that finished below the job's size waits for its
            # replacement, so that every worker ends with the final model.
            if next_generation_published(comm, store, gen,
                                         wait=finished and comm.get_size() < world_size):
                gen, entering = gen + 1, True
                continue
            if finished:
                break
            train_step(comm, state, fault)
            if first_step and comm.get_rank() == 0:  # for the launcher's recovery time
                store.set(f"resumed/{gen}", json.dumps({"time": time.time(),
                                                        "step": state.step}))
            first_step = False
        except RuntimeError as e:
            # A member died or left: this configuration is gone. Pending
            # operations are failed by abort(); the next generation (from
            # the launcher) says who is left.
            log(f"step {state.step}: {str(e).split(' [hang report')[0]} "
                f"-> abort, wait for generation {gen + 1}")
            comm.abort()
            gen, entering = gen + 1, True

    store.set(f"final/{wid}", state.pack().numpy().tobytes())
    comm.finalize()
    log(f"done: {state.step} steps")


# ---------------------------------------------------------------- launcher

def wait_any_exit(procs, timeout):
    """The id of a worker that has exited (waits up to `timeout` s)."""
    ready = mp.connection.wait([p.sentinel for p in procs.values()], timeout)
    if not ready:
        raise TimeoutError(f"no worker exited within {timeout} s")
    wid = next(w for w, p in procs.items() if p.sentinel == ready[0])
    procs[wid].join()
    return wid


# Workers are forked from a server process that imported torch and
# torchcomms once (a worker starts in milliseconds, not seconds), not from
# the launcher itself, which runs the store's server threads.
workers = mp.get_context("forkserver")
workers.set_forkserver_preload(["__main__", "torch", "torch.distributed", "torchcomms"])


def our_shm_segments(pids):
    """Shared-memory segments in /dev/shm created by these processes
    (src/transport/shm_sweep.c: /torchcomms-<hash>-<token>-<rank>-<pidns>-<pid>-<start>)."""
    found = []
    for name in os.listdir("/dev/shm") if os.path.isdir("/dev/shm") else []:
        fields = name.split("-")
        if name.startswith("torchcomms-") and len(fields) == 7 and fields[5] in pids:
            found.append(name)
    return found


def run(world_size=3, steps=30, seed=None, kill_worker=None, kill_step=None, kill_phase=None,
        transport=None, quiet=False):
    """One job: the failure, the recovery, the replacement, the check.
    Returns a summary (dict); raises on any failure."""
    from torch.distributed import TCPStore

    rng = random.Random(seed)
    kill_worker = rng.randrange(world_size) if kill_worker is None else kill_worker
    kill_step = rng.randrange(steps - 1) if kill_step is None else kill_step
    kill_phase = rng.choice(Fault.PHASES) if kill_phase is None else kill_phase
    if not (0 <= kill_worker < world_size and 0 <= kill_step < steps):
        raise ValueError(f"no worker {kill_worker} or no step {kill_step} to kill it at")
    reference = reference_run(steps)

    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=TIMEOUT)
    procs, pids = {}, set()

    def start(wid, gen, fault=False):
        kill = (kill_step, kill_phase) if fault else (None, None)
        p = workers.Process(target=worker, name=f"worker {wid}", args=(
            wid, gen, store.port, world_size, steps, transport, *kill, quiet))
        p.start()
        procs[wid] = p
        pids.add(str(p.pid))

    def say(msg):
        if not quiet:
            print(msg, flush=True)

    try:
        # generation 1: every worker
        store.set("quorum/1", json.dumps(list(range(world_size))))
        for wid in range(world_size):
            start(wid, 1, fault=(wid == kill_worker))

        # a worker dies: the next generation is everyone else
        dead = wait_any_exit(procs, TIMEOUT.total_seconds())
        rc = procs.pop(dead).exitcode
        if rc != -signal.SIGKILL or dead != kill_worker:
            raise RuntimeError(f"worker {dead} exited with {rc} (expected: worker "
                               f"{kill_worker} killed by SIGKILL)")
        fault = json.loads(store.get("fault"))
        survivors = sorted(procs)
        store.set("quorum/2", json.dumps(survivors))
        say(f"worker {dead} killed at step {kill_step} ({kill_phase}); "
            f"generation 2: workers {survivors}")
        resumed = json.loads(store_wait_get(store, "resumed/2"))
        recovery = resumed["time"] - fault["time"]
        say(f"survivors completed step {resumed['step']} {recovery * 1e3:.1f} ms after the kill")

        # the replacement: it joins once its communicator is up
        new = world_size
        start(new, 3)
        store_wait_get(store, f"handle/{new}")
        store.set("quorum/3", json.dumps(survivors + [new]))

        for _ in range(len(procs)):
            wid = wait_any_exit(procs, TIMEOUT.total_seconds())
            rc = procs.pop(wid).exitcode
            if rc != 0:
                raise RuntimeError(f"worker {wid} exited with {rc}")
        finals = {wid: torch.frombuffer(bytearray(store.get(f"final/{wid}")), dtype=DTYPE)
                  for wid in survivors + [new]}
    finally:
        for p in procs.values():  # nothing left behind, whatever happened
            p.kill()
            p.join()

    max_diff = max((f - reference).abs().max().item() for f in finals.values())
    equal = all(torch.equal(f, reference) for f in finals.values())
    summary = {"world_size": world_size, "steps": steps, "killed": dead, "kill_step": kill_step,
               "kill_phase": kill_phase, "recovery_s": recovery, "resumed_step": resumed["step"],
               "replacement": new, "finals": sorted(finals), "max_diff": max_diff,
               "equal": equal,
               "reference_moved": (reference - TrainState().pack())[:-1].abs().max().item(),
               "shm_left": our_shm_segments(pids), "pids": sorted(int(p) for p in pids),
               "transport": transport or os.environ.get("TORCHCOMMS_CPU_TRANSPORT", "auto")}
    say(f"final parameters of workers {sorted(finals)} "
        f"{'bitwise equal to' if equal else 'DIFFER from'} the failure-free reference "
        f"(max |diff| {max_diff:.1e}); shared-memory segments left: {len(summary['shm_left'])}")
    return summary


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-n", "--world-size", type=int, default=3)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--seed", type=int, default=None, help="chooses the victim, step and phase")
    ap.add_argument("--kill-worker", type=int)
    ap.add_argument("--kill-step", type=int)
    ap.add_argument("--kill-phase", choices=Fault.PHASES)
    ap.add_argument("--quiet", action="store_true")
    ap.add_argument("--json", action="store_true", help="print the summary as one JSON line")
    args = ap.parse_args()
    s = run(args.world_size, args.steps, args.seed, args.kill_worker, args.kill_step,
            args.kill_phase, quiet=args.quiet)
    if args.json:
        print(json.dumps(s), flush=True)
    ok = s["equal"] and not s["shm_left"]
    print(f"{'OK' if ok else 'FAILED'}: recovered in {s['recovery_s'] * 1e3:.1f} ms", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
