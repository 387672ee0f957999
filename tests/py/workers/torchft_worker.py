"""torchft's Manager + DDP over our `cpu` backend (tests/py/test_torchft.py).

The structure of torchft's own manager_integ_test.py
(test_ddp_healthy_torchcomms / test_ddp_recovery_torchcomms, which use a GPU
backend): a Lighthouse, two replica groups of one rank each, run as THREADS
of this process (torchft's Runner), each training MyModel with torchft's
DistributedDataParallel + OptimizerWrapper (which records should_commit's answer) over
torchft.torchcomms.ProcessGroupTorchComms, whose communicator is
new_comm("cpu", enable_reconfigure=True); the Manager reconfigures it on
every quorum change (get_init_handle, reconfigure(uuid=, init_handles=,
timeout=)). In "recovery" replica 1 raises at step 2 (torchft's
EventInjector().fail_at(0, 2)); its Runner starts it again (a new
communicator, a new Manager), it rejoins the quorum, heals from replica 0
and both finish.

Runner and EventInjector are small copies of torchft's (its
manager_integ_test module needs `parameterized`, a test-only dependency).
One difference: the batch of a step is a function of (replica, step)
(torchft's draws from the shared global RNG), so that the final state can be
checked exactly against a single-process reference (test_torchft.py).

usage: torchft_worker.py healthy|recovery shim|native OUTDIR
shim: the process group is torchft's ProcessGroupTorchComms (what torchft's
tests use); native: our _BackendWrapper over the communicator, which the
Manager takes as a native group (supports_reconfigure, reconfigure(opts),
get_reconfigure_handle, get_error).
Writes OUTDIR/replica{0,1}.pt (final state dicts) and OUTDIR/result.json.
"""

import json
import logging
import os
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from contextlib import ExitStack
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn, optim

import torchcomms
from torchft._torchft import LighthouseServer
from torchft.ddp import DistributedDataParallel
from torchft.manager import Manager
from torchft.optim import OptimizerWrapper
from torchft.torchcomms import ProcessGroupTorchComms

from torchcomms._backend_wrapper import _BackendWrapper

STEPS = 4
TIMEOUT = timedelta(seconds=20)  # every Manager operation, quorum, reconfigure
INIT_LOCK = threading.Lock()


class MyModel(nn.Module):  # torchft's manager_integ_test.MyModel
    def __init__(self, in_dim=3, out_dim=4):
        super().__init__()
        self.layers = nn.ModuleList(
            [nn.Linear(in_dim, 8), nn.ReLU(), nn.Linear(8, out_dim), nn.ReLU()])

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


def batch(replica_id, step):
    """The batch replica `replica_id` trains on at step `step`."""
    g = torch.Generator().manual_seed(1000 * replica_id + step)
    return torch.rand(2, 3, generator=g), torch.randint(4, (2,), generator=g)


class InjectedFailure(Exception):
    pass


class EventInjector:  # the Failure event of torchft's EventInjector
    def __init__(self):
        self._lock = threading.Lock()
        self._fail = set()
        self.failures = 0

    def fail_at(self, rank, step):
        self._fail.add((rank, step))
        return self

    def check(self, rank, step):
        with self._lock:
            if (rank, step) in self._fail:
                self._fail.discard((rank, step))
                self.failures += 1
                raise InjectedFailure(f"injected failure {rank=} {step=}")


class Runner:  # torchft's Runner: a replica group, restarted on InjectedFailure
    def __init__(self, replica_id, num_replicas, lighthouse_address, event_injector,
                 pg_kind, world_size=1, attempts=3):
        self.pg_kind = pg_kind
        self.replica_id = replica_id
        self.num_replicas = num_replicas
        self.lighthouse_address = lighthouse_address
        self.event_injector = event_injector
        self.world_size = world_size
        self.attempts = attempts
        self.starts = 0
        self.history = []

    def _replica_main(self):
        self.starts += 1
        store = dist.TCPStore(host_name="localhost", port=0, is_master=True,
                              wait_for_workers=False)
        with ThreadPoolExecutor(max_workers=self.world_size,
                                thread_name_prefix=f"replica{self.replica_id}") as ex:
            futs = [ex.submit(train_loop, rank, store.port, self) for rank in range(self.world_size)]
            for f in as_completed(futs):
                f.result()
            return [f.result() for f in futs]

    def run_replica(self):
        for i in range(self.attempts):
            try:
                return self._replica_main()
            except InjectedFailure as e:
                print(f"replica {self.replica_id}: {e}; restarting", flush=True)
                if i == self.attempts - 1:
                    raise
        raise RuntimeError("ran out of attempts")


class RecordingOptimizer(OptimizerWrapper):
    """torchft's OptimizerWrapper, keeping should_commit's answer."""

    committed = None

    def step(self, closure=None):
        assert closure is None
        self.committed = self.manager.should_commit()
        if self.committed:
            self.optim.step()


def train_loop(rank, store_port, runner):
    """torchft's ddp_train_loop_torchcomms, on backend "cpu"."""
    with ExitStack() as stack:
        def load_state_dict(sd):
            m.load_state_dict(sd["model"])
            optimizer.load_state_dict(sd["optim"])

        def state_dict():
            return {"model": m.state_dict(), "optim": optimizer.state_dict()}

        comm = torchcomms.new_comm("cpu", torch.device("cpu"), name=f"torchft{rank}",
                                   enable_reconfigure=True)
        # this replica's communicator goes when it does (a process that dies);
        # abort is local, so the other replica is not held up
        stack.callback(comm.abort)
        if runner.pg_kind == "native":
            # no shim: our c10d group (a torch ProcessGroup) over the same
            # communicator, which the Manager reconfigures as a native group
            pg = _BackendWrapper(comm)
        else:
            pg = ProcessGroupTorchComms(comm=comm, timeout=TIMEOUT)
        manager = Manager(
            pg=pg, min_replica_size=2, load_state_dict=load_state_dict,
            state_dict=state_dict, replica_id=str(runner.replica_id),
            store_addr="localhost", store_port=store_port, rank=rank,
            world_size=runner.world_size, lighthouse_addr=runner.lighthouse_address,
            port=0, timeout=TIMEOUT, quorum_timeout=TIMEOUT, connect_timeout=TIMEOUT)
        stack.callback(lambda: manager.shutdown(wait=False))

        with INIT_LOCK:
            torch.manual_seed(42)
            m = MyModel()
        m = DistributedDataParallel(manager, m)
        optimizer = RecordingOptimizer(manager, optim.Adam(m.parameters()))
        criterion = nn.CrossEntropyLoss()

        history = runner.history  # every attempt's iterations
        while True:
            before = manager.current_step()
            inputs, labels = batch(runner.replica_id, before)
            optimizer.zero_grad()
            loss = criterion(m(inputs), labels)
            loss.backward()
            optimizer.step()
            # what the Manager did with this iteration: committed (as step
            # after - 1) or not, and whether this replica's gradients were
            # part of it (a healing replica contributes zeros)
            history.append({"attempt": runner.starts, "before": before,
                            "after": manager.current_step(), "committed": optimizer.committed,
                            "participating": manager.is_participating(),
                            "num_participants": manager.num_participants()})
            if manager.current_step() >= STEPS:
                break
            runner.event_injector.check(rank, manager.current_step())

        # the communicator followed every quorum: both replicas, ranks 0 and 1
        seen = {"rank": comm.get_rank(), "size": comm.get_size()}
        return {"state": state_dict(), "comm": seen}


def main():
    scenario, pg_kind, outdir = sys.argv[1], sys.argv[2], sys.argv[3]
    logging.basicConfig(level=logging.WARNING)
    lighthouse = LighthouseServer(bind="[::]:0", min_replicas=2)
    injectors = [EventInjector(), EventInjector()]
    if scenario == "recovery":
        injectors[1].fail_at(0, 2)
    runners = [Runner(i, 2, lighthouse.address(), injectors[i], pg_kind) for i in range(2)]
    t0 = time.monotonic()
    try:
        with ThreadPoolExecutor(max_workers=2) as ex:
            futs = [ex.submit(r.run_replica) for r in runners]
            results = [f.result(timeout=90) for f in futs]
    finally:
        lighthouse.shutdown()
    secs = time.monotonic() - t0
    for i, res in enumerate(results):
        torch.save(res[0]["state"], os.path.join(outdir, f"replica{i}.pt"))
    summary = {"failures": [inj.failures for inj in injectors],
               "starts": [r.starts for r in runners],
               "comm": [res[0]["comm"] for res in results],
               "history": [r.history for r in runners], "seconds": secs}
    with open(os.path.join(outdir, "result.json"), "w") as f:
        json.dump(summary, f)
    print(json.dumps(summary), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
