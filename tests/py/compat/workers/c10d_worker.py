#!/usr/bin/env python3
"""The c10d wrapper's corners (issue 13, point 3), on every rank under torchrun:

    torchrun --standalone --nproc_per_node=N c10d_worker.py OUTDIR

Phase 1: torchcomms.register_c10d_backend() and
dist.init_process_group(backend="torchcomms"); parts:

- import_paths: `from torchcomms._comms import _BackendWrapper` (what torch
  2.13 and torchcomms' tests import) is our wrapper, and torch found it;
- coalescing: supports_coalescing, batch_isend_irecv rings where every rank
  lists its recv first (small and 4 MiB), several peers, _coalescing_manager
  with p2p and with collectives, _start/_end_coalescing directly and misuse;
- allgather_aliased: all_gather / gather / all_to_all into outputs that
  share memory ([buf] * n): the last rank's chunk wins, exactly;
- monitored_barrier: every rank arrives; a rank that does not (rank 0 names
  it, fast-fail); several that do not (wait_all_ranks: all named); the
  ranks that did arrive are told; dist.monitored_barrier takes our groups;
- shutdown_abort: shutdown twice, abort twice, destroy_process_group after
  either, _abort_process_group, operations afterwards fail clearly;
- mesh_create_pg, mesh_flatten: torchcomms.device_mesh's
  _create_torchcomm_process_group (upstream's signatures) and
  _flatten_with_comm (2-D mesh at 4 ranks, 1-D at 2);
- destroy: dist.destroy_process_group() of the default group.

Phase 2: dist.config.use_torchcomms = True and init_process_group("gloo")
(torch's own path to our _BackendWrapper); parts:

- monitored_barrier_dist: dist.monitored_barrier (torch accepts the group:
  its backend is "gloo"), passing and with a rank that does not arrive;
- destroy_use_torchcomms: dist.destroy_process_group() finalizes.
"""

import inspect
import os
import sys
from datetime import timedelta

sys.path.insert(0, os.path.dirname(__file__))
from compat_lib import Worker  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.distributed import distributed_c10d as c10d  # noqa: E402

import torchcomms  # noqa: E402

w = Worker()
R, N = w.rank, w.size
CPU = torch.device("cpu")
MB_TIMEOUT = timedelta(milliseconds=500)
REACHED = ("Rank {r} successfully reached monitoredBarrier, but received errors while "
           "waiting for send/recv from rank 0. Please check rank 0 logs for the faulty rank."
           "\n Original exception: \n")


def outcome(fn):
    """'ok', or 'ExceptionType: message'."""
    try:
        fn()
        return "ok"
    except Exception as e:  # noqa: BLE001  compared below
        return f"{type(e).__name__}: {e}"


# --------------------------------------------------------------------------
torchcomms.register_c10d_backend()
dist.init_process_group(backend="torchcomms", timeout=timedelta(seconds=60))
WORLD = dist.group.WORLD


@w.part("import_paths")
def _(c):
    from torchcomms import _backend_wrapper
    from torchcomms._comms import _BackendWrapper, _WorkWrapper

    c.true("_comms._BackendWrapper is the wrapper class",
           _BackendWrapper is _backend_wrapper._BackendWrapper)
    c.true("_comms._WorkWrapper", _WorkWrapper is _backend_wrapper._WorkWrapper)
    c.true("torch found torchcomms", c10d._TORCHCOMM_AVAILABLE)
    c.true("torch's _BackendWrapper is ours", c10d._BackendWrapper is _BackendWrapper)
    c.true("the default group is one", isinstance(WORLD, _BackendWrapper))
    c.true("its backend for cpu is itself", WORLD._get_backend(CPU) is WORLD)
    with c.raises(AttributeError, "has no attribute 'nope'"):
        torchcomms._comms.nope  # noqa: B018


# --------------------------------------------------------------------------
def ring(count, peers=(1,)):
    """batch_isend_irecv: every rank lists all its recvs first."""
    sends = [torch.arange(count, dtype=torch.float32) + 1000.0 * R + 100.0 * k
             for k in range(len(peers))]
    recvs = [torch.full((count,), -1.0) for _ in peers]
    ops = [dist.P2POp(dist.irecv, recvs[k], (R - d) % N) for k, d in enumerate(peers)]
    ops += [dist.P2POp(dist.isend, sends[k], (R + d) % N) for k, d in enumerate(peers)]
    for req in dist.batch_isend_irecv(ops):
        req.wait()
    return recvs, [torch.arange(count, dtype=torch.float32) + 1000.0 * ((R - d) % N) + 100.0 * k
                   for k, d in enumerate(peers)]


@w.part("coalescing")
def _(c):
    c.eq("supports_coalescing", WORLD._get_backend(CPU).supports_coalescing, True)
    for count in (4, 1 << 20):  # 16 B and 4 MiB per message
        got, exp = ring(count)
        c.eq(f"ring recv-first {count * 4} B", got[0], exp[0])
    if N >= 3:
        got, exp = ring(1 << 19, peers=(1, 2))
        for k in range(2):
            c.eq(f"two peers recv-first, peer -{k + 1}", got[k], exp[k])
    # the coalescing manager with a device: _start/_end_coalescing around p2p
    recv = torch.full((1 << 19,), -1.0)
    with dist._coalescing_manager(device=CPU, async_ops=True) as cm:
        dist.irecv(recv, src=(R - 1) % N)
        dist.isend(torch.full((1 << 19,), float(R)), dst=(R + 1) % N)
    cm.wait()
    c.eq("_coalescing_manager p2p recv-first", recv, torch.full((1 << 19,), float((R - 1) % N)))
    # ... and around collectives (torch's allreduce_coalesced fast path)
    a, b = torch.full((3,), float(R + 1)), torch.full((5,), 2.0 * R)
    with dist._coalescing_manager(device=CPU, async_ops=True) as cm:
        dist.all_reduce(a)
        dist.all_reduce(b)
    cm.wait()
    c.eq("_coalescing_manager all_reduce a", a, torch.full((3,), N * (N + 1) / 2))
    c.eq("_coalescing_manager all_reduce b", b, torch.full((5,), float(N * (N - 1))))
    # directly: collectives and p2p in one window, one Work over all of them
    x, y = torch.full((2,), float(R)), torch.zeros(4)
    WORLD._start_coalescing(CPU)
    WORLD.allreduce([x])
    WORLD.recv([y], (R - 1) % N)
    WORLD.send([torch.full((4,), 10.0 * R)], (R + 1) % N)
    work = WORLD._end_coalescing(CPU)
    work.wait()
    c.eq("window all_reduce", x, torch.full((2,), N * (N - 1) / 2))
    c.eq("window recv", y, torch.full((4,), 10.0 * ((R - 1) % N)))
    c.eq("window result: the outputs issued in it", [t is x or t is y for t in work.result()][:2],
         [True, True])
    c.true("empty window", WORLD._start_coalescing(CPU) or WORLD._end_coalescing(CPU).wait())
    with c.raises(RuntimeError, r"_end_coalescing on group .* without a matching _start_coalescing"):
        WORLD._end_coalescing(CPU)
    WORLD._start_coalescing(CPU)
    with c.raises(RuntimeError, r"while a coalescing window is already open"):
        WORLD._start_coalescing(CPU)
    WORLD._end_coalescing(CPU).wait()


# --------------------------------------------------------------------------
def chunk(r, base=0.0):
    return torch.tensor([base + r, base + r + 0.5, -(base + r)], dtype=torch.float32)


@w.part("allgather_aliased")
def _(c):
    shared = torch.full((3,), -1.0)
    dist.all_gather([shared] * N, chunk(R))
    c.eq("[buf] * n: the last rank's chunk", shared, chunk(N - 1))
    outs = [torch.empty(3) for _ in range(N)]
    dist.all_gather(outs, chunk(R, 100.0))
    c.eq("distinct outputs afterwards", torch.stack(outs),
         torch.stack([chunk(k, 100.0) for k in range(N)]))
    shared = torch.full((3,), -1.0)
    dist.all_gather([shared] * N, chunk(R, 7.0), async_op=True).wait()
    c.eq("async [buf] * n", shared, chunk(N - 1, 7.0))
    a, b = torch.zeros(3), torch.zeros(3)
    pattern = [a, b] * (N // 2)
    dist.all_gather(pattern, chunk(R))
    c.eq("[a, b, a, b...]: a holds the last even rank's chunk", a, chunk(N - 2))
    c.eq("... b the last odd rank's", b, chunk(N - 1))
    # overlapping windows of one tensor: copies in rank order
    big, ref = torch.zeros(N + 2), torch.zeros(N + 2)
    dist.all_gather([big[k:k + 3] for k in range(N)], chunk(R))
    for k in range(N):
        ref[k:k + 3] = chunk(k)
    c.eq("overlapping windows", big, ref)
    # gather and all_to_all into aliased outputs
    g = torch.full((3,), -1.0)
    dist.gather(chunk(R), [g] * N if R == 0 else None, dst=0)
    if R == 0:
        c.eq("gather [buf] * n at the root", g, chunk(N - 1))
    t = torch.full((2,), -1.0)
    dist.all_to_all([t] * N, [torch.full((2,), 10.0 * R + k) for k in range(N)])
    c.eq("all_to_all [buf] * n", t, torch.full((2,), 10.0 * (N - 1) + R))


# --------------------------------------------------------------------------
def straggle(c, what, absent, call):
    """Ranks not in `absent` call `call(group)` on a fresh group; then every
    rank reads every rank's outcome (all_gather_object over the world)."""
    g = dist.new_group(list(range(N)))
    mine = "absent" if R in absent else outcome(lambda: call(g))
    every = [None] * N
    dist.all_gather_object(every, mine)
    dist.destroy_process_group(g)
    return every


@w.part("monitored_barrier")
def _(c):
    g = dist.new_group(list(range(N)))
    g.monitored_barrier(timedelta(seconds=30), wait_all_ranks=True)
    g.monitored_barrier(timeout=None)  # the group's timeout
    g.monitored_barrier(30.0, wait_all_ranks=False)  # seconds
    dist.destroy_process_group(g)
    # torch's entry point accepts groups of our c10d backend (it refuses any
    # other non-gloo backend before reaching the group)
    dist.monitored_barrier(WORLD, timeout=timedelta(seconds=30), wait_all_ranks=True)
    dist.monitored_barrier()
    c.eq("torch.distributed's name is the wrapped one", dist.monitored_barrier,
         dist.distributed_c10d.monitored_barrier)

    # fast-fail: the first absent rank is named; the others are not probed
    s = 1 if N == 2 else 2
    every = straggle(c, "fast", {s}, lambda g: dist.monitored_barrier(g, timeout=MB_TIMEOUT))
    head = f"RuntimeError: [Rank 0]: Rank {s} failed to pass monitoredBarrier in 500 ms"
    c.true(f"rank 0 names rank {s}: {every[0]!r}",
           every[0].startswith(head + "\n Original exception: \n"))
    for r in range(1, N):
        if r == s:
            c.eq(f"rank {r} outcome", every[r], "absent")
        else:
            c.true(f"rank {r} is told: {every[r]!r}",
                   every[r].startswith("RuntimeError: " + REACHED.format(r=r) + head[14:]))

    # wait_all_ranks: every absent rank (the odd ones) named, each given the timeout
    odd = {r for r in range(N) if r % 2}
    every = straggle(c, "all", odd,
                     lambda g: g.monitored_barrier(MB_TIMEOUT, wait_all_ranks=True))
    msg = (f"[Rank 0]: Ranks {', '.join(map(str, sorted(odd)))} failed to pass "
           f"monitoredBarrier in 500 ms")
    c.eq("rank 0 names every absent rank", every[0], "RuntimeError: " + msg)
    for r in range(1, N):
        c.eq(f"rank {r} outcome", every[r],
             "absent" if r in odd else "RuntimeError: " + REACHED.format(r=r) + msg)


# --------------------------------------------------------------------------
@w.part("shutdown_abort")
def _(c):
    g = dist.new_group(list(range(N)))
    t = torch.ones(4)
    dist.all_reduce(t, group=g)
    c.eq("all_reduce before", t, torch.full((4,), float(N)))
    g.shutdown()
    g.shutdown()  # idempotent
    with c.raises(RuntimeError, r"all_reduce on .*finalized"):
        g.allreduce([torch.ones(2)]).wait()
    dist.destroy_process_group(g)  # after shutdown: torch finalizes and shuts down again
    c.true("destroyed group unregistered", g not in c10d._world.pg_map)

    g2 = dist.new_group(list(range(N)))
    c10d._abort_process_group(g2)
    c.true("aborted", g2.get_comm().is_aborted())
    with c.raises(RuntimeError, r"all_reduce on .*aborted"):
        g2.allreduce([torch.ones(2)]).wait()
    g2.abort()  # idempotent
    g2.shutdown()  # a no-op once aborted
    c.true("aborted group unregistered", g2 not in c10d._world.pg_map)

    g3 = dist.new_group(list(range(N)))
    g3.abort()
    dist.destroy_process_group(g3)  # finalize of an aborted communicator: no error
    c.true("destroyed after abort", g3 not in c10d._world.pg_map)
    t = torch.ones(2)
    dist.all_reduce(t)
    c.eq("the default group still works", t, torch.full((2,), float(N)))


# --------------------------------------------------------------------------
@w.part("mesh_create_pg")
def _(c):
    from torchcomms.device_mesh import _create_torchcomm_process_group

    c.eq("signature", list(inspect.signature(_create_torchcomm_process_group).parameters),
         ["comm", "group_name", "backend_str", "global_ranks_mapping", "prefix_store"])
    world = torchcomms.new_comm("cpu", CPU, name="cpg_world")
    pg = _create_torchcomm_process_group(world, "cpg_world")
    c.true("a ProcessGroup", isinstance(pg, dist.ProcessGroup))
    c.eq("group_name", pg.group_name, "cpg_world")
    c.eq("tag", c10d._get_group_tag(pg), "ptd:cpg_world")
    c.eq("ranks", dist.get_process_group_ranks(pg), list(range(N)))
    c.eq("backend", dist.get_backend(pg), "torchcomm")
    t = torch.full((2,), float(R + 1))
    dist.all_reduce(t, group=pg)
    c.eq("all_reduce", t, torch.full((2,), N * (N + 1) / 2))
    half = [k for k in range(N) if k // 2 == R // 2]
    hc = world.split(half, "cpg_half")
    pg2 = _create_torchcomm_process_group(hc, "cpg_half", "torchcomm",
                                          {gr: i for i, gr in enumerate(half)})
    c.eq("mapped ranks", dist.get_process_group_ranks(pg2), half)
    c.eq("group rank", dist.get_rank(pg2), half.index(R))
    t = torch.full((2,), float(R + 1))
    dist.all_reduce(t, group=pg2)
    c.eq("all_reduce over the half", t, torch.full((2,), float(sum(k + 1 for k in half))))
    # the older positional order (comm, name, backend, prefix_store, mapping)
    hc2 = world.split(half, "cpg_old")
    store = dist.PrefixStore("cpg_old/", dist.HashStore())
    pg3 = _create_torchcomm_process_group(hc2, "cpg_old", "torchcomm", store,
                                          {gr: i for i, gr in enumerate(half)})
    c.true("prefix_store in 4th place", pg3.get_group_store() is store)
    c.eq("its ranks", dist.get_process_group_ranks(pg3), half)
    for p in (pg3, pg2, pg):
        dist.destroy_process_group(p)


@w.part("mesh_flatten")
def _(c):
    from torchcomms.device_mesh import _flatten_with_comm, init_device_mesh

    world = torchcomms.new_comm("cpu", CPU, name="fl_world")
    if N == 4:
        dp = world.split([k for k in range(N) if k % 2 == R % 2], "fl_dp")
        tp = world.split([k for k in range(N) if k // 2 == R // 2], "fl_tp")
        mesh = init_device_mesh((dp, tp), ("dp", "tp"), _global_comm=world)
    else:
        mesh = init_device_mesh((world,), ("dp",))
    flat_comm = world.split(list(range(N)), "fl_flat")
    flat = _flatten_with_comm(mesh, "dp_tp", flat_comm, list(range(N)), mesh._layout)
    c.true("the root mesh knows it", mesh._get_root_mesh()._flatten_mapping["dp_tp"] is flat)
    c.eq("mesh['dp_tp'] slices it", mesh["dp_tp"].mesh.tolist(), list(range(N)))
    c.true("... with its group", mesh["dp_tp"].get_group() is flat.get_group())
    c.eq("its ranks", flat.mesh.tolist(), list(range(N)))
    c.eq("its size", flat.size(), N)
    c.eq("local rank", flat.get_local_rank(), R)
    grp = flat.get_group()
    c.eq("group name", grp.group_name, "dp_tp")
    c.true("group over the given communicator", grp.get_comm() is flat_comm)
    c.eq("group ranks", dist.get_process_group_ranks(grp), list(range(N)))
    t = torch.full((3,), float(R + 1))
    dist.all_reduce(t, group=grp)
    c.eq("all_reduce over the flattened dimension", t, torch.full((3,), N * (N + 1) / 2))
    with c.raises(ValueError, "is a dimension of the mesh already"):
        _flatten_with_comm(mesh, "dp", flat_comm, list(range(N)), mesh._layout)
    if N == 4:
        t = torch.full((1,), float(R))
        dist.all_reduce(t, group=mesh.get_group("tp"))
        c.eq("the mesh's own dims still work", t, torch.full((1,), float(2 * (R // 2) * 2 + 1)))


@w.part("destroy")
def _(c):
    comm = WORLD.get_comm()
    dist.destroy_process_group()
    c.true("not initialized", not dist.is_initialized())
    with c.raises(RuntimeError, r"finalized"):
        comm.all_reduce(torch.ones(1), torchcomms.ReduceOp.SUM)


# --------------------------------------------------------------------------
# phase 2: torch's own torchcomms path (use_torchcomms, backend "gloo")
dist.config.use_torchcomms = True
_base = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                      is_master=False, use_libuv=False)
dist.init_process_group("gloo", store=dist.PrefixStore("c10d_phase2/", _base),
                        rank=R, world_size=N, timeout=timedelta(seconds=60))


@w.part("monitored_barrier_dist")
def _(c):
    c.eq("torch sees a gloo group", dist.get_backend(), "gloo")
    c.eq("over our wrapper", type(dist.group.WORLD).__name__, "_BackendWrapper")
    dist.monitored_barrier(timeout=timedelta(seconds=30), wait_all_ranks=True)
    g = dist.new_group(list(range(N)))
    absent = N - 1
    mine = "absent" if R == absent else outcome(
        lambda: dist.monitored_barrier(g, timeout=MB_TIMEOUT))
    every = [None] * N
    dist.all_gather_object(every, mine)
    head = f"RuntimeError: [Rank 0]: Rank {absent} failed to pass monitoredBarrier in 500 ms"
    c.true(f"rank 0 names rank {absent}: {every[0]!r}", every[0].startswith(head))
    for r in range(1, N - 1):
        c.true(f"rank {r} is told", every[r].startswith("RuntimeError: " + REACHED.format(r=r)))
    dist.destroy_process_group(g)


@w.part("destroy_use_torchcomms")
def _(c):
    comm = dist.group.WORLD.get_comm()
    dist.destroy_process_group()
    c.true("not initialized", not dist.is_initialized())
    c.eq("torch's comm list emptied", c10d._world.comms, [])
    with c.raises(RuntimeError, r"finalized"):
        comm.all_reduce(torch.ones(1), torchcomms.ReduceOp.SUM)


sys.exit(w.finish())
