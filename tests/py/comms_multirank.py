#!/usr/bin/env python3
"""Multi-rank checks of the torchcomms._comms extension, run on every rank.

    torchrun --standalone --nproc_per_node=N tests/py/comms_multirank.py [--filestore PATH]

Every operation is run synchronously and asynchronously and checked exactly
against values computed locally; the process exits non-zero on the first
mismatch (printing which). Used by tests/py/test_comms_basic.py with N = 2
and 4.
"""
import argparse
import gc
import sys
import time
import traceback
import weakref
from datetime import timedelta

import torch

import torchcomms
from torchcomms import ReduceOp

FAILURES = []


def check(cond, what):
    if not cond:
        FAILURES.append(what)
        print(f"[rank {RANK}] FAIL: {what}", file=sys.stderr, flush=True)


def eq(a, b, what):
    ok = a.dtype == b.dtype and a.shape == b.shape and bool(torch.equal(a, b))
    if not ok:
        what = f"{what}: got {a.tolist()} expected {b.tolist()}"
    check(ok, what)


def run(comm, fn, async_op):
    """fn(async_op) issues an op; returns after it completed either way."""
    w = fn(async_op)
    check(isinstance(w, torchcomms.TorchWork), "ops return a TorchWork")
    w.wait()
    check(w.is_completed(), "is_completed after wait")
    check(w.status() == torchcomms.WorkStatus.COMPLETED, "status COMPLETED")


def collectives(comm, dtype):
    r, n = comm.get_rank(), comm.get_size()
    tag = f"{dtype} n={n}"

    def val(x):
        return torch.tensor(x, dtype=dtype)

    for a in (False, True):
        # all_reduce: SUM, MAX, MIN; AVG / PREMUL_SUM on floats
        t = torch.full((5,), r + 1, dtype=dtype)
        run(comm, lambda a: comm.all_reduce(t, ReduceOp.SUM, async_op=a), a)
        eq(t, torch.full((5,), n * (n + 1) // 2, dtype=dtype), f"all_reduce SUM {tag}")
        t = torch.arange(4, dtype=dtype) + r
        run(comm, lambda a: comm.all_reduce(t, ReduceOp.MAX, a), a)
        eq(t, torch.arange(4, dtype=dtype) + (n - 1), f"all_reduce MAX {tag}")
        t = torch.arange(4, dtype=dtype) + r
        run(comm, lambda a: comm.allreduce(t, op=ReduceOp.MIN, async_op=a), a)
        eq(t, torch.arange(4, dtype=dtype), f"all_reduce MIN {tag}")
        if dtype.is_floating_point:
            t = torch.full((3,), 2.0 * (r + 1), dtype=dtype)
            run(comm, lambda a: comm.all_reduce(t, ReduceOp.AVG, a), a)
            eq(t, torch.full((3,), float(n + 1), dtype=dtype), f"all_reduce AVG {tag}")
            t = torch.full((3,), float(r + 1), dtype=dtype)
            op = ReduceOp.PREMUL_SUM(torch.tensor([2.0]))
            run(comm, lambda a: comm.all_reduce(t, op, a), a)
            eq(t, torch.full((3,), float(n * (n + 1)), dtype=dtype), f"PREMUL_SUM {tag}")
        # broadcast, reduce
        root = n - 1
        t = torch.full((6,), 7 if r == root else 0, dtype=dtype)
        run(comm, lambda a: comm.broadcast(t, root, a), a)
        eq(t, torch.full((6,), 7, dtype=dtype), f"broadcast {tag}")
        t = torch.full((3,), 1, dtype=dtype)
        run(comm, lambda a: comm.reduce(t, 0, ReduceOp.SUM, a), a)
        eq(t, torch.full((3,), n if r == 0 else 1, dtype=dtype), f"reduce {tag}")
        # gathers
        inp = torch.full((2,), r, dtype=dtype)
        outs = [torch.zeros(2, dtype=dtype) for _ in range(n)]
        run(comm, lambda a: comm.all_gather(outs, inp, a), a)
        for i in range(n):
            eq(outs[i], torch.full((2,), i, dtype=dtype), f"all_gather[{i}] {tag}")
        inp = torch.full((r + 1,), r, dtype=dtype)
        outs = [torch.zeros(i + 1, dtype=dtype) for i in range(n)]
        run(comm, lambda a: comm.all_gather_v(outs, inp, a), a)
        for i in range(n):
            eq(outs[i], torch.full((i + 1,), i, dtype=dtype), f"all_gather_v[{i}] {tag}")
        out = torch.zeros(n * 3, dtype=dtype)
        run(comm, lambda a: comm.all_gather_single(out, torch.full((3,), r, dtype=dtype), a), a)
        eq(out, torch.arange(n, dtype=dtype).repeat_interleave(3), f"all_gather_single {tag}")
        # reduce_scatter family
        ins = [torch.full((2,), i + r, dtype=dtype) for i in range(n)]
        out = torch.zeros(2, dtype=dtype)
        run(comm, lambda a: comm.reduce_scatter(out, ins, ReduceOp.SUM, a), a)
        expect = n * r + n * (n - 1) // 2
        eq(out, torch.full((2,), expect, dtype=dtype), f"reduce_scatter {tag}")
        ins = [torch.ones(i + 1, dtype=dtype) for i in range(n)]
        out = torch.zeros(r + 1, dtype=dtype)
        run(comm, lambda a: comm.reduce_scatter_v(out, ins, ReduceOp.SUM, a), a)
        eq(out, torch.full((r + 1,), n, dtype=dtype), f"reduce_scatter_v {tag}")
        inp = torch.arange(n, dtype=dtype).repeat_interleave(2)
        out = torch.zeros(2, dtype=dtype)
        run(comm, lambda a: comm.reduce_scatter_single(out, inp, ReduceOp.SUM, a), a)
        eq(out, torch.full((2,), n * r, dtype=dtype), f"reduce_scatter_single {tag}")
        # all to all: block i of rank r holds 10 * r + i
        inp = (10 * r + torch.arange(n)).repeat_interleave(2).to(dtype)
        out = torch.zeros(2 * n, dtype=dtype)
        run(comm, lambda a: comm.all_to_all_single(out, inp, a), a)
        eq(out, (10 * torch.arange(n) + r).repeat_interleave(2).to(dtype),
           f"all_to_all_single {tag}")
        # all_to_all_v_single on 2-D tensors: rank r sends i + 1 rows to rank i
        cols = 3
        in_splits = [i + 1 for i in range(n)]
        out_splits = [r + 1] * n
        inp = torch.cat([torch.full((i + 1, cols), 10 * r + i) for i in range(n)]).to(dtype)
        out = torch.zeros(sum(out_splits), cols, dtype=dtype)
        run(comm, lambda a: comm.all_to_all_v_single(out, inp, out_splits, in_splits, a), a)
        expect = torch.cat([torch.full((r + 1, cols), 10 * j + r) for j in range(n)]).to(dtype)
        eq(out, expect, f"all_to_all_v_single {tag}")
        ins = [torch.full((i + 1,), 10 * r + i, dtype=dtype) for i in range(n)]
        outs = [torch.zeros(r + 1, dtype=dtype) for _ in range(n)]
        run(comm, lambda a: comm.all_to_all(outs, ins, a), a)
        for j in range(n):
            eq(outs[j], torch.full((r + 1,), 10 * j + r, dtype=dtype), f"all_to_all[{j}] {tag}")
        # rooted
        root = n // 2
        ins = [torch.full((2,), i, dtype=dtype) for i in range(n)] if r == root else []
        out = torch.zeros(2, dtype=dtype)
        run(comm, lambda a: comm.scatter(out, ins, root, a), a)
        eq(out, torch.full((2,), r, dtype=dtype), f"scatter {tag}")
        outs = [torch.zeros(2, dtype=dtype) for _ in range(n)] if r == root else []
        run(comm, lambda a: comm.gather(outs, torch.full((2,), r, dtype=dtype), root, a), a)
        if r == root:
            for i in range(n):
                eq(outs[i], torch.full((2,), i, dtype=dtype), f"gather[{i}] {tag}")
        out = torch.zeros(2 * n, dtype=dtype)
        run(comm, lambda a: comm.gather_single(out, torch.full((2,), r, dtype=dtype), root, a), a)
        if r == root:
            eq(out, torch.arange(n, dtype=dtype).repeat_interleave(2), f"gather_single {tag}")
        run(comm, lambda a: comm.barrier(a), a)


def point_to_point(comm):
    r, n = comm.get_rank(), comm.get_size()
    nxt, prv = (r + 1) % n, (r - 1) % n
    for a in (False, True):
        s = torch.full((4,), float(r))
        d = torch.zeros(4)
        if r % 2 == 0:
            comm.send(s, nxt, a).wait()
            comm.recv(d, prv, a).wait()
        else:
            comm.recv(d, prv, a).wait()
            comm.send(s, nxt, a).wait()
        eq(d, torch.full((4,), float(prv)), "send/recv ring")
    # batch: a send to and a receive from every rank, self included
    sends = [torch.full((3,), 100 * r + p, dtype=torch.int32) for p in range(n)]
    recvs = [torch.full((3,), -1, dtype=torch.int32) for _ in range(n)]
    b = comm.batch_op_create()
    for p in range(n):
        b.send(sends[p], p)
        b.recv(recvs[p], p)
    check(len(b.ops) == 2 * n, "batch ops list")
    b.issue(True, torchcomms.BatchP2POptions()).wait()
    for p in range(n):
        eq(recvs[p], torch.full((3,), 100 * p + r, dtype=torch.int32), f"batch from {p}")


def split_checks(comm):
    r, n = comm.get_rank(), comm.get_size()
    ranks = [i for i in range(n) if i % 2 == r % 2]
    sub = comm.split(ranks, f"parity{r % 2}")
    check(sub is not None and sub.get_size() == len(ranks), "split size")
    check(sub.get_rank() == ranks.index(r), "split rank")
    t = torch.tensor([float(r)])
    sub.all_reduce(t, ReduceOp.SUM)
    eq(t, torch.tensor([float(sum(ranks))]), "all_reduce on split")
    none = comm.split([r] if r == 0 else [], "only0")
    check((none is None) == (r != 0), "split with [] returns None")
    if none is not None:
        none.finalize()
    sub.finalize()


def lifetime(comm):
    """An async receive whose tensor and work are dropped right after issue:
    the communicator keeps them alive until the data has landed (rank 0
    sends late), and lets go once a later issue finds the op finished."""
    r, n = comm.get_rank(), comm.get_size()
    if r == 1:
        t = torch.zeros(1 << 16)
        ref = weakref.ref(t)
        comm.recv(t, 0, async_op=True)
        del t
        gc.collect()
        check(ref() is not None, "async op keeps its tensor alive")
        comm.barrier()  # runs after the recv (issue order)
        comm.barrier(async_op=True).wait()  # this issue reaps the recv
        gc.collect()
        check(ref() is None, "finished op releases its tensor")
    else:
        if r == 0:
            time.sleep(0.3)
            comm.send(torch.ones(1 << 16), 1)
        comm.barrier()
        comm.barrier(async_op=True).wait()


def failures(comm):
    """A receive that never matches: wait() raises RuntimeError, the work says
    TIMEDOUT; a synchronous one raises; after abort() operations fail."""
    for phase in ("async", "sync"):
        c = torchcomms.new_comm("cpu", "cpu", name=f"fail_{phase}")
        if c.get_rank() == 0 and c.get_size() > 1:
            t = torch.zeros(4)
            try:
                if phase == "async":
                    w = c.recv(t, 1, async_op=True, timeout=timedelta(seconds=1))
                    try:
                        w.wait()
                        check(False, "wait() of a timed out op raises")
                    except RuntimeError as e:
                        check("timed out" in str(e) or "timeout" in str(e), f"timeout text: {e}")
                    check(w.is_completed(), "a timed out op is completed")
                    check(w.status() == torchcomms.WorkStatus.TIMEDOUT, f"status {w.status()}")
                else:
                    c.recv(t, 1, timeout=1.0)
                    check(False, "a synchronous op that times out raises")
            except RuntimeError as e:
                check(phase == "sync", f"unexpected {e}")
        comm.barrier()  # peers keep `c` open until rank 0 has timed out
        c.abort()
        check(c.is_aborted(), "is_aborted")
        try:
            c.barrier()
            check(False, "ops after abort raise")
        except RuntimeError as e:
            check("aborted" in str(e), f"abort text: {e}")


def main():
    global RANK
    ap = argparse.ArgumentParser()
    ap.add_argument("--filestore", help="also run on a comm over this FileStore")
    args = ap.parse_args()
    comm = torchcomms.new_comm("cpu", torch.device("cpu"), name="multirank",
                               timeout=timedelta(seconds=60))
    RANK = comm.get_rank()
    try:
        for dt in (torch.float32, torch.int64, torch.bfloat16, torch.uint8):
            collectives(comm, dt)
        point_to_point(comm)
        split_checks(comm)
        lifetime(comm)
        comm.barrier()
        failures(comm)
        if args.filestore:
            import torch.distributed as dist

            store = dist.PrefixStore("pfx", dist.FileStore(args.filestore, comm.get_size()))
            c2 = torchcomms.new_comm("cpu", "cpu", store=store, name="overfile",
                                     hints={"k": "v"})
            check(c2.get_options().store is store, "get_options().store")
            check(c2.get_options().hints == {"k": "v"}, "get_options().hints")
            collectives(c2, torch.float32)
            c2.finalize()
    except Exception:
        traceback.print_exc()
        FAILURES.append("exception")
    comm.finalize()
    if FAILURES:
        print(f"[rank {RANK}] {len(FAILURES)} failures", file=sys.stderr, flush=True)
        return 1
    print(f"[rank {RANK}] OK", flush=True)
    return 0


RANK = -1
if __name__ == "__main__":
    sys.exit(main())
