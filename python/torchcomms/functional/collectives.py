"""The collectives of a TorchComm as torch custom operators (``torch.ops.torchcomms``).

For every collective method ``M`` of :class:`torchcomms.TorchComm` that writes
tensors there are two operators, named as in meta-pytorch/torchcomms:

* ``torchcomm_M_`` (in place): the method's own semantics; writes its output
  argument(s) and returns them (``Tensor(a!)`` / ``Tensor(a!)[]``).
* ``torchcomm_M`` (functional): leaves every argument alone and returns new
  tensors; an output argument only gives the shape and dtype of the result.

Collectives that write nothing (``send``, ``barrier``) have the functional
form only. The first argument of every operator is the communicator's key
(``int comm``, see :func:`comm_key`); then the method's arguments in the
method's order, with the reduction as its name (``str op``: "SUM", "AVG",
...), and ``bool async_op=False, Dict(str, str)? hints=None,
float? timeout=None`` (seconds). The eager kernels call the real TorchComm
method of that communicator; with ``async_op`` they return at once and the
work is waited on by ``torchcomm_wait_tensors`` (or by the
TorchCommsAsyncTensor the Python functions return).

Every operator has a fake (meta) implementation, is ORDERED-effectful (never
dropped or reordered by torch.compile), and the ones torchcomms gives a
derivative have an autograd formula: all_reduce (SUM/AVG), all_gather,
all_gather_single, reduce_scatter, reduce_scatter_single (SUM/AVG),
all_to_all_single, all_to_all_v_single, and torchcomm_wait_tensors (identity).
"""

import itertools
import threading
import weakref
from dataclasses import dataclass

import torch

from torchcomms._comms import ReduceOp, RedOpType, TorchComm
from torchcomms.functional.async_tensor import _put_work, _take_work

NS = "torchcomms"
_TAIL_SCHEMA = "bool async_op=False, Dict(str, str)? hints=None, float? timeout=None"

# ---------------------------------------------------------------------------
# communicators and reductions as operator arguments
# ---------------------------------------------------------------------------

_COMMS = {}                              # key -> weakref to the TorchComm
_KEYS = weakref.WeakKeyDictionary()      # TorchComm -> key
_KEY_LOCK = threading.Lock()
_NEXT_KEY = itertools.count()


@torch._dynamo.assume_constant_result
def comm_key(comm):
    """The key (an int) that stands for `comm` in the operators' arguments.

    Keys are handed out in order of first use (0, 1, ...) and stay valid as
    long as the communicator lives; the table holds it weakly. While
    torch.compile traces, the key is read from the real communicator and
    becomes a constant of the graph (dynamo guards on the communicator).
    """
    if not isinstance(comm, TorchComm):
        raise TypeError("torchcomms.functional: comm must be a torchcomms.TorchComm, "
                        f"not {type(comm).__name__}")
    with _KEY_LOCK:
        key = _KEYS.get(comm)
        if key is None:
            key = next(_NEXT_KEY)
            _KEYS[comm] = key
            _COMMS[key] = weakref.ref(comm)
        return key


def comm_from_key(key):
    """The TorchComm behind an operator's `comm` argument."""
    ref = _COMMS.get(key)
    comm = ref() if ref is not None else None
    if comm is None:
        raise RuntimeError(
            f"torchcomms.functional: no communicator has key {key} in this process "
            "(it was released, or the graph was compiled in another process); "
            "keep the TorchComm alive while compiled code that uses it runs")
    return comm


_OP_NAMES = {t.name for t in RedOpType}


@torch._dynamo.assume_constant_result
def reduce_op_name(op):
    """The name of a reduction as the operators take it ("SUM", "AVG", ...).

    `op` may be a ReduceOp, a RedOpType or a name; PREMUL_SUM (which carries
    a factor) is refused: scale the tensor first and reduce with SUM.
    """
    if isinstance(op, ReduceOp):
        name = op.type.name
    elif isinstance(op, RedOpType):
        name = op.name
    elif isinstance(op, str):
        name = op.upper()
    else:
        raise TypeError("torchcomms.functional: op must be a ReduceOp, RedOpType or str, "
                        f"not {type(op).__name__}")
    if name not in _OP_NAMES:
        raise ValueError(f"torchcomms.functional: unknown reduction {op!r}")
    if name == "PREMUL_SUM":
        raise ValueError("torchcomms.functional: PREMUL_SUM is not supported by the "
                         "functional collectives (its factor is not an operator argument); "
                         "multiply the tensor by the factor and reduce with SUM")
    return name


@torch._dynamo.assume_constant_result
def timeout_seconds(timeout):
    """A timeout (timedelta, seconds or None) as float seconds or None."""
    if timeout is None:
        return None
    if hasattr(timeout, "total_seconds"):
        return float(timeout.total_seconds())
    return float(timeout)


# ---------------------------------------------------------------------------
# the operator table
# ---------------------------------------------------------------------------

# argument kinds: "inout" tensor read and written, "out" tensor written,
# "outlist" tensors written, "in" tensor read, "inlist" tensors read,
# "int", "ints", "op" (a reduction)
_TENSORISH = {"inout": "Tensor", "out": "Tensor", "in": "Tensor",
              "outlist": "Tensor[]", "inlist": "Tensor[]"}
_SCALAR = {"int": "int", "ints": "int[]", "op": "str"}


@dataclass(frozen=True)
class Collective:
    method: str                # the TorchComm method
    params: tuple              # ((name, kind), ...) in the method's order

    @property
    def name(self):
        return "torchcomm_" + self.method

    @property
    def outputs(self):
        """Indices (into params) of the arguments the method writes."""
        return [i for i, (_, k) in enumerate(self.params) if k in ("inout", "out", "outlist")]

    @property
    def has_inplace(self):
        return bool(self.outputs)

    def schema(self, inplace):
        args, rets = ["int comm"], []
        alias = iter("abcdefgh")
        for name, kind in self.params:
            if kind in _TENSORISH:
                t = _TENSORISH[kind]
                if inplace and kind in ("inout", "out", "outlist"):
                    a = next(alias)
                    t = t.replace("Tensor", f"Tensor({a}!)")
                    rets.append(t)
                elif kind in ("inout", "out", "outlist"):
                    rets.append(_TENSORISH[kind])
                args.append(f"{t} {name}")
            else:
                args.append(f"{_SCALAR[kind]} {name}")
        args.append(_TAIL_SCHEMA)
        ret = "()" if not rets else rets[0] if len(rets) == 1 else f"({', '.join(rets)})"
        return f"{self.name}{'_' if inplace else ''}({', '.join(args)}) -> {ret}"


def _c(method, *params):
    return Collective(method, tuple(params))


COLLECTIVES = {c.method: c for c in [
    _c("all_reduce", ("tensor", "inout"), ("op", "op")),
    _c("reduce", ("tensor", "inout"), ("root", "int"), ("op", "op")),
    _c("broadcast", ("tensor", "inout"), ("root", "int")),
    _c("barrier"),
    _c("send", ("tensor", "in"), ("dst", "int")),
    _c("recv", ("tensor", "out"), ("src", "int")),
    _c("all_gather", ("tensor_list", "outlist"), ("tensor", "in")),
    _c("all_gather_v", ("tensor_list", "outlist"), ("tensor", "in")),
    _c("all_gather_single", ("output", "out"), ("input", "in")),
    _c("reduce_scatter", ("output", "out"), ("input_list", "inlist"), ("op", "op")),
    _c("reduce_scatter_v", ("output", "out"), ("input_list", "inlist"), ("op", "op")),
    _c("reduce_scatter_single", ("output", "out"), ("input", "in"), ("op", "op")),
    _c("all_to_all", ("output_tensor_list", "outlist"), ("input_tensor_list", "inlist")),
    _c("all_to_all_single", ("output", "out"), ("input", "in")),
    _c("all_to_all_v_single", ("output", "out"), ("input", "in"),
       ("output_split_sizes", "ints"), ("input_split_sizes", "ints")),
    _c("scatter", ("output_tensor", "out"), ("input_tensor_list", "inlist"), ("root", "int")),
    _c("gather", ("output_tensor_list", "outlist"), ("input_tensor", "in"), ("root", "int")),
    _c("gather_single", ("output", "out"), ("input", "in"), ("root", "int")),
]}


def _method_args(coll, vals):
    """The operator's arguments converted back to the method's."""
    out = []
    for (_, kind), v in zip(coll.params, vals):
        if kind == "op":
            v = getattr(ReduceOp, v)
        elif kind in ("inlist", "outlist", "ints"):
            v = list(v)
        out.append(v)
    return out


def _results(coll, vals):
    outs = [vals[i] for i in coll.outputs]
    if not outs:
        return None
    return outs[0] if len(outs) == 1 else tuple(outs)


def _first_tensor(res):
    if isinstance(res, torch.Tensor):
        return res
    for r in res if isinstance(res, (list, tuple)) else ():
        t = _first_tensor(r)
        if t is not None:
            return t
    return None


def _run(coll, key, vals, async_op, hints, timeout):
    """Calls the real method; an async work is recorded on the first output
    tensor (or waited at once where there is no non-empty output)."""
    comm = comm_from_key(key)
    work = getattr(comm, coll.method)(*_method_args(coll, vals), async_op=async_op,
                                      hints=dict(hints) if hints else None, timeout=timeout)
    res = _results(coll, vals)
    if async_op:
        anchor = _first_tensor(res)
        if anchor is not None and anchor.numel() > 0:
            _put_work(anchor, work)
        else:
            work.wait()
    return res


def _fresh(kind, v):
    """The functional form's buffer for one argument."""
    if kind == "inout":
        return v.clone(memory_format=torch.contiguous_format)
    if kind == "out":
        return torch.empty_like(v, memory_format=torch.contiguous_format)
    if kind == "outlist":
        return [torch.empty_like(t, memory_format=torch.contiguous_format) for t in v]
    if kind == "in":
        return v.contiguous()
    if kind == "inlist":
        return [t.contiguous() for t in v]
    return v


_TAIL_NAMES = ("async_op", "hints", "timeout")


def _split(coll, args, kwargs):
    """A kernel's arguments (after comm): (values, async_op, hints, timeout);
    the dispatcher may pass trailing defaulted arguments by name or not at all."""
    names = [n for n, _ in coll.params] + list(_TAIL_NAMES)
    vals = list(args)
    for name in names[len(args):]:
        vals.append(kwargs.get(name, False if name == "async_op" else None))
    n = len(coll.params)
    return vals[:n], bool(vals[n]), vals[n + 1], vals[n + 2]


def _make_kernels(coll):
    def inplace(key, *args, **kwargs):
        vals, async_op, hints, timeout = _split(coll, args, kwargs)
        return _run(coll, key, vals, async_op, hints, timeout)

    def functional(key, *args, **kwargs):
        vals, async_op, hints, timeout = _split(coll, args, kwargs)
        vals = [_fresh(kind, v) for (_, kind), v in zip(coll.params, vals)]
        return _run(coll, key, vals, async_op, hints, timeout)

    def fake_inplace(key, *args, **kwargs):
        return _results(coll, _split(coll, args, kwargs)[0])

    def fake_functional(key, *args, **kwargs):
        args = _split(coll, args, kwargs)[0]
        res = []
        for (_, kind), v in zip(coll.params, args):
            if kind in ("inout", "out"):
                res.append(torch.empty_like(v, memory_format=torch.contiguous_format))
            elif kind == "outlist":
                res.append([torch.empty_like(t, memory_format=torch.contiguous_format)
                            for t in v])
        if not res:
            return None
        return res[0] if len(res) == 1 else tuple(res)

    return inplace, functional, fake_inplace, fake_functional


# ---------------------------------------------------------------------------
# autograd formulas (those torchcomms has)
# ---------------------------------------------------------------------------

def _functional_op(method):
    return getattr(torch.ops.torchcomms, "torchcomm_" + method).default


def _grads(ctx, coll, **by_name):
    """One gradient slot per input the operator was called with: comm, the
    params, and those of async_op/hints/timeout that were passed. The
    dispatcher drops trailing arguments equal to their defaults; a plain
    autograd.Function accepts extra None gradients, but the tensor-list
    wrapper of torch.library compares structures, so there we count the
    arguments it recorded."""
    n = ctx.n_inputs
    meta = getattr(ctx, "_pt_metadata", None)
    if meta is not None:      # its spec also holds the call's Metadata argument
        n = meta.input_spec.num_children - 1
    tail = n - 1 - len(coll.params)
    # a tensor-list argument without gradient gets a list of Nones
    grads = [by_name.get(name, [None] * ctx.list_lens[i] if i in ctx.list_lens else None)
             for i, (name, _) in enumerate(coll.params)]
    return (None,) + tuple(grads) + (None,) * tail


def _setup_common(ctx, inputs, method):
    ctx.key = inputs[0]
    ctx.n_inputs = len(inputs)
    ctx.list_lens = {i: len(inputs[1 + i]) for i, (_, kind) in
                     enumerate(COLLECTIVES[method].params) if kind in ("inlist", "outlist")}
    t = 1 + len(COLLECTIVES[method].params) + 2      # where timeout is
    ctx.timeout = inputs[t] if len(inputs) > t else None


def _sum_or_avg(what, op):
    if op not in ("SUM", "AVG"):
        raise RuntimeError(
            f"torchcomms.functional: {what} has a derivative for SUM and AVG only, not {op}; "
            "detach the tensor (or use SUM) to differentiate through it")
    return op


def _comm_size(key):
    return comm_from_key(key).get_size()


def _bw_all_reduce(ctx, grad):
    op = _sum_or_avg("all_reduce", ctx.op)
    g = _functional_op("all_reduce")(ctx.key, grad.contiguous(), op, False, None, ctx.timeout)
    return _grads(ctx, COLLECTIVES["all_reduce"], tensor=g)


def _setup_all_reduce(ctx, inputs, output):
    _setup_common(ctx, inputs, "all_reduce")
    ctx.op = inputs[2]


def _setup_shape_of(method, idx, op_idx=None):
    def setup(ctx, inputs, output):
        _setup_common(ctx, inputs, method)
        x = inputs[idx]
        ctx.shapes = [t.shape for t in x] if isinstance(x, (list, tuple)) else x.shape
        ctx.op = inputs[op_idx] if op_idx is not None else "SUM"
        ctx.size = _comm_size(inputs[0])
        if isinstance(x, (list, tuple)):
            ctx.like = x[0] if x else None
    return setup


def _bw_all_gather_single(ctx, grad):
    tmpl = grad.new_empty(ctx.shapes)
    g = _functional_op("reduce_scatter_single")(ctx.key, tmpl, grad.contiguous(), "SUM",
                                                False, None, ctx.timeout)
    return _grads(ctx, COLLECTIVES["all_gather_single"], input=g)


def _bw_reduce_scatter_single(ctx, grad):
    op = _sum_or_avg("reduce_scatter_single", ctx.op)
    tmpl = grad.new_empty(ctx.shapes)
    g = _functional_op("all_gather_single")(ctx.key, tmpl, grad.contiguous(), False, None,
                                            ctx.timeout)
    if op == "AVG":
        g = g / ctx.size
    return _grads(ctx, COLLECTIVES["reduce_scatter_single"], input=g)


def _bw_all_to_all_single(ctx, grad):
    tmpl = grad.new_empty(ctx.shapes)
    g = _functional_op("all_to_all_single")(ctx.key, tmpl, grad.contiguous(), False, None,
                                            ctx.timeout)
    return _grads(ctx, COLLECTIVES["all_to_all_single"], input=g)


def _setup_all_to_all_v(ctx, inputs, output):
    _setup_common(ctx, inputs, "all_to_all_v_single")
    ctx.shapes = inputs[2].shape
    ctx.out_splits, ctx.in_splits = list(inputs[3]), list(inputs[4])


def _bw_all_to_all_v_single(ctx, grad):
    tmpl = grad.new_empty(ctx.shapes)
    g = _functional_op("all_to_all_v_single")(ctx.key, tmpl, grad.contiguous(),
                                              ctx.in_splits, ctx.out_splits, False, None,
                                              ctx.timeout)
    return _grads(ctx, COLLECTIVES["all_to_all_v_single"], input=g)


def _bw_all_gather(ctx, grads):
    grads = [g.contiguous() for g in grads]
    tmpl = grads[0].new_empty(ctx.shapes)
    g = _functional_op("reduce_scatter")(ctx.key, tmpl, grads, "SUM", False, None, ctx.timeout)
    return _grads(ctx, COLLECTIVES["all_gather"], tensor=g)


def _bw_reduce_scatter(ctx, grad):
    op = _sum_or_avg("reduce_scatter", ctx.op)
    tmpls = [grad.new_empty(s) for s in ctx.shapes]
    gs = _functional_op("all_gather")(ctx.key, tmpls, grad.contiguous(), False, None,
                                      ctx.timeout)
    if op == "AVG":
        gs = [g / ctx.size for g in gs]
    return _grads(ctx, COLLECTIVES["reduce_scatter"], input_list=list(gs))


_AUTOGRAD = {
    "all_reduce": (_setup_all_reduce, _bw_all_reduce),
    "all_gather_single": (_setup_shape_of("all_gather_single", 2), _bw_all_gather_single),
    "reduce_scatter_single": (_setup_shape_of("reduce_scatter_single", 2, 3), _bw_reduce_scatter_single),
    "all_to_all_single": (_setup_shape_of("all_to_all_single", 2), _bw_all_to_all_single),
    "all_to_all_v_single": (_setup_all_to_all_v, _bw_all_to_all_v_single),
    "all_gather": (_setup_shape_of("all_gather", 2), _bw_all_gather),
    "reduce_scatter": (_setup_shape_of("reduce_scatter", 2, 3), _bw_reduce_scatter),
}

# ---------------------------------------------------------------------------
# registration
# ---------------------------------------------------------------------------

lib = torch.library.Library(NS, "DEF")
_EFFECT_HANDLES = []


def _effectful(name):
    from torch._higher_order_ops.effects import _register_effectful_op
    from torch._library.effects import EffectType

    _EFFECT_HANDLES.append(_register_effectful_op(
        getattr(torch.ops.torchcomms, name).default, EffectType.ORDERED))


def _define_wait():
    lib.define("torchcomm_wait_tensors(Tensor[] inputs) -> Tensor[]",
               tags=[torch.Tag.pt2_compliant_tag])
    lib.define("torchcomm_wait_tensors_(Tensor(a!)[] inputs) -> Tensor(a!)[]",
               tags=[torch.Tag.pt2_compliant_tag])

    def wait(inputs):
        # all tensors of one collective share its work, recorded on the first
        for t in inputs[:1]:
            work = _take_work(t)
            if work is not None:
                work.wait()
        return list(inputs)

    def wait_functional(inputs):
        wait(inputs)
        # a functional operator must not return its inputs: the waited data
        # is returned as new tensors
        return [t.clone() for t in inputs]

    lib.impl("torchcomm_wait_tensors", wait_functional, "CompositeExplicitAutograd")
    lib.impl("torchcomm_wait_tensors_", wait, "CompositeExplicitAutograd")
    torch.library.register_fake("torchcomms::torchcomm_wait_tensors", lib=lib)(
        lambda inputs: [torch.empty_like(t) for t in inputs])
    torch.library.register_fake("torchcomms::torchcomm_wait_tensors_", lib=lib)(
        lambda inputs: list(inputs))

    def setup(ctx, inputs, output):
        pass

    def backward(ctx, grads):
        return (list(grads),)

    torch.library.register_autograd("torchcomms::torchcomm_wait_tensors", backward,
                                    setup_context=setup, lib=lib)
    _effectful("torchcomm_wait_tensors")


def _define_collectives():
    for coll in COLLECTIVES.values():
        inplace, functional, fake_inplace, fake_functional = _make_kernels(coll)
        tags = [torch.Tag.pt2_compliant_tag]
        lib.define(coll.schema(inplace=False), tags=tags)
        lib.impl(coll.name, functional, "CompositeExplicitAutograd")
        torch.library.register_fake(f"{NS}::{coll.name}", lib=lib)(fake_functional)
        _effectful(coll.name)
        if coll.has_inplace:
            lib.define(coll.schema(inplace=True), tags=tags)
            lib.impl(coll.name + "_", inplace, "CompositeExplicitAutograd")
            torch.library.register_fake(f"{NS}::{coll.name}_", lib=lib)(fake_inplace)
        if coll.method in _AUTOGRAD:
            setup, backward = _AUTOGRAD[coll.method]
            torch.library.register_autograd(f"{NS}::{coll.name}", backward,
                                            setup_context=setup, lib=lib)


_define_wait()
_define_collectives()
