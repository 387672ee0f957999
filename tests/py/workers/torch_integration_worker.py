#!/usr/bin/env python3
"""torch.distributed over torchcomms, on every rank (launched by torchrun):

    torchrun --standalone --nproc_per_node=N torch_integration_worker.py MODE OUTDIR

MODE "main": dist.init_process_group(backend="torchcomms") (our c10d backend,
registered explicitly), then, each part checked exactly on every rank:

- collectives: the torch.distributed functions over our default group
  (all_gather_into_tensor, reduce_scatter_tensor, all_to_all_single (even and
  uneven splits), broadcast, barrier, all_reduce with every op incl. AVG and
  PREMUL_SUM (float and tensor factors), all_gather, gather, scatter, reduce,
  all_to_all, batch_isend_irecv (a ring of 8 MiB messages), send/recv,
  async works and their futures, object collectives, coalesced ops);
- subgroups: dist.new_group(ranks) (both orders of the list) and
  dist.new_group(backend="torchcomms") over a gloo-free path, rank mapping;
- ddp: DDP on a small MLP for 20 steps over our group and over a gloo group
  (dist.new_group(backend="gloo")), same data: the parameters after every
  step compared (max abs diff);
- fsdp: FSDP2 (fully_shard over torchcomms.device_mesh.init_device_mesh) for
  20 steps with the default AVG reduction and with set_gradient_divide_factor
  (PREMUL_SUM); the loss per step against a single-process reference, and the
  final parameters (DTensor.full_tensor: functional collectives);
- mesh2d: a 2-D DeviceMesh (2 x N/2) from TorchComm.split; all_reduce over
  each dimension, functional collectives and a DTensor over both dims.

MODE "use_torchcomms": TORCH_DISTRIBUTED_USE_TORCHCOMMS=1 and
TORCHCOMMS_CPU_INLINE_BYTES=0 (set by the test: every operation goes through
the progress thread, so the futures' helper thread is exercised),
plus DDP for 20 steps against a single-process reference,
dist.init_process_group(backend="gloo"): torch's own torchcomms path creates
the communicator (new_comm) and our _BackendWrapper; collectives, new_group
(through split_group), torch's init_device_mesh, destroy_process_group.

Each rank writes OUTDIR/<mode>-rank<r>.json: {"errors": [...], "figures": {...},
"parts": [...]} and prints a summary line.
"""

import copy
import json
import os
import sys
import time
import traceback
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn as nn

TIMEOUT = timedelta(seconds=60)
STEPS = 20


class Checker:
    def __init__(self):
        self.errors, self.figures, self.parts = [], {}, []
        self.checks = 0
        self.part = ""

    def fail(self, msg):
        self.errors.append(f"[{self.part}] {msg}")

    def eq(self, what, got, exp):
        self.checks += 1
        if isinstance(got, torch.Tensor) or isinstance(exp, torch.Tensor):
            exp_t = exp if isinstance(exp, torch.Tensor) else torch.tensor(exp)
            ok = (isinstance(got, torch.Tensor) and got.shape == exp_t.shape
                  and got.dtype == exp_t.dtype and torch.equal(got, exp_t))
        else:
            ok = got == exp
        if not ok:
            self.fail(f"{what}: got {_short(got)} expected {_short(exp)}")
        return ok

    def true(self, what, cond):
        self.checks += 1
        if not cond:
            self.fail(what)
        return cond

    def run(self, name, fn, *args):
        t0, c0, outer = time.perf_counter(), self.checks, self.part
        self.part = name
        try:
            fn(self, *args)
            self.parts.append(name)
        except Exception:  # noqa: BLE001
            self.fail(f"raised:\n{traceback.format_exc()}")
            return False
        finally:
            self.part = outer
            self.figures[f"time_{name}_s"] = round(time.perf_counter() - t0, 3)
            self.figures[f"checks_{name}"] = self.checks - c0
        return True


def _short(x):
    if isinstance(x, torch.Tensor):
        return f"tensor{tuple(x.shape)} {x.dtype} {x.flatten()[:12].tolist()}"
    return repr(x)[:300]


# --------------------------------------------------------------------------
# collectives over the default group
# --------------------------------------------------------------------------

def collectives(ck, group=None):
    r, n = dist.get_rank(group), dist.get_world_size(group)
    g = group
    tri = float(n * (n + 1) // 2)

    out = torch.empty(3 * n)
    dist.all_gather_into_tensor(out, torch.arange(3, dtype=torch.float) + 10 * r, group=g)
    ck.eq("all_gather_into_tensor", out,
          torch.cat([torch.arange(3, dtype=torch.float) + 10 * k for k in range(n)]))
    out2 = torch.empty(n, 2, dtype=torch.int64)  # into a 2-D tensor (FSDP's layout)
    dist.all_gather_into_tensor(out2, torch.tensor([[r, -r]]), group=g)
    ck.eq("all_gather_into_tensor 2-D", out2, torch.tensor([[k, -k] for k in range(n)]))

    inp = torch.arange(2 * n, dtype=torch.float) * (r + 1)
    rs = torch.empty(2)
    dist.reduce_scatter_tensor(rs, inp, group=g)
    ck.eq("reduce_scatter_tensor sum", rs, torch.arange(2 * r, 2 * r + 2, dtype=torch.float) * tri)
    dist.reduce_scatter_tensor(rs, inp, op=dist.ReduceOp.AVG, group=g)
    ck.eq("reduce_scatter_tensor avg", rs,
          torch.arange(2 * r, 2 * r + 2, dtype=torch.float) * tri / n)

    a2a = torch.empty(2 * n)
    dist.all_to_all_single(a2a, torch.arange(2 * n, dtype=torch.float) + 100 * r, group=g)
    ck.eq("all_to_all_single", a2a,
          torch.tensor([100.0 * k + 2 * r + j for k in range(n) for j in range(2)]))
    # uneven: rank r sends (k + 1) rows to rank k
    in_splits = [k + 1 for k in range(n)]
    out_splits = [r + 1] * n
    src = torch.cat([torch.full((k + 1, 2), float(10 * r + k)) for k in range(n)])
    dst = torch.empty(sum(out_splits), 2)
    dist.all_to_all_single(dst, src, out_splits, in_splits, group=g)
    ck.eq("all_to_all_single uneven", dst,
          torch.cat([torch.full((r + 1, 2), float(10 * k + r)) for k in range(n)]))

    for root in range(n):
        b = torch.full((5,), float(r)) if r == root else torch.zeros(5)
        dist.broadcast(b, group_src=root, group=g)
        ck.eq(f"broadcast root {root}", b, torch.full((5,), float(root)))
    dist.barrier(group=g)

    ops = [("SUM", dist.ReduceOp.SUM, tri),
           ("PRODUCT", dist.ReduceOp.PRODUCT, float(torch.arange(1, n + 1).prod())),
           ("MIN", dist.ReduceOp.MIN, 1.0), ("MAX", dist.ReduceOp.MAX, float(n)),
           ("AVG", dist.ReduceOp.AVG, tri / n),
           ("PREMUL_SUM(0.5)", dist._make_nccl_premul_sum(0.5), tri * 0.5),
           ("PREMUL_SUM(tensor 2.0)", dist._make_nccl_premul_sum(torch.tensor([2.0])), tri * 2.0),
           ("ReduceOp.PREMUL_SUM(0.25)", dist.ReduceOp.PREMUL_SUM(0.25), tri * 0.25)]
    for name, op, exp in ops:
        t = torch.full((7,), float(r + 1))
        dist.all_reduce(t, op=op, group=g)
        ck.eq(f"all_reduce {name}", t, torch.full((7,), exp))
    t = torch.full((4,), 1 << r, dtype=torch.int32)
    dist.all_reduce(t, op=dist.ReduceOp.BOR, group=g)
    ck.eq("all_reduce BOR", t, torch.full((4,), (1 << n) - 1, dtype=torch.int32))
    # non-contiguous (staged through a contiguous copy)
    m = torch.full((4, 6), float(r + 1))
    col = m[:, 1]
    dist.all_reduce(col, group=g)
    ck.eq("all_reduce non-contiguous", m[:, 1], torch.full((4,), tri))
    ck.eq("all_reduce non-contiguous untouched", m[:, 0], torch.full((4,), float(r + 1)))

    lst = [torch.empty(2) for _ in range(n)]
    dist.all_gather(lst, torch.full((2,), float(r)), group=g)
    ck.eq("all_gather", torch.stack(lst), torch.stack([torch.full((2,), float(k)) for k in range(n)]))
    # sizes that differ per rank (all_gather_v underneath)
    lst = [torch.empty(k + 1) for k in range(n)]
    dist.all_gather(lst, torch.full((r + 1,), float(r)), group=g)
    ck.eq("all_gather uneven", torch.cat(lst),
          torch.cat([torch.full((k + 1,), float(k)) for k in range(n)]))
    rsl = torch.empty(3)
    dist.reduce_scatter(rsl, [torch.full((3,), float(r + k)) for k in range(n)], group=g)
    ck.eq("reduce_scatter list", rsl, torch.full((3,), float(tri - n + n * r)))
    objs = [None] * n
    dist.all_gather_object(objs, {"rank": r, "s": "x" * r}, group=g)
    ck.eq("all_gather_object", objs, [{"rank": k, "s": "x" * k} for k in range(n)])

    for root in range(n):
        gl = [torch.empty(3) for _ in range(n)] if r == root else None
        dist.gather(torch.full((3,), float(r * r)), gl, group_dst=root, group=g)
        if r == root:
            ck.eq(f"gather root {root}", torch.stack(gl),
                  torch.stack([torch.full((3,), float(k * k)) for k in range(n)]))
        sc = torch.empty(2)
        dist.scatter(sc, [torch.full((2,), float(k + 7)) for k in range(n)] if r == root else None,
                     group_src=root, group=g)
        ck.eq(f"scatter root {root}", sc, torch.full((2,), float(r + 7)))
        t = torch.full((3,), float(r + 1))
        dist.reduce(t, group_dst=root, op=dist.ReduceOp.SUM, group=g)
        if r == root:
            ck.eq(f"reduce root {root}", t, torch.full((3,), tri))

    outs = [torch.empty(k + 1) for k in range(n)]
    dist.all_to_all(outs, [torch.full((r + 1,), float(10 * r + k)) for k in range(n)], group=g)
    ck.eq("all_to_all", torch.cat(outs), torch.cat([torch.full((k + 1,), float(10 * k + r))
                                                     for k in range(n)]))

    # point to point: a ring of 8 MiB messages, both directions at once
    if n > 1:
        big = 1 << 21
        nxt, prv = (r + 1) % n, (r - 1) % n
        s1, s2 = torch.full((big,), float(r)), torch.full((big,), float(-r))
        d1, d2 = torch.empty(big), torch.empty(big)
        ops = [dist.P2POp(dist.isend, s1, nxt, g), dist.P2POp(dist.isend, s2, prv, g),
               dist.P2POp(dist.irecv, d1, prv, g), dist.P2POp(dist.irecv, d2, nxt, g)]
        for w in dist.batch_isend_irecv(ops):
            w.wait()
        ck.eq("batch_isend_irecv ring from prev", d1[::65536], torch.full((32,), float(prv)))
        ck.eq("batch_isend_irecv ring from next", d2[::65536], torch.full((32,), float(-nxt)))
        # isend first on every rank, then irecv: posted together when waited on
        w1 = dist.isend(s1, group_dst=nxt, group=g)
        w2 = dist.irecv(d1.zero_(), group_src=prv, group=g)
        w2.wait()
        w1.wait()
        ck.eq("isend/irecv ring", d1[::65536], torch.full((32,), float(prv)))
        if r == 0:
            dist.send(torch.arange(5, dtype=torch.float), group_dst=n - 1, group=g)
        elif r == n - 1:
            rv = torch.empty(5)
            dist.recv(rv, group_src=0, group=g)
            ck.eq("send/recv", rv, torch.arange(5, dtype=torch.float))

    # async works and futures (what DDP's comm hooks read)
    ts = [torch.full((1000,), float(r + i)) for i in range(4)]
    works = [dist.all_reduce(t, async_op=True, group=g) for t in ts]
    futs = [w.get_future() for w in works]
    vals = [f.wait() for f in futs]
    for i, (v, t) in enumerate(zip(vals, ts)):
        exp = torch.full((1000,), tri - n + n * i)
        ck.true(f"future {i} value is [tensor]", isinstance(v, list) and len(v) == 1 and v[0] is t)
        ck.eq(f"future {i} result", t, exp)
    # large (past the inline threshold): in flight when their futures are asked for
    bigs = [torch.full((1 << 20,), float(r + i)) for i in range(3)]
    futs = [dist.all_reduce(t, async_op=True, group=g).get_future() for t in bigs]
    torch.futures.wait_all(futs)
    for i, t in enumerate(bigs):
        ck.eq(f"large async all_reduce {i}", t[::4096], torch.full((256,), tri - n + n * i))
    w = dist.all_reduce(torch.ones(2), async_op=True, group=g)
    chained = w.get_future().then(lambda f: f.value()[0] * 2)
    ck.eq("future then", chained.wait(), torch.full((2,), 2.0 * n))
    w.wait()
    ck.true("work is_completed", w.is_completed())

    # coalesced ops
    a, b = torch.full((3,), float(r)), torch.full((5,), float(2 * r))
    dist.all_reduce_coalesced([a, b], group=g)
    ck.eq("all_reduce_coalesced a", a, torch.full((3,), tri - n))
    ck.eq("all_reduce_coalesced b", b, torch.full((5,), 2 * (tri - n)))
    pg = g if g is not None else dist.group.WORLD
    o1, o2 = torch.empty(2 * n), torch.empty(n)
    import torch._C._distributed_c10d as C

    pg.all_gather_single_coalesced([o1, o2], [torch.full((2,), float(r)), torch.full((1,), float(-r))],
                                   C.AllgatherOptions()).wait()
    ck.eq("all_gather_single_coalesced", o1, torch.arange(n, dtype=torch.float).repeat_interleave(2))
    ck.eq("all_gather_single_coalesced 2", o2, -torch.arange(n, dtype=torch.float))
    with dist._coalescing_manager(group=g, device=torch.device("cpu"), async_ops=True) as cm:
        x1, x2 = torch.full((2,), 1.0), torch.full((3,), 2.0)
        dist.all_reduce(x1, group=g)
        dist.all_reduce(x2, group=g)
    cm.wait()
    ck.eq("coalescing manager", torch.cat([x1, x2]), torch.tensor([n, n, 2.0 * n, 2.0 * n, 2.0 * n]))

    # the functional collectives (C++ -> our group through torch's trampoline)
    import torch.distributed._functional_collectives as funcol

    t = funcol.all_reduce(torch.full((4,), float(r + 1)), "sum", pg)
    ck.eq("funcol all_reduce", t.wait() if hasattr(t, "wait") else t, torch.full((4,), tri))
    t = funcol.all_gather_tensor(torch.full((2,), float(r)), 0, pg)
    ck.eq("funcol all_gather_tensor", torch.as_tensor(t).clone(),
          torch.arange(n, dtype=torch.float).repeat_interleave(2))
    t = funcol.reduce_scatter_tensor(torch.arange(n, dtype=torch.float) * (r + 1), "sum", 0, pg)
    ck.eq("funcol reduce_scatter_tensor", torch.as_tensor(t).clone(), torch.tensor([r * tri]))
    t = funcol.all_to_all_single(torch.arange(n, dtype=torch.float) + 10 * r, None, None, pg)
    ck.eq("funcol all_to_all_single", torch.as_tensor(t).clone(),
          torch.tensor([10.0 * k + r for k in range(n)]))
    t = funcol.broadcast(torch.full((2,), float(r)), 0, pg)
    ck.eq("funcol broadcast", torch.as_tensor(t).clone(), torch.zeros(2))


def subgroups(ck):
    r, n = dist.get_rank(), dist.get_world_size()
    world = dist.group.WORLD
    # every pair of ranks {0, n-1} and the odd ranks, in a shuffled list order
    members = [n - 1, 0]
    g = dist.new_group(members)
    if r in members:
        ck.eq("new_group rank", dist.get_rank(g), sorted(members).index(r))
        ck.eq("new_group size", dist.get_world_size(g), len(set(members)))
        t = torch.full((3,), float(r + 1))
        dist.all_reduce(t, group=g)
        ck.eq("new_group all_reduce", t, torch.full((3,), float(1 + n) if n > 1 else 1.0))
        b = torch.full((2,), float(r))
        dist.broadcast(b, src=n - 1, group=g)  # a global rank, mapped to the group's
        ck.eq("new_group broadcast src=global", b, torch.full((2,), float(n - 1)))
        ck.eq("new_group global ranks", dist.get_process_group_ranks(g), sorted(set(members)))
    else:
        ck.eq("new_group non-member", g, dist.GroupMember.NON_GROUP_MEMBER)
    odd = [k for k in range(n) if k % 2 == 1]
    if odd:
        h = dist.new_group(odd, backend="torchcomms")
        if r in odd:
            t = torch.full((2,), float(r))
            dist.all_reduce(t, group=h)
            ck.eq("new_group(backend=torchcomms) all_reduce", t, torch.full((2,), float(sum(odd))))
            out = torch.empty(len(odd))
            dist.all_gather_into_tensor(out, torch.tensor([float(r)]), group=h)
            ck.eq("new_group all_gather_into_tensor", out, torch.tensor([float(k) for k in odd]))
    ck.true("world group unchanged", dist.group.WORLD is world)


# --------------------------------------------------------------------------
# training: DDP and FSDP2
# --------------------------------------------------------------------------

class MLP(nn.Module):
    def __init__(self, d_in=16, d_hidden=32, d_out=4):
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(d_in, d_hidden), nn.Linear(d_hidden, d_hidden),
                                     nn.Linear(d_hidden, d_out)])

    def forward(self, x):
        for i, layer in enumerate(self.layers):
            x = layer(x)
            if i < len(self.layers) - 1:
                x = torch.tanh(x)
        return x


_TEACHER = torch.randn(16, 4, generator=torch.Generator().manual_seed(7)) / 4


def batch(step, rank, size=8):
    """Rank `rank`'s batch at `step`: inputs and targets of a fixed linear map."""
    g = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randn(size, 16, generator=g)
    y = torch.tanh(x @ _TEACHER) + 0.01 * torch.randn(size, 4, generator=g)
    return x, y


def ddp(ck):
    from torch.nn.parallel import DistributedDataParallel as DDP

    r, n = dist.get_rank(), dist.get_world_size()
    gloo = dist.new_group(backend="gloo")
    ours = dist.group.WORLD
    from torchcomms import hooks

    rec = hooks.FlightRecorderHook(max_entries=100000)
    rec.register_with_comm(ours.get_comm())
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    torch.manual_seed(r)  # a different init on every rank: DDP broadcasts rank 0's
    base = MLP()
    kinds = ("gloo", "torchcomms", "torchcomms_hook")
    models = {k: copy.deepcopy(base) for k in kinds}
    ddps = {"gloo": DDP(models["gloo"], process_group=gloo, bucket_cap_mb=0.002),
            "torchcomms": DDP(models["torchcomms"], process_group=ours, bucket_cap_mb=0.002),
            "torchcomms_hook": DDP(models["torchcomms_hook"], process_group=ours,
                                   bucket_cap_mb=0.002)}
    # the Python comm hook: dist.all_reduce(async_op=True).get_future().then(...)
    ddps["torchcomms_hook"].register_comm_hook(ours, default_hooks.allreduce_hook)
    opts = {k: torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9) for k, m in ddps.items()}
    diffs, hook_diffs, losses = [], [], []
    for step in range(STEPS):
        x, y = batch(step, r)
        for k in kinds:
            opts[k].zero_grad()
            loss = nn.functional.mse_loss(ddps[k](x), y)
            loss.backward()
            opts[k].step()
            if k == "torchcomms":
                losses.append(loss.item())
        for k, out in (("torchcomms", diffs), ("torchcomms_hook", hook_diffs)):
            out.append(max((a - b).abs().max().item() for a, b in
                           zip(models["gloo"].parameters(), models[k].parameters())))
    names = [e["profiling_name"] for e in json.loads(rec.dump_json())["entries"]]
    rec.unregister()
    ck.figures["ddp_max_abs_diff_per_step"] = diffs
    ck.figures["ddp_max_abs_diff"] = max(diffs)
    ck.figures["ddp_hook_max_abs_diff"] = max(hook_diffs)
    ck.figures["ddp_loss"] = losses
    ck.true(f"DDP parameters differ from gloo's by {max(diffs)} (> 1e-6)", max(diffs) <= 1e-6)
    ck.true(f"DDP (Python allreduce_hook) parameters differ from gloo's by {max(hook_diffs)}",
            max(hook_diffs) <= 1e-6)
    ck.true("DDP moved the parameters", any(not torch.equal(a, b) for a, b in zip(
        base.parameters(), models["torchcomms"].parameters())))
    # the parameters are the same on every rank (DDP synchronized them)
    flat = torch.cat([p.detach().flatten() for p in models["torchcomms"].parameters()])
    lst = [torch.empty_like(flat) for _ in range(n)]
    dist.all_gather(lst, flat, group=gloo)
    ck.true("DDP parameters identical on every rank", all(torch.equal(lst[0], t) for t in lst))
    # and the gradients went through our communicator (not only gloo)
    n_ar = names.count("gloo:all_reduce")
    ck.figures["ddp_allreduces_on_torchcomms"] = n_ar
    ck.true(f"DDP ran {n_ar} all_reduce on the TorchComm (expected >= {2 * STEPS})",
            n_ar >= 2 * STEPS)
    ck.true("DDP broadcast the initial state through the TorchComm",
            "gloo:broadcast" in names)


def ddp_vs_reference(ck):
    """DDP over the default group against one process training on every
    rank's batch (the mean loss over the concatenated batch)."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    r, n = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = MLP()
    ref = copy.deepcopy(model)
    ddp_model = DDP(model, bucket_cap_mb=0.002)
    opt = torch.optim.SGD(ddp_model.parameters(), lr=0.1)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    diffs = []
    for step in range(STEPS):
        x, y = batch(step, r)
        nn.functional.mse_loss(ddp_model(x), y).backward()
        opt.step()
        opt.zero_grad()
        xs, ys = zip(*(batch(step, k) for k in range(n)))
        nn.functional.mse_loss(ref(torch.cat(xs)), torch.cat(ys)).backward()
        ref_opt.step()
        ref_opt.zero_grad()
        diffs.append(max((a - b).abs().max().item()
                         for a, b in zip(model.parameters(), ref.parameters())))
    ck.figures["ddp_vs_reference_max_abs_diff"] = max(diffs)
    ck.true(f"DDP differs from the single-process reference by {max(diffs)} (> 1e-5)",
            max(diffs) <= 1e-5)


def fsdp(ck):
    from torch.distributed.fsdp import FSDPModule, fully_shard

    from torchcomms import new_comm
    from torchcomms.device_mesh import init_device_mesh

    r, n = dist.get_rank(), dist.get_world_size()
    comm = new_comm("cpu", torch.device("cpu"), name="fsdp", timeout=TIMEOUT)
    mesh = init_device_mesh(mesh_dim_comms=(comm,), mesh_dim_names=("dp",))
    ck.eq("mesh shape", tuple(mesh.mesh.shape), (n,))
    ck.true("mesh group is ours", type(mesh.get_group()).__name__ == "_BackendWrapper")
    lr = 0.1
    for mode, factor in (("avg", None), ("premul", 2.0 * n)):
        torch.manual_seed(0)
        model = MLP()
        ref = copy.deepcopy(model)
        for layer in model.layers:
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        if factor is not None:
            for m in model.modules():
                if isinstance(m, FSDPModule):
                    m.set_gradient_divide_factor(factor)
        # gradient = sum of the ranks' gradients / factor = (n / factor) x the mean
        scale = 1.0 if factor is None else n / factor
        opt = torch.optim.SGD(model.parameters(), lr=lr)
        ref_opt = torch.optim.SGD(ref.parameters(), lr=lr * scale)
        diffs, losses = [], []
        for step in range(STEPS):
            x, y = batch(step, r)
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
            mean_loss = loss.detach().clone()
            dist.all_reduce(mean_loss, op=dist.ReduceOp.AVG, group=mesh.get_group())
            xs, ys = zip(*(batch(step, k) for k in range(n)))
            ref_loss = nn.functional.mse_loss(ref(torch.cat(xs)), torch.cat(ys))
            ref_loss.backward()
            ref_opt.step()
            ref_opt.zero_grad()
            losses.append(mean_loss.item())
            diffs.append(abs(mean_loss.item() - ref_loss.item()))
        pdiff = max((p.full_tensor() - q).abs().max().item()
                    for p, q in zip(model.parameters(), ref.parameters()))
        ck.figures[f"fsdp_{mode}_loss"] = losses
        ck.figures[f"fsdp_{mode}_max_loss_diff"] = max(diffs)
        ck.figures[f"fsdp_{mode}_max_param_diff"] = pdiff
        ck.true(f"FSDP2 {mode}: loss differs from the reference by {max(diffs)} (> 1e-5)",
                max(diffs) <= 1e-5)
        ck.true(f"FSDP2 {mode}: parameters differ from the reference by {pdiff} (> 1e-5)",
                pdiff <= 1e-5)
        ck.true(f"FSDP2 {mode}: the loss went down", losses[-1] < losses[0])


def mesh2d(ck):
    import torch.distributed._functional_collectives as funcol
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    from torchcomms import new_comm
    from torchcomms.device_mesh import init_device_mesh

    r, n = dist.get_rank(), dist.get_world_size()
    rows, cols = 2, n // 2
    world = new_comm("cpu", torch.device("cpu"), name="mesh_world", timeout=TIMEOUT)
    i, j = divmod(world.get_rank(), cols)
    dp = world.split([k for k in range(n) if k % cols == j], "mesh_dp")  # a column
    tp = world.split([k for k in range(n) if k // cols == i], "mesh_tp")  # a row
    mesh = init_device_mesh(mesh_dim_comms=(dp, tp), mesh_dim_names=("dp", "tp"),
                            _global_comm=world)
    ck.eq("2-D mesh", mesh.mesh.tolist(), torch.arange(n).view(rows, cols).tolist())
    ck.eq("2-D mesh coordinate", list(mesh.get_coordinate()), [i, j])
    for dim, name in enumerate(("dp", "tp")):
        group = mesh.get_group(name)
        ranks = mesh.mesh.transpose(dim, -1).reshape(-1, mesh.mesh.size(dim))
        mine = [row for row in ranks.tolist() if r in row][0]
        ck.eq(f"2-D {name} group ranks", dist.get_process_group_ranks(group), mine)
        t = torch.full((6,), float(r + 1))
        dist.all_reduce(t, group=group)
        ck.eq(f"2-D all_reduce over {name}", t, torch.full((6,), float(sum(k + 1 for k in mine))))
        t = funcol.all_reduce(torch.full((2,), float(r)), "sum", (mesh, dim))
        ck.eq(f"2-D funcol all_reduce over {name}", torch.as_tensor(t).clone(),
              torch.full((2,), float(sum(mine))))
        ck.eq(f"2-D local rank on {name}", mesh.get_local_rank(name), mine.index(r))
    full = torch.arange(4 * rows * cols * 3, dtype=torch.float).view(4 * rows, cols * 3)
    dt = distribute_tensor(full, mesh, [Shard(0), Shard(1)])
    ck.eq("DTensor local shard", dt.to_local(),
          full.view(rows, 4, cols, 3)[i, :, j, :])
    ck.eq("DTensor full_tensor", dt.full_tensor(), full)
    ck.eq("DTensor redistribute", dt.redistribute(mesh, [Replicate(), Shard(0)]).to_local(),
          full.view(cols, 4 * rows // cols, cols * 3)[j])
    for c in (tp, dp, world):
        c.finalize()


def main_mode(ck):
    import torchcomms

    torchcomms.register_c10d_backend()
    dist.init_process_group(backend="torchcomms", timeout=TIMEOUT)
    ck.eq("default group type", type(dist.group.WORLD).__name__, "_BackendWrapper")
    ck.eq("get_backend", dist.get_backend(), "torchcomms")
    ck.run("collectives", collectives)
    ck.run("subgroups", subgroups)
    ck.run("ddp", ddp)
    ck.run("fsdp", fsdp)
    if dist.get_world_size() % 2 == 0:
        ck.run("mesh2d", mesh2d)
    dist.destroy_process_group()


def use_torchcomms_mode(ck):
    from torch.distributed import distributed_c10d as c10d

    ck.true("use_torchcomms is on", c10d._use_torchcomms_enabled())
    dist.init_process_group(backend="gloo", timeout=TIMEOUT)
    world = dist.group.WORLD
    ck.eq("default group type", type(world).__name__, "_BackendWrapper")
    comm = world._get_backend(torch.device("cpu")).get_comm()
    ck.eq("torch created the communicator", c10d._world.comms[:1], [comm])
    ck.eq("communicator backend (gloo -> cpu)", comm.get_backend(), "cpu")
    # torch attached a FlightRecorderHook(max_entries=16) (TORCH_FR_BUFFER_SIZE=16, set
    # by the test, also sizes the C library's ring of the communicator)
    t = torch.ones(3)
    dist.all_reduce(t)
    last = json.loads(comm._fr_dump_json())["entries"][-1]
    ck.eq("the flight recorder saw the all_reduce", last["profiling_name"], "gloo:all_reduce")
    ck.run("collectives", collectives)
    ck.eq("the flight recorder keeps its last 16 entries", comm._fr_size(), 16)
    ck.run("ddp_vs_reference", ddp_vs_reference)
    # TORCHCOMMS_CPU_INLINE_BYTES=0 here: no operation runs on the caller's
    # thread, so futures are asked for while in flight (the helper thread)
    ck.figures["futures_deferred"] = world._futures_deferred
    ck.true(f"futures completed by the helper thread: {world._futures_deferred} (expected > 0)",
            world._futures_deferred > 0)
    r, n = dist.get_rank(), dist.get_world_size()
    # new_group goes through split_group -> _BackendWrapper.split_group
    members = [k for k in range(n) if k != 1] if n > 2 else [0, 1]
    g = dist.new_group(members)
    if r in members:
        t = torch.full((2,), float(r))
        dist.all_reduce(t, group=g)
        ck.eq("split new_group all_reduce", t, torch.full((2,), float(sum(members))))
        ck.eq("split new_group rank", dist.get_rank(g), members.index(r))
    else:
        ck.eq("split new_group non-member", g, dist.GroupMember.NON_GROUP_MEMBER)
    if n % 2 == 0:
        from torch.distributed.device_mesh import init_device_mesh

        mesh = init_device_mesh("cpu", (2, n // 2), mesh_dim_names=("a", "b"))
        for dim, name in enumerate(("a", "b")):
            group = mesh.get_group(name)
            ck.eq(f"torch init_device_mesh group type {name}", type(group).__name__,
                  "_BackendWrapper")
            mine = dist.get_process_group_ranks(group)
            t = torch.full((3,), float(r + 1))
            dist.all_reduce(t, group=group)
            ck.eq(f"torch init_device_mesh all_reduce {name}", t,
                  torch.full((3,), float(sum(k + 1 for k in mine))))
    dist.destroy_process_group()
    ck.true("destroy_process_group finalized the communicators", c10d._world.comms == [])


def main():
    mode, outdir = sys.argv[1], sys.argv[2]
    rank = int(os.environ.get("RANK", "0"))
    ck = Checker()
    t0 = time.perf_counter()
    ck.run(mode, {"main": main_mode, "use_torchcomms": use_torchcomms_mode}[mode])
    ck.figures["elapsed_s"] = round(time.perf_counter() - t0, 3)
    with open(os.path.join(outdir, f"{mode}-rank{rank}.json"), "w") as f:
        json.dump({"rank": rank, "errors": ck.errors, "figures": ck.figures, "parts": ck.parts}, f)
    summary = {k: v for k, v in ck.figures.items() if "max" in k}
    print(f"rank {rank} {mode}: {len(ck.errors)} errors, parts {ck.parts}, {summary}", flush=True)
    return 1 if ck.errors else 0


if __name__ == "__main__":
    sys.exit(main())
