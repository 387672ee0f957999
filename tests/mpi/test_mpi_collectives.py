#!/usr/bin/env python3
"""The Python API over one backend, run on every rank of a job (no pytest):

    mpirun -np 4 -x TORCHCOMMS_BACKEND_LIB_PATH_MPI=build/mpi/openmpi \\
        .venv/bin/python tests/mpi/test_mpi_collectives.py          # backend mpi
    .venv/bin/torchrun --standalone --nproc_per_node=2 \\
        tests/mpi/test_mpi_collectives.py cpu                        # any backend

Written for the `mpi` backend (issue 18; make test-mpi runs it under Open
MPI's and MPICH's launchers, 2 and 4 ranks); the backend is argv[1]
(default "mpi"), the device "cpu", rank and size from the environment.

Checks, every value exactly (small integers, so that sums, products and
halvings are exact in every dtype), each operation synchronously and with
async_op=True + work.wait():
  - all_reduce with every ReduceOp the dtype allows (SUM, PRODUCT, MIN, MAX;
    BAND, BOR, BXOR on integers; AVG; PREMUL_SUM with a float and with a
    one-element tensor factor on floats) on float32, float16, bfloat16,
    int32, int64; reduce (every rank as root, SUM and MAX);
  - broadcast, all_gather, all_gather_single, reduce_scatter,
    reduce_scatter_single, all_to_all_single, all_to_all_v_single (uneven
    split sizes on a 2-D tensor), all_to_all, scatter, gather, barrier;
  - send/recv around a ring, a batch (batch_op_create: BatchSendRecv) with a
    send to and a receive from every rank, self included;
  - split into even and odd ranks, all_reduce and all_gather on the child;
  - the c10d wrapper (torchcomms._backend_wrapper: a torch ProcessGroup over
    the communicator, registered with torch.distributed): dist.all_reduce,
    all_gather_single, reduce_scatter_single, broadcast, isend/irecv
    through batch_isend_irecv, barrier;
  - DeviceMesh (torchcomms.device_mesh.init_device_mesh): a 1-D mesh over
    the communicator, and with 4 ranks a 2 x 2 mesh over splits; collectives
    on mesh.get_group(dim) and a DTensor (distribute_tensor, full_tensor).

Rank 0 prints one line per group and "test_mpi_collectives: N checks passed";
any mismatch prints "[rank R] FAIL: ..." and the process exits 1.
"""
import os
import sys
import time
import traceback
from datetime import timedelta

import torch

import torchcomms
from torchcomms import ReduceOp

BACKEND = "mpi"
RANK = -1
CHECKS = 0
FAILURES = []


def check(cond, what):
    global CHECKS
    CHECKS += 1
    if not cond:
        FAILURES.append(what)
        print(f"[rank {RANK}] FAIL: {what}", file=sys.stderr, flush=True)


def eq(got, want, what):
    ok = got.dtype == want.dtype and got.shape == want.shape and bool(torch.equal(got, want))
    if not ok:
        what = f"{what}: got {got.tolist()} ({got.dtype}), expected {want.tolist()} ({want.dtype})"
    check(ok, what)


def done(w, what):
    """Waits on an operation's work (async) or checks a sync one finished."""
    check(isinstance(w, torchcomms.TorchWork), f"{what}: returns a TorchWork")
    w.wait()
    check(w.is_completed(), f"{what}: is_completed() after wait()")
    check(w.status() == torchcomms.WorkStatus.COMPLETED, f"{what}: status COMPLETED")


def say(msg):
    if RANK == 0:
        print(f"test_mpi_collectives: {msg}", flush=True)


# ---- reductions --------------------------------------------------------

FLOATS = (torch.float32, torch.float16, torch.bfloat16)
INTS = (torch.int32, torch.int64)
COUNT = 9


def rank_data(r, dtype):
    """Rank r's input: small values, signs mixed, r-dependent (exact in every
    dtype and under every reduction of 4 ranks)."""
    i = torch.arange(COUNT)
    v = ((i + r) % 3) + 1                          # 1..3
    v = torch.where((i + 2 * r) % 5 == 0, -v, v)   # some negatives
    return v.to(dtype)


def bits_data(r, dtype):
    i = torch.arange(COUNT, dtype=torch.int64)
    return ((i * 37 + r * 11 + 5) % 64 | (1 << (r % 4 + 6))).to(dtype)


def reference(op, n, dtype, factor=None):
    """The reduction over ranks 0..n-1 computed here, as the library defines
    it (floats reduce in float32 for float16 / bfloat16: the values are exact
    anyway; integer AVG truncates)."""
    data = bits_data if op in ("BAND", "BOR", "BXOR") else rank_data
    xs = [data(r, dtype).to(torch.float64 if dtype.is_floating_point else torch.int64)
          for r in range(n)]
    acc = xs[0].clone()
    for x in xs[1:]:
        if op in ("SUM", "AVG", "PREMUL_SUM"):
            acc = acc + x
        elif op == "PRODUCT":
            acc = acc * x
        elif op == "MIN":
            acc = torch.minimum(acc, x)
        elif op == "MAX":
            acc = torch.maximum(acc, x)
        elif op == "BAND":
            acc = acc & x
        elif op == "BOR":
            acc = acc | x
        elif op == "BXOR":
            acc = acc ^ x
    if op == "PREMUL_SUM":
        acc = acc * factor
    if op == "AVG":
        acc = acc / n if dtype.is_floating_point else torch.div(acc, n, rounding_mode="trunc")
    return acc.to(dtype)


def reduce_ops(dtype):
    ops = [("SUM", ReduceOp.SUM, None), ("PRODUCT", ReduceOp.PRODUCT, None),
           ("MIN", ReduceOp.MIN, None), ("MAX", ReduceOp.MAX, None),
           ("AVG", ReduceOp.AVG, None)]
    if dtype.is_floating_point:
        ops += [("PREMUL_SUM", ReduceOp.PREMUL_SUM(0.5), 0.5),
                ("PREMUL_SUM", ReduceOp.PREMUL_SUM(torch.tensor([2.0])), 2.0)]
    else:
        ops += [("BAND", ReduceOp.BAND, None), ("BOR", ReduceOp.BOR, None),
                ("BXOR", ReduceOp.BXOR, None)]
    return ops


def all_reduce_checks(comm):
    r, n = comm.get_rank(), comm.get_size()
    k = 0
    for dtype in FLOATS + INTS:
        for name, op, factor in reduce_ops(dtype):
            for a in (False, True):
                data = bits_data if name in ("BAND", "BOR", "BXOR") else rank_data
                t = data(r, dtype)
                done(comm.all_reduce(t, op, async_op=a), f"all_reduce {name} {dtype}")
                eq(t, reference(name, n, dtype, factor),
                   f"all_reduce {name} (factor {factor}) {dtype} async={a}")
                k += 1
    # reduce: every rank as root; the others' buffers are left alone
    for dtype in (torch.float32, torch.bfloat16, torch.int64):
        for root in range(n):
            for name, op in (("SUM", ReduceOp.SUM), ("MAX", ReduceOp.MAX)):
                a = (root + k) % 2 == 1
                t = rank_data(r, dtype)
                done(comm.reduce(t, root, op, async_op=a), f"reduce {name} {dtype}")
                want = reference(name, n, dtype) if r == root else rank_data(r, dtype)
                eq(t, want, f"reduce {name} {dtype} root {root} async={a}")
                k += 1
    say(f"all_reduce, reduce: {k} cases passed (float32, float16, bfloat16, int32, int64; "
        f"every ReduceOp incl. AVG, PREMUL_SUM)")


# ---- data movement ---------------------------------------------------------

def movement_checks(comm, dtype):
    r, n = comm.get_rank(), comm.get_size()
    k = 0
    for a in (False, True):
        tag = f"{dtype} async={a}"
        for root in range(n):
            t = torch.full((5,), 7 + root if r == root else 99, dtype=dtype)
            done(comm.broadcast(t, root, async_op=a), "broadcast")
            eq(t, torch.full((5,), 7 + root, dtype=dtype), f"broadcast root {root} {tag}")
        inp = torch.arange(3, dtype=dtype) + 10 * r
        outs = [torch.full((3,), 99, dtype=dtype) for _ in range(n)]
        done(comm.all_gather(outs, inp, async_op=a), "all_gather")
        for i in range(n):
            eq(outs[i], torch.arange(3, dtype=dtype) + 10 * i, f"all_gather[{i}] {tag}")
        out = torch.full((n * 3,), 99, dtype=dtype)
        done(comm.all_gather_single(out, inp, async_op=a), "all_gather_single")
        eq(out, torch.cat([torch.arange(3) + 10 * i for i in range(n)]).to(dtype),
           f"all_gather_single {tag}")
        # reduce_scatter: block i of rank r is (i + r) * ones
        ins = [torch.full((4,), i + r, dtype=dtype) for i in range(n)]
        out = torch.full((4,), 99, dtype=dtype)
        done(comm.reduce_scatter(out, ins, ReduceOp.SUM, async_op=a), "reduce_scatter")
        eq(out, torch.full((4,), n * r + n * (n - 1) // 2, dtype=dtype), f"reduce_scatter {tag}")
        inp = torch.cat(ins)
        out = torch.full((4,), 99, dtype=dtype)
        done(comm.reduce_scatter_single(out, inp, ReduceOp.MAX, async_op=a),
             "reduce_scatter_single")
        eq(out, torch.full((4,), r + n - 1, dtype=dtype), f"reduce_scatter_single MAX {tag}")
        # all to all: block j of rank r holds 10 * r + j
        inp = (10 * r + torch.arange(n)).repeat_interleave(2).to(dtype)
        out = torch.full((2 * n,), 99, dtype=dtype)
        done(comm.all_to_all_single(out, inp, async_op=a), "all_to_all_single")
        eq(out, (10 * torch.arange(n) + r).repeat_interleave(2).to(dtype),
           f"all_to_all_single {tag}")
        # split sizes: rank r sends j + 1 rows to rank j (rows of 3)
        in_splits = [j + 1 for j in range(n)]
        out_splits = [r + 1] * n
        inp = torch.cat([torch.full((j + 1, 3), 10 * r + j) for j in range(n)]).to(dtype)
        out = torch.full((sum(out_splits), 3), 99, dtype=dtype)
        done(comm.all_to_all_v_single(out, inp, out_splits, in_splits, async_op=a),
             "all_to_all_v_single")
        eq(out, torch.cat([torch.full((r + 1, 3), 10 * j + r) for j in range(n)]).to(dtype),
           f"all_to_all_v_single {tag}")
        ins = [torch.full((j + 1,), 10 * r + j, dtype=dtype) for j in range(n)]
        outs = [torch.full((r + 1,), 99, dtype=dtype) for _ in range(n)]
        done(comm.all_to_all(outs, ins, async_op=a), "all_to_all")
        for j in range(n):
            eq(outs[j], torch.full((r + 1,), 10 * j + r, dtype=dtype), f"all_to_all[{j}] {tag}")
        # rooted
        for root in range(n):
            ins = [torch.full((2,), 10 * root + j + 1, dtype=dtype) for j in range(n)] \
                if r == root else []
            out = torch.full((2,), 99, dtype=dtype)
            done(comm.scatter(out, ins, root, async_op=a), "scatter")
            eq(out, torch.full((2,), 10 * root + r + 1, dtype=dtype), f"scatter root {root} {tag}")
            outs = [torch.full((2,), 99, dtype=dtype) for _ in range(n)] if r == root else []
            done(comm.gather(outs, torch.full((2,), r + root, dtype=dtype), root, async_op=a),
                 "gather")
            if r == root:
                for j in range(n):
                    eq(outs[j], torch.full((2,), j + root, dtype=dtype),
                       f"gather[{j}] root {root} {tag}")
        done(comm.barrier(async_op=a), "barrier")
        k += 1
    return k


def p2p_checks(comm):
    r, n = comm.get_rank(), comm.get_size()
    nxt, prv = (r + 1) % n, (r - 1) % n
    for a in (False, True):
        s = torch.full((1000,), float(r))
        d = torch.full((1000,), -1.0)
        if n > 1:
            if r % 2 == 0:
                done(comm.send(s, nxt, async_op=a), "send")
                done(comm.recv(d, prv, async_op=a), "recv")
            else:
                done(comm.recv(d, prv, async_op=a), "recv")
                done(comm.send(s, nxt, async_op=a), "send")
            eq(d, torch.full((1000,), float(prv)), f"send/recv ring async={a}")
        # both posted before either is waited on
        if n > 1:
            d = torch.full((1000,), -1.0)
            ws = comm.send(s, nxt, async_op=True)
            wr = comm.recv(d, prv, async_op=True)
            done(wr, "recv (posted with send)")
            done(ws, "send (posted with recv)")
            eq(d, torch.full((1000,), float(prv)), "isend/irecv ring")
        # a batch: a send to and a receive from every rank, self included
        for dtype in (torch.int32, torch.bfloat16):
            sends = [torch.full((3,), 100 * r + p, dtype=dtype) for p in range(n)]
            recvs = [torch.full((3,), -1, dtype=dtype) for _ in range(n)]
            b = comm.batch_op_create()
            for p in reversed(range(n)):
                b.recv(recvs[p], p)
            for p in range(n):
                b.send(sends[p], p)
            check(len(b.ops) == 2 * n, "batch: ops list")
            done(b.issue(a), "batch issue")
            for p in range(n):
                eq(recvs[p], torch.full((3,), 100 * p + r, dtype=dtype),
                   f"batch recv from {p} {dtype} async={a}")


def split_checks(comm):
    r, n = comm.get_rank(), comm.get_size()
    ranks = [i for i in range(n) if i % 2 == r % 2]
    sub = comm.split(ranks, f"mpi_py_parity{r % 2}")
    check(sub is not None and sub.get_size() == len(ranks), "split: size")
    check(sub.get_rank() == ranks.index(r), "split: rank")
    for a in (False, True):
        t = torch.tensor([float(r), 1.0, -float(r)])
        done(sub.all_reduce(t, ReduceOp.SUM, async_op=a), "split all_reduce")
        eq(t, torch.tensor([float(sum(ranks)), float(len(ranks)), -float(sum(ranks))]),
           f"all_reduce on split async={a}")
        outs = [torch.zeros(2, dtype=torch.int64) for _ in ranks]
        done(sub.all_gather(outs, torch.tensor([r, 2 * r]), async_op=a), "split all_gather")
        for i, g in enumerate(ranks):
            eq(outs[i], torch.tensor([g, 2 * g]), f"all_gather on split [{i}] async={a}")
    none = comm.split([r] if r == 0 else [], "mpi_py_only0")
    check((none is None) == (r != 0), "split with [] returns None")
    if none is not None:
        t = torch.tensor([5.0])
        none.all_reduce(t, ReduceOp.SUM)
        eq(t, torch.tensor([5.0]), "all_reduce on a split of one rank")
        none.finalize()
    sub.finalize()


# ---- torch.distributed over the communicator -------------------------------

def c10d_checks(comm):
    import torch.distributed as dist

    from torchcomms.device_mesh import _create_torchcomm_process_group

    r, n = comm.get_rank(), comm.get_size()
    pg = _create_torchcomm_process_group(comm, "mpi_c10d")
    check(type(pg).__name__ == "_BackendWrapper", "c10d: the group is a _BackendWrapper")
    check(pg.rank() == r and pg.size() == n, "c10d: rank and size")
    t = torch.arange(4, dtype=torch.float32) + r
    dist.all_reduce(t, group=pg)
    eq(t, torch.arange(4, dtype=torch.float32) * n + n * (n - 1) / 2, "c10d all_reduce SUM")
    t = torch.full((3,), float(r + 1))
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=pg)
    eq(t, torch.full((3,), float(n)), "c10d all_reduce MAX")
    t = torch.full((3,), 2.0 * (r + 1))
    dist.all_reduce(t, op=dist.ReduceOp.AVG, group=pg)
    eq(t, torch.full((3,), float(n + 1)), "c10d all_reduce AVG")
    out = torch.zeros(2 * n, dtype=torch.int64)
    # torch 2.13 names them all_gather_single / reduce_scatter_single (the
    # older *_tensor names warn)
    ag = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    rs = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    w = ag(out, torch.tensor([r, -r]), group=pg, async_op=True)
    w.wait()
    eq(out, torch.tensor([v for i in range(n) for v in (i, -i)]), "c10d all_gather_single")
    out = torch.zeros(2)
    rs(out, torch.arange(2 * n, dtype=torch.float32), group=pg)
    eq(out, (torch.arange(2, dtype=torch.float32) + 2 * r) * n, "c10d reduce_scatter_single")
    t = torch.full((4,), float(r))
    dist.broadcast(t, src=n - 1, group=pg)
    eq(t, torch.full((4,), float(n - 1)), "c10d broadcast")
    if n > 1:
        s = torch.full((5,), float(r))
        d = torch.zeros(5)
        ops = [dist.P2POp(dist.isend, s, (r + 1) % n, group=pg),
               dist.P2POp(dist.irecv, d, (r - 1) % n, group=pg)]
        for w in dist.batch_isend_irecv(ops):
            w.wait()
        eq(d, torch.full((5,), float((r - 1) % n)), "c10d batch_isend_irecv ring")
    dist.barrier(group=pg)
    say("c10d wrapper: all_reduce (SUM, MAX, AVG), all_gather_single, "
        "reduce_scatter_single, broadcast, batch_isend_irecv, barrier passed")


def mesh_checks(comm):
    import torch.distributed as dist
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    from torchcomms.device_mesh import init_device_mesh

    r, n = comm.get_rank(), comm.get_size()
    mesh = init_device_mesh(mesh_dim_comms=(comm,), mesh_dim_names=("mpi_dp",))
    check(tuple(mesh.mesh.shape) == (n,), "mesh: shape")
    g = mesh.get_group()
    check(type(g).__name__ == "_BackendWrapper", "mesh: the group is ours")
    t = torch.full((3,), float(r))
    dist.all_reduce(t, group=g)
    eq(t, torch.full((3,), float(n * (n - 1) // 2)), "mesh 1-D all_reduce")
    full = torch.arange(4 * n * 2, dtype=torch.float32).view(4 * n, 2)
    dt = distribute_tensor(full, mesh, [Shard(0)])
    eq(dt.to_local(), full[4 * r:4 * r + 4], "DTensor Shard(0): local shard")
    eq(dt.full_tensor(), full, "DTensor full_tensor (all_gather)")
    rep = dt.redistribute(mesh, [Replicate()])
    eq(rep.to_local(), full, "DTensor redistribute to Replicate")
    what = "1-D"
    if n == 4:
        rows, cols = 2, 2
        dp = comm.split([i for i in range(n) if i % cols == r % cols], "mpi_mesh_dp")
        tp = comm.split([i for i in range(n) if i // cols == r // cols], "mpi_mesh_tp")
        m2 = init_device_mesh(mesh_dim_comms=(dp, tp), mesh_dim_names=("dp", "tp"),
                              _global_comm=comm)
        check(tuple(m2.mesh.shape) == (rows, cols), "mesh 2-D: shape")
        t = torch.tensor([float(r)])
        dist.all_reduce(t, group=m2.get_group("tp"))
        row = [i for i in range(n) if i // cols == r // cols]
        eq(t, torch.tensor([float(sum(row))]), "mesh 2-D all_reduce over tp")
        t = torch.tensor([float(r)])
        dist.all_reduce(t, group=m2.get_group("dp"))
        col = [i for i in range(n) if i % cols == r % cols]
        eq(t, torch.tensor([float(sum(col))]), "mesh 2-D all_reduce over dp")
        full = torch.arange(rows * cols * 6, dtype=torch.float32).view(rows * 2, cols * 3)
        d2 = distribute_tensor(full, m2, [Shard(0), Shard(1)])
        eq(d2.full_tensor(), full, "DTensor 2-D Shard(0), Shard(1): full_tensor")
        what = "1-D and 2 x 2"
    say(f"DeviceMesh: {what} meshes, collectives on their groups, DTensor passed")


# ---------------------------------------------------------------------------

def main():
    global RANK, BACKEND
    if len(sys.argv) > 2 or (len(sys.argv) == 2 and sys.argv[1] in ("-h", "--help")):
        print(__doc__, file=sys.stderr)
        return 2
    if len(sys.argv) == 2:
        BACKEND = sys.argv[1]
    t0 = time.monotonic()
    comm = torchcomms.new_comm(BACKEND, torch.device("cpu"), name="mpi_py",
                               timeout=timedelta(seconds=120))
    RANK = comm.get_rank()
    n = comm.get_size()
    say(f"backend {comm.get_backend()} ({comm.get_backend_version()}), {n} ranks, "
        f"torch {torch.__version__}")
    try:
        check(comm.get_backend() == BACKEND, f"get_backend() == {BACKEND!r}")
        all_reduce_checks(comm)
        k = 0
        for dtype in (torch.float32, torch.float16, torch.bfloat16, torch.int32, torch.int64,
                      torch.uint8, torch.int8):
            k += movement_checks(comm, dtype)
        say(f"broadcast, all_gather(_single), reduce_scatter(_single), all_to_all(_single, "
            f"_v_single), scatter, gather, barrier: {k} rounds passed")
        p2p_checks(comm)
        say("send/recv, batch (BatchSendRecv): passed")
        split_checks(comm)
        say("split even/odd, split of one: passed")
        c10d_checks(comm)
        mesh_checks(comm)
        comm.barrier()
    except Exception:
        traceback.print_exc()
        FAILURES.append("exception")
    if FAILURES:
        print(f"[rank {RANK}] {len(FAILURES)} failures", file=sys.stderr, flush=True)
        sys.stderr.flush()
        # a failed rank does not finalize: its peers must not wait on it
        os._exit(1)
    comm.finalize()
    say(f"{CHECKS} checks passed on rank 0 (backend {BACKEND}, {n} ranks) in "
        f"{time.monotonic() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
