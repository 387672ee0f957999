#!/usr/bin/env python3
"""torchcomms.functional (issue 13, point 1) on every rank under torchrun:

    torchrun --standalone --nproc_per_node=N functional_worker.py OUTDIR

Parts (each checked exactly against a reference every rank computes from
every rank's known inputs):

- ops_registered: the operators and their schemas in torch.ops.torchcomms;
- functional_eager / inplace_eager / method_eager: every collective through
  F.<name> (new tensors, inputs untouched), F.<name>_ (writes, returns its
  outputs) and the TorchComm method itself;
- functional_compiled / inplace_compiled / method_compiled: the same three
  programs under torch.compile(fullgraph=True) (aot_eager backend: one graph,
  no break, our operators in it);
- async_wait: TorchCommsAsyncTensor (first use waits, .wait(), one wait for a
  list), in-place async, nothing left pending; async method calls under
  compile put torchcomm_wait_tensors in the graph;
- autograd_eager / autograd_compiled: every derivative torchcomms defines,
  gradient values exactly; MAX has none (clear error);
- errors: wrong comm type, PREMUL_SUM, a released communicator;
- tp_mlp_allreduce / tp_mlp_sequence_parallel: a tensor-parallel MLP
  (column- then row-parallel Linear; the second with all_gather +
  reduce_scatter) forward+backward under torch.compile(fullgraph=True) with
  the default inductor backend (FUNCTIONAL_TP_BACKEND overrides) against a
  single-process reference from the same seed: outputs and gradients to
  1e-6 (max |diff| recorded as figures, with the compile time).
"""

import os
import sys
import time
from datetime import timedelta

sys.path.insert(0, os.path.dirname(__file__))
from compat_lib import Worker  # noqa: E402

import torch  # noqa: E402

import torchcomms  # noqa: E402
import torchcomms.functional as F  # noqa: E402
from torchcomms import ReduceOp  # noqa: E402

w = Worker()
R, N = w.rank, w.size
_ONLY = set(filter(None, os.environ.get("FUNCTIONAL_PARTS", "").split(",")))
if _ONLY:                   # run only these parts (for measurements)
    _part = w.part
    w.part = lambda name: _part(name) if name in _ONLY else (lambda fn: fn)
DT = torch.float64
K = 6
comm = torchcomms.new_comm("cpu", "cpu", name="functional",
                           timeout=timedelta(seconds=float(os.environ.get("FUNC_TIMEOUT", 120))))


def X(r, n=K, plus=0):
    """Rank r's data: exact small integers in float64."""
    return torch.arange(n, dtype=DT) + 1000 * r + 1 + plus


def splits(r):
    """all_to_all_v_single: rows rank r sends to each peer j."""
    return [(r + j) % 2 + 1 for j in range(N)]


# ---------------------------------------------------------------------------
# one program over every collective, three ways to call them
# ---------------------------------------------------------------------------

def inputs():
    x = X(R)
    return {
        "all_reduce": x.clone(), "all_reduce_max": x.clone(), "all_reduce_avg": x.clone(),
        "reduce": x.clone(), "broadcast": x.clone(), "send": x.clone(),
        "all_gather": x.clone(), "all_gather_v": X(R, R + 1),
        "reduce_scatter": [X(R, K, 10 * j) for j in range(N)],
        "reduce_scatter_v": [X(R, j + 1) for j in range(N)],
        "reduce_scatter_single": torch.cat([X(R, K, 10 * j) for j in range(N)]),
        "all_to_all": [X(R, K, 10 * j) for j in range(N)],
        "all_to_all_single": torch.cat([X(R, K, 10 * j) for j in range(N)]),
        "all_to_all_v_single": torch.cat([X(R, s, 10 * j) for j, s in enumerate(splits(R))]),
        "scatter": [X(0, K, 10 * j) for j in range(N)] if R == 0 else [],
        "gather": x.clone(),
    }


def expected():
    s = sum(X(q) for q in range(N))
    e = {
        "all_reduce": s, "all_reduce_max": X(N - 1), "all_reduce_avg": s / N,
        "broadcast": X(N - 1), "recv": X((R - 1) % N),
        "all_gather": [X(q) for q in range(N)],
        "all_gather_v": [X(q, q + 1) for q in range(N)],
        "all_gather_single": torch.cat([X(q) for q in range(N)]),
        "reduce_scatter": sum(X(q, K, 10 * R) for q in range(N)),
        "reduce_scatter_v": sum(X(q, R + 1) for q in range(N)),
        "reduce_scatter_single": sum(X(q, K, 10 * R) for q in range(N)),
        "all_to_all": [X(q, K, 10 * R) for q in range(N)],
        "all_to_all_single": torch.cat([X(q, K, 10 * R) for q in range(N)]),
        "all_to_all_v_single": torch.cat([X(q, splits(q)[R], 10 * R) for q in range(N)]),
        "scatter": X(0, K, 10 * R),
    }
    if R == 0:
        e["reduce"] = s
        e["gather"] = [X(q) for q in range(N)]
        e["gather_single"] = torch.cat([X(q) for q in range(N)])
    return e


def program(mode, a):
    """Runs every collective on the inputs `a` in one fixed order; returns
    the results. mode: "functional" (F.name), "inplace" (F.name_) or
    "method" (TorchComm methods into buffers)."""
    out = {}
    ins_v = [(q + 1,) for q in range(N)]

    def call(name, *args, result=None):
        if mode == "functional":
            return getattr(F, name)(comm, *args)
        if mode == "inplace":     # send and barrier write nothing: no in-place form
            return getattr(F, name + ("_" if hasattr(F, name + "_") else ""))(comm, *args)
        getattr(comm, name)(*args)
        return result

    if mode == "functional":
        bufs = {k: v for k, v in a.items()}        # read only
    else:
        bufs = {k: ([t.clone() for t in v] if isinstance(v, list) else v.clone())
                for k, v in a.items()}
    out["all_reduce"] = call("all_reduce", bufs["all_reduce"], ReduceOp.SUM,
                             result=bufs["all_reduce"])
    out["all_reduce_max"] = call("all_reduce", bufs["all_reduce_max"], ReduceOp.MAX,
                                 result=bufs["all_reduce_max"])
    out["all_reduce_avg"] = call("all_reduce", bufs["all_reduce_avg"], ReduceOp.AVG,
                                 result=bufs["all_reduce_avg"])
    out["reduce"] = call("reduce", bufs["reduce"], 0, ReduceOp.SUM, result=bufs["reduce"])
    out["broadcast"] = call("broadcast", bufs["broadcast"], N - 1, result=bufs["broadcast"])
    rbuf = torch.zeros(K, dtype=DT)
    if R % 2 == 0:
        call("send", bufs["send"], (R + 1) % N)
        out["recv"] = call("recv", rbuf, (R - 1) % N, result=rbuf)
    else:
        out["recv"] = call("recv", rbuf, (R - 1) % N, result=rbuf)
        call("send", bufs["send"], (R + 1) % N)
    lst = [torch.zeros(K, dtype=DT) for _ in range(N)]
    out["all_gather"] = call("all_gather", lst, bufs["all_gather"], result=lst)
    lst_v = [torch.zeros(s, dtype=DT) for s in ins_v]
    out["all_gather_v"] = call("all_gather_v", lst_v, bufs["all_gather_v"], result=lst_v)
    o = torch.zeros(N * K, dtype=DT)
    out["all_gather_single"] = call("all_gather_single", o, bufs["all_gather"], result=o)
    o = torch.zeros(K, dtype=DT)
    out["reduce_scatter"] = call("reduce_scatter", o, bufs["reduce_scatter"], ReduceOp.SUM,
                                 result=o)
    o = torch.zeros(R + 1, dtype=DT)
    out["reduce_scatter_v"] = call("reduce_scatter_v", o, bufs["reduce_scatter_v"],
                                   ReduceOp.SUM, result=o)
    o = torch.zeros(K, dtype=DT)
    out["reduce_scatter_single"] = call("reduce_scatter_single", o,
                                        bufs["reduce_scatter_single"], ReduceOp.SUM, result=o)
    lst = [torch.zeros(K, dtype=DT) for _ in range(N)]
    out["all_to_all"] = call("all_to_all", lst, bufs["all_to_all"], result=lst)
    o = torch.zeros(N * K, dtype=DT)
    out["all_to_all_single"] = call("all_to_all_single", o, bufs["all_to_all_single"],
                                    result=o)
    outs = [splits(q)[R] for q in range(N)]
    o = torch.zeros(sum(outs), dtype=DT)
    out["all_to_all_v_single"] = call("all_to_all_v_single", o, bufs["all_to_all_v_single"],
                                      outs, splits(R), result=o)
    o = torch.zeros(K, dtype=DT)
    out["scatter"] = call("scatter", o, bufs["scatter"], 0, result=o)
    lst = [torch.zeros(K, dtype=DT) for _ in range(N)] if R == 0 else []
    out["gather"] = call("gather", lst, bufs["gather"], 0, result=lst)
    o = torch.zeros(N * K, dtype=DT)
    out["gather_single"] = call("gather_single", o, bufs["gather"], 0, result=o)
    call("barrier")
    return out


def check_results(c, what, got, a_before=None, a_after=None):
    exp = expected()
    for k, e in exp.items():
        g = got[k]
        if isinstance(e, list):
            c.eq(f"{what} {k} length", len(g), len(e))
            for i, (gi, ei) in enumerate(zip(g, e)):
                c.eq(f"{what} {k}[{i}]", gi, ei)
        else:
            c.eq(f"{what} {k}", g, e)
    if a_before is not None:  # the functional form wrote none of its arguments
        for k, v in a_before.items():
            vs = v if isinstance(v, list) else [v]
            ws = a_after[k] if isinstance(a_after[k], list) else [a_after[k]]
            for i, (p, q) in enumerate(zip(vs, ws)):
                c.eq(f"{what} input {k}[{i}] untouched", q, p)


class Capture:
    """A torch.compile backend that counts graphs and records the call
    targets of every graph (dynamo's, and with inductor the AOT forward and
    backward graphs), then hands the graph to `inner`."""

    def __init__(self, inner="aot_eager"):
        self.inner = inner
        self.graphs = 0
        self.targets = []           # one set of targets per dynamo graph
        self.aot_targets = []       # one set per AOT graph (inductor only)

    @staticmethod
    def _targets(gm):
        out = set()
        for n in gm.graph.nodes:
            if n.op == "call_function":
                out.add(str(n.target))
                for a in n.args:     # with_effects(token, op, ...)
                    if isinstance(a, torch._ops.OpOverload):
                        out.add(str(a))
        return out

    def __call__(self, gm, example_inputs):
        self.graphs += 1
        self.targets.append(self._targets(gm))
        if self.inner == "inductor":
            from torch._inductor.compile_fx import compile_fx, compile_fx_inner

            def inner_compile(g, ex, **kw):
                self.aot_targets.append(self._targets(g))
                return compile_fx_inner(g, ex, **kw)
            return compile_fx(gm, example_inputs, inner_compile=inner_compile)
        from torch._dynamo.backends.registry import lookup_backend
        return lookup_backend(self.inner)(gm, example_inputs)

    def ops(self):
        """Our operators in the dynamo graphs, as "torchcomms.<name>"."""
        return {".".join(t.split(".")[:2]) for ts in self.targets for t in ts
                if t.startswith("torchcomms.")}


def compiled(fn, backend="aot_eager"):
    torch._dynamo.reset()
    cap = Capture(backend)
    return torch.compile(fn, fullgraph=True, backend=cap), cap


def no_breaks(c, what, fn, *args):
    """torch._dynamo.explain: one graph, no graph break."""
    torch._dynamo.reset()
    ex = torch._dynamo.explain(fn)(*args)
    c.eq(f"{what}: graph breaks", ex.graph_break_count, 0)
    c.eq(f"{what}: graphs", ex.graph_count, 1)
    torch._dynamo.reset()


# ---------------------------------------------------------------------------

@w.part("ops_registered")
def _(c):
    ops = torch.ops.torchcomms
    for name, coll in F.COLLECTIVES.items():
        c.true(f"torchcomm_{name} defined", hasattr(ops, f"torchcomm_{name}"))
        c.eq(f"torchcomm_{name}_ defined", hasattr(ops, f"torchcomm_{name}_"),
             coll.has_inplace)
    c.eq("all_reduce schema", str(ops.torchcomm_all_reduce.default._schema),
         "torchcomms::torchcomm_all_reduce(int comm, Tensor tensor, str op, "
         "bool async_op=False, Dict(str, str)? hints=None, float? timeout=None) -> Tensor")
    c.eq("all_reduce_ schema", str(ops.torchcomm_all_reduce_.default._schema),
         "torchcomms::torchcomm_all_reduce_(int comm, Tensor(a!) tensor, str op, "
         "bool async_op=False, Dict(str, str)? hints=None, float? timeout=None) -> Tensor(a!)")
    c.eq("all_gather_ schema", str(ops.torchcomm_all_gather_.default._schema),
         "torchcomms::torchcomm_all_gather_(int comm, Tensor(a!)[] tensor_list, Tensor tensor, "
         "bool async_op=False, Dict(str, str)? hints=None, float? timeout=None) -> Tensor(a!)[]")
    c.eq("wait schema", str(ops.torchcomm_wait_tensors.default._schema),
         "torchcomms::torchcomm_wait_tensors(Tensor[] inputs) -> Tensor[]")
    c.eq("barrier schema", str(ops.torchcomm_barrier.default._schema),
         "torchcomms::torchcomm_barrier(int comm, bool async_op=False, "
         "Dict(str, str)? hints=None, float? timeout=None) -> ()")
    c.true("pt2_compliant", torch.Tag.pt2_compliant_tag in ops.torchcomm_all_reduce.default.tags)
    from torch._higher_order_ops.effects import _get_effect
    c.true("all_reduce is ORDERED-effectful",
           _get_effect(ops.torchcomm_all_reduce.default) is not None)
    c.eq("public functions", sorted(n for n in F.__all__ if n.rstrip("_") in F.COLLECTIVES),
         sorted(list(F.COLLECTIVES) + [n + "_" for n, cl in F.COLLECTIVES.items()
                                       if cl.has_inplace]))
    c.eq("comm key stable", F.comm_key(comm), F.comm_key(comm))


for _mode in ("functional", "inplace", "method"):
    @w.part(f"{_mode}_eager")
    def _(c, mode=_mode):
        a = inputs()
        before = {k: ([t.clone() for t in v] if isinstance(v, list) else v.clone())
                  for k, v in a.items()}
        got = program(mode, a)
        check_results(c, mode, got, before if mode == "functional" else None, a)
        if mode == "inplace":
            x = X(R)
            c.true("inplace returns its argument", F.all_reduce_(comm, x) is x)
            c.eq("inplace wrote it", x, sum(X(q) for q in range(N)))


for _mode in ("functional", "inplace", "method"):
    @w.part(f"{_mode}_compiled")
    def _(c, mode=_mode):
        a = inputs()
        before = {k: ([t.clone() for t in v] if isinstance(v, list) else v.clone())
                  for k, v in a.items()}
        fn, cap = compiled(lambda a: program(mode, a))
        got = fn(a)
        check_results(c, f"{mode} compiled", got, before if mode == "functional" else None, a)
        c.eq(f"{mode}: one graph", cap.graphs, 1)
        names = {t.split(".")[1] for t in cap.ops()}
        want = {f"torchcomm_{n}" for n in F.COLLECTIVES}
        c.eq(f"{mode}: our operators in the graph", names, want)
        got2 = fn(inputs())                       # the compiled graph, again
        check_results(c, f"{mode} compiled (2nd call)", got2)
        c.eq(f"{mode}: no recompile", cap.graphs, 1)


@w.part("async_wait")
def _(c):
    from torchcomms.functional.async_tensor import _pending_count

    s = sum(X(q) for q in range(N))
    y = F.all_reduce(comm, X(R), async_op=True)
    c.eq("eager async type", type(y).__name__, "TorchCommsAsyncTensor")
    c.true("not yet waited", not y.completed)
    z = y + 0                                   # first use waits
    c.true("waited on first use", y.completed)
    c.eq("value after first use", z, s)
    c.eq("plain tensor from wait()", type(y.wait()), torch.Tensor)
    c.eq("wait() value", y.wait(), s)
    lst = F.all_gather(comm, [torch.empty(K, dtype=DT) for _ in range(N)], X(R), async_op=True)
    c.eq("list result", [type(t).__name__ for t in lst], ["TorchCommsAsyncTensor"] * N)
    c.true("one work shared", len({id(t.work) for t in lst}) == 1)
    for q, t in enumerate(lst):
        c.eq(f"all_gather async [{q}]", t.wait(), X(q))
    x = X(R)
    r = F.all_reduce_(comm, x, ReduceOp.SUM, async_op=True)
    c.true("in-place async wraps the argument", r.elem is x)
    c.eq("in-place async after wait", r.wait(), s)
    c.eq("argument written", x, s)
    x = X(R)
    y = F.all_reduce(comm, x, async_op=True)
    ws = F.wait_tensors([y])
    c.eq("wait_tensors value", ws[0], s)
    c.eq("nothing pending", _pending_count(), 0)
    # the raw operators: async work is taken by torchcomm_wait_tensors
    key = F.comm_key(comm)
    o = torch.ops.torchcomms.torchcomm_all_reduce(key, X(R), "SUM", True)
    c.eq("one pending", _pending_count(), 1)
    (o2,) = torch.ops.torchcomms.torchcomm_wait_tensors([o])
    c.eq("raw op waited", o2, s)
    c.eq("nothing pending after raw wait", _pending_count(), 0)

    def meth(t):
        work = comm.all_reduce(t, ReduceOp.SUM, async_op=True)
        work.wait()
        work2 = comm.all_gather_single(torch.empty(N * K, dtype=DT), t, async_op=True)
        work2.wait()
        return t * 2

    fn, cap = compiled(meth)
    c.eq("compiled async method", fn(X(R)), 2 * s)
    c.true("wait in graph", "torchcomms.torchcomm_wait_tensors" in cap.ops())
    t = X(R)
    fn(t)
    c.eq("compiled async method wrote its argument", t, s)

    def func(t):
        return F.all_reduce(comm, t, async_op=True) * 2

    fn, cap = compiled(func)
    c.eq("compiled async functional", fn(X(R)), 2 * s)
    c.true("wait in functional graph", "torchcomms.torchcomm_wait_tensors" in cap.ops())
    c.eq("nothing pending at the end", _pending_count(), 0)


def grad_program(xs):
    """One loss per derivative; returns their sum (inputs: fresh leaves)."""
    n = N
    loss = (F.all_reduce(comm, xs["ar"] * 1, ReduceOp.SUM) * (R + 1)).sum()
    loss = loss + (F.all_reduce(comm, xs["avg"] * 1, ReduceOp.AVG) * (R + 1)).sum()
    y = F.all_gather_single(comm, torch.empty(n * K, dtype=DT), xs["ags"] * 1)
    loss = loss + (y * (torch.arange(n * K, dtype=DT) + R)).sum()
    y = F.reduce_scatter_single(comm, torch.empty(K, dtype=DT), xs["rss"] * 1, ReduceOp.SUM)
    loss = loss + (y * (torch.arange(K, dtype=DT) + R)).sum()
    y = F.all_to_all_single(comm, torch.empty(n * K, dtype=DT), xs["a2a"] * 1)
    loss = loss + (y * (torch.arange(n * K, dtype=DT) + 7 * R)).sum()
    outs = [splits(q)[R] for q in range(n)]
    y = F.all_to_all_v_single(comm, torch.empty(sum(outs), dtype=DT), xs["a2av"] * 1,
                              outs, splits(R))
    loss = loss + (y * (torch.arange(sum(outs), dtype=DT) + 3 * R)).sum()
    ys = F.all_gather(comm, [torch.empty(K, dtype=DT) for _ in range(n)], xs["ag"] * 1)
    for q, t in enumerate(ys):
        loss = loss + (t * (q + 1 + R)).sum()
    y = F.reduce_scatter(comm, torch.empty(K, dtype=DT), list((xs["rs"] * 1).chunk(n)),
                         ReduceOp.SUM)
    loss = loss + (y * (torch.arange(K, dtype=DT) + 5 * R)).sum()
    (y,) = F.wait_tensors([xs["wait"] * 3])
    loss = loss + y.sum()
    return loss


def grad_inputs():
    sizes = {"ar": K, "avg": K, "ags": K, "rss": N * K, "a2a": N * K,
             "a2av": sum(splits(R)), "ag": K, "rs": N * K, "wait": K}
    return {k: torch.full((s,), float(R + 1), dtype=DT, requires_grad=True)
            for k, s in sizes.items()}


def expected_grads():
    n = N
    ar = torch.full((K,), float(sum(q + 1 for q in range(n))), dtype=DT)
    e = {"ar": ar, "avg": ar / n}
    e["ags"] = sum((torch.arange(n * K, dtype=DT) + q)[R * K:(R + 1) * K] for q in range(n))
    e["rss"] = torch.cat([torch.arange(K, dtype=DT) + j for j in range(n)])
    e["a2a"] = torch.cat([(torch.arange(n * K, dtype=DT) + 7 * j)[R * K:(R + 1) * K]
                          for j in range(n)])
    # rank j received my chunk for j at offset sum(splits(q)[j] for q < R)
    parts = []
    for j in range(n):
        off = sum(splits(q)[j] for q in range(R))
        parts.append((torch.arange(sum(splits(q)[j] for q in range(n)), dtype=DT)
                      + 3 * j)[off:off + splits(R)[j]])
    e["a2av"] = torch.cat(parts)
    e["ag"] = torch.full((K,), float(sum(R + 1 + q for q in range(n))), dtype=DT)
    e["rs"] = torch.cat([torch.arange(K, dtype=DT) + 5 * j for j in range(n)])
    e["wait"] = torch.full((K,), 3.0, dtype=DT)
    return e


def check_grads(c, what, xs):
    for k, e in expected_grads().items():
        c.eq(f"{what} grad {k}", xs[k].grad, e)


@w.part("autograd_eager")
def _(c):
    xs = grad_inputs()
    grad_program(xs).backward()
    check_grads(c, "eager", xs)
    # async result: autograd through TorchCommsAsyncTensor
    x = torch.ones(K, dtype=DT, requires_grad=True)
    y = F.all_reduce(comm, x * 2, ReduceOp.SUM, async_op=True)
    (y * (R + 1)).sum().backward()
    c.eq("async grad", x.grad, torch.full((K,), 2.0 * sum(q + 1 for q in range(N)), dtype=DT))
    # in place with autograd (functional operator + copy_)
    x = torch.ones(K, dtype=DT, requires_grad=True)
    b = x * 1
    F.all_reduce_(comm, b, ReduceOp.SUM)
    (b * (R + 1)).sum().backward()
    c.eq("in-place grad", x.grad, torch.full((K,), float(sum(q + 1 for q in range(N))),
                                             dtype=DT))
    x = torch.ones(K, dtype=DT, requires_grad=True)
    y = F.all_reduce(comm, x * 1, ReduceOp.MAX)
    with c.raises(RuntimeError, r"all_reduce has a derivative for SUM and AVG only, not MAX"):
        y.sum().backward()


@w.part("autograd_compiled")
def _(c):
    fn, cap = compiled(grad_program)
    xs = grad_inputs()
    fn(xs).backward()
    check_grads(c, "compiled", xs)
    c.eq("one graph", cap.graphs, 1)

    def meth(a):                    # torchcomms' own compiled-autograd usage
        b = a * 1.0
        comm.all_reduce(b, ReduceOp.SUM, async_op=False)
        return (b * (R + 1)).sum()

    fn, cap = compiled(meth)
    x = torch.ones(K, dtype=DT, requires_grad=True)
    fn(x).backward()
    c.eq("method in-place grad", x.grad, torch.full((K,), float(sum(q + 1 for q in range(N))),
                                                    dtype=DT))


@w.part("errors")
def _(c):
    with c.raises(TypeError, r"torchcomms.functional: comm must be a torchcomms.TorchComm, "
                             r"not str"):
        F.all_reduce("functional", X(R))
    with c.raises(ValueError, r"PREMUL_SUM is not supported by the functional collectives"):
        F.all_reduce(comm, X(R), ReduceOp.PREMUL_SUM(0.5))
    with c.raises(TypeError, r"all_reduce\(\) missing required argument 'tensor'"):
        F.all_reduce(comm)
    with c.raises(RuntimeError, r"no communicator has key 987654"):
        torch.ops.torchcomms.torchcomm_all_reduce(987654, X(R), "SUM")


# ---------------------------------------------------------------------------
# the tensor-parallel MLP against a single-process reference
# ---------------------------------------------------------------------------

B, D, H = 8, 8, 16
TP_BACKEND = os.environ.get("FUNCTIONAL_TP_BACKEND", "inductor")


def params():
    g = torch.Generator().manual_seed(1234)
    p = {"x": torch.randn(B, D, generator=g, dtype=DT),
         "w1": torch.randn(H, D, generator=g, dtype=DT) / 3,
         "b1": torch.randn(H, generator=g, dtype=DT),
         "w2": torch.randn(D, H, generator=g, dtype=DT) / 4,
         "b2": torch.randn(D, generator=g, dtype=DT)}
    return p


def mlp(x, w1, b1, w2, b2):
    return torch.nn.functional.gelu(x @ w1.t() + b1) @ w2.t() + b2


def loss_of(y):
    return (y * y).sum() + y.sin().sum()


def reference():
    p = {k: v.clone().requires_grad_(True) for k, v in params().items()}
    y = mlp(**p)
    loss = loss_of(y)
    loss.backward()
    return y.detach(), loss.detach(), {k: v.grad for k, v in p.items()}


def shard(p, rows_x):
    h = H // N
    hs = slice(R * h, (R + 1) * h)
    bs = slice(R * (B // N), (R + 1) * (B // N))
    s = {"x": p["x"][bs] if rows_x else p["x"], "w1": p["w1"][hs], "b1": p["b1"][hs],
         "w2": p["w2"][:, hs], "b2": p["b2"]}
    return {k: v.clone().contiguous().requires_grad_(True) for k, v in s.items()}, hs, bs


def tp_allreduce(x, w1, b1, w2, b2):
    """Megatron: column-parallel Linear, row-parallel Linear, all_reduce
    (the TorchComm method, traced in place). Each rank's loss is 1/N of the
    objective: the all_reduce derivative sums the ranks' gradients."""
    h = torch.nn.functional.gelu(x @ w1.t() + b1)
    p = h @ w2.t()
    comm.all_reduce(p, ReduceOp.SUM)
    y = p + b2
    return y, loss_of(y) / comm.get_size()


def tp_sequence_parallel(x, w1, b1, w2, b2):
    """Sequence parallel: all_gather the row shards of x, column- then
    row-parallel Linear, reduce_scatter back to row shards (F functions)."""
    n = comm.get_size()
    xf = F.all_gather_single(comm, x.new_empty(x.shape[0] * n, x.shape[1]), x)
    h = torch.nn.functional.gelu(xf @ w1.t() + b1)
    p = h @ w2.t()
    y = F.reduce_scatter_single(comm, p.new_empty(p.shape[0] // n, p.shape[1]), p,
                                ReduceOp.SUM) + b2
    return y, loss_of(y)


def run_tp(c, name, fn, rows_x):
    y_ref, loss_ref, g_ref = reference()
    p, hs, bs = shard(params(), rows_x)
    torch._dynamo.reset()
    cap = Capture(TP_BACKEND)
    cfn = torch.compile(fn, fullgraph=True, backend=cap)
    t0 = time.monotonic()
    y, loss = cfn(**p)
    loss.backward()
    secs = time.monotonic() - t0
    total = loss.detach().clone()
    comm.all_reduce(total, ReduceOp.SUM)
    diffs = {}
    diffs["y"] = c.close(f"{name} output", y.detach(), y_ref[bs] if rows_x else y_ref, 1e-6)
    diffs["loss"] = c.close(f"{name} loss", total, loss_ref, 1e-6)
    diffs["w1"] = c.close(f"{name} grad w1", p["w1"].grad, g_ref["w1"][hs], 1e-6)
    diffs["b1"] = c.close(f"{name} grad b1", p["b1"].grad, g_ref["b1"][hs], 1e-6)
    diffs["w2"] = c.close(f"{name} grad w2", p["w2"].grad, g_ref["w2"][:, hs], 1e-6)
    for k in ("b2",) + (() if rows_x else ("x",)):
        g = p[k].grad.clone()             # replicated: the ranks' parts sum up
        comm.all_reduce(g, ReduceOp.SUM)
        diffs[k] = c.close(f"{name} grad {k} (sum over ranks)", g, g_ref[k], 1e-6)
    if rows_x:
        diffs["x"] = c.close(f"{name} grad x (row shard)", p["x"].grad, g_ref["x"][bs], 1e-6)
    c.eq(f"{name}: one dynamo graph", cap.graphs, 1)
    c.true(f"{name}: our operators in the graph ({sorted(cap.ops())})", bool(cap.ops()))
    if TP_BACKEND == "inductor":
        fwd_bwd = [{t for t in ts if "torchcomms" in t} for ts in cap.aot_targets]
        c.eq(f"{name}: inductor compiled forward and backward", len(cap.aot_targets), 2)
        c.true(f"{name}: our operators in the backward graph ({fwd_bwd})",
               len(fwd_bwd) == 2 and bool(fwd_bwd[1]))
    # a second step runs the compiled code again: same values
    p2, _, _ = shard(params(), rows_x)
    y2, loss2 = cfn(**p2)
    loss2.backward()
    c.eq(f"{name}: second call output", y2.detach(), y.detach())
    c.eq(f"{name}: second call grad w1", p2["w1"].grad, p["w1"].grad)
    c.eq(f"{name}: no recompile", cap.graphs, 1)
    no_breaks(c, name, fn, *[v.detach() for v in shard(params(), rows_x)[0].values()])
    w.figures[f"{name}_max_abs_diff"] = max(diffs.values())
    w.figures[f"{name}_diffs"] = diffs
    w.figures[f"{name}_compile_and_first_step_s"] = round(secs, 2)
    w.figures[f"{name}_backend"] = TP_BACKEND


@w.part("tp_mlp_allreduce")
def _(c):
    run_tp(c, "tp_mlp_allreduce", tp_allreduce, rows_x=False)


@w.part("tp_mlp_sequence_parallel")
def _(c):
    run_tp(c, "tp_mlp_sequence_parallel", tp_sequence_parallel, rows_x=True)


torch._dynamo.reset()
rc = w.finish()
try:
    comm.finalize()
except RuntimeError as e:  # an earlier part failed; its error is recorded
    print(f"rank {R}: finalize: {e}", file=sys.stderr)
    rc = 1
sys.exit(rc)
