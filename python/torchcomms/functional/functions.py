"""Python functions over the custom operators: ``F.<method>(comm, ...)``
(functional: new tensors) and ``F.<method>_(comm, ...)`` (in place).

Their arguments are those of the TorchComm method of the same name, with the
communicator first: ``all_reduce(comm, tensor, op=ReduceOp.SUM,
async_op=False, hints=None, timeout=None)``. They run eagerly and under
torch.compile(fullgraph=True) alike.
"""

import inspect

import torch

from torchcomms._comms import ReduceOp
from torchcomms.functional.async_tensor import _take_work, _wrap_async
from torchcomms.functional.collectives import (
    COLLECTIVES,
    comm_key,
    reduce_op_name,
    timeout_seconds,
)

_TAIL = ("async_op", "hints", "timeout")
_TAIL_DEFAULTS = (False, None, None)


def _defaults(coll):
    return {name: ReduceOp.SUM for name, kind in coll.params if kind == "op"}


def bind(coll, args, kwargs, what):
    """The method's arguments by position: (values, async_op, hints, timeout)."""
    names = [n for n, _ in coll.params] + list(_TAIL)
    if len(args) > len(names):
        raise TypeError(f"{what}() takes {len(names)} arguments after comm "
                        f"({len(args)} given)")
    vals = list(args)
    defaults = _defaults(coll)
    for name in names[len(args):]:
        if name in kwargs:
            vals.append(kwargs[name])
        elif name in defaults:
            vals.append(defaults[name])
        elif name in _TAIL:
            vals.append(_TAIL_DEFAULTS[_TAIL.index(name)])
        else:
            raise TypeError(f"{what}() missing required argument {name!r}")
    for k in kwargs:
        if k not in names[len(args):]:
            raise TypeError(f"{what}() got an unexpected or repeated keyword argument {k!r}")
    n = len(coll.params)
    return vals[:n], bool(vals[n]), vals[n + 1], vals[n + 2]


def op_args(coll, comm, vals, hints, timeout):
    """The operator's arguments (after comm's key) for the method's values."""
    out = []
    for (_, kind), v in zip(coll.params, vals):
        if kind == "op":
            v = reduce_op_name(v)
        elif kind in ("inlist", "outlist", "ints"):
            v = list(v)
        out.append(v)
    return [comm_key(comm)] + out, (dict(hints) if hints else None), timeout_seconds(timeout)


def flatten(res):
    if res is None:
        return []
    if isinstance(res, torch.Tensor):
        return [res]
    return [t for r in res for t in flatten(r)]


def unflatten(res, flat):
    it = iter(flat)

    def go(r):
        if isinstance(r, torch.Tensor):
            return next(it)
        return [go(x) for x in r]
    return go(res)


def waited(res):
    """Traced: the results of an async collective after torchcomm_wait_tensors."""
    flat = flatten(res)
    if not flat:
        return res
    return unflatten(res, torch.ops.torchcomms.torchcomm_wait_tensors(flat))


def _needs_grad(vals):
    return torch.is_grad_enabled() and any(t.requires_grad for t in flatten(
        [v for v in vals if isinstance(v, (torch.Tensor, list, tuple))
         and (isinstance(v, torch.Tensor) or all(isinstance(x, torch.Tensor) for x in v))]))


def run_functional(coll, comm, vals, async_op, hints, timeout):
    args, hints, timeout = op_args(coll, comm, vals, hints, timeout)
    res = getattr(torch.ops.torchcomms, coll.name)(*args, async_op, hints, timeout)
    if res == () or res is None:
        return None
    if isinstance(res, tuple):
        res = list(res)
    if not async_op:
        return res
    if torch.compiler.is_compiling():
        return waited(res)
    first = flatten(res)
    return _wrap_async(res, _take_work(first[0]) if first else None)


def _copy_back(coll, vals, res):
    """Writes functional results into the method's output arguments."""
    outs = [vals[i] for i in coll.outputs]
    res = [res] if len(outs) == 1 else res
    for dst, src in zip(outs, res):
        if isinstance(dst, torch.Tensor):
            dst.copy_(src)
        else:
            for d, s in zip(dst, src):
                d.copy_(s)
    return outs[0] if len(outs) == 1 else tuple(outs)


def run_inplace(coll, comm, vals, async_op, hints, timeout):
    if torch.compiler.is_compiling() or _needs_grad(vals):
        # functional operator + copy_: functionalization and autograd handle
        # the copy; an async result is waited before it is copied
        res = run_functional(coll, comm, vals, async_op and torch.compiler.is_compiling(),
                             hints, timeout)
        return _copy_back(coll, vals, res)
    args, hints, timeout = op_args(coll, comm, vals, hints, timeout)
    res = getattr(torch.ops.torchcomms, coll.name + "_")(*args, async_op, hints, timeout)
    if isinstance(res, tuple):
        res = list(res)
    if not async_op:
        return res
    first = flatten(res)
    return _wrap_async(res, _take_work(first[0]) if first else None)


def _signature(coll):
    P = inspect.Parameter
    ps = [P("comm", P.POSITIONAL_OR_KEYWORD)]
    defaults = _defaults(coll)
    for name, _ in coll.params:
        ps.append(P(name, P.POSITIONAL_OR_KEYWORD,
                    default=defaults.get(name, P.empty)))
    ps += [P(n, P.POSITIONAL_OR_KEYWORD, default=d) for n, d in zip(_TAIL, _TAIL_DEFAULTS)]
    return inspect.Signature(ps)


def _make(coll, inplace):
    name = coll.method + ("_" if inplace else "")
    run = run_inplace if inplace else run_functional

    def fn(comm, *args, **kwargs):
        vals, async_op, hints, timeout = bind(coll, args, kwargs, name)
        return run(coll, comm, vals, async_op, hints, timeout)

    fn.__name__ = fn.__qualname__ = name
    fn.__module__ = "torchcomms.functional"
    fn.__signature__ = _signature(coll)
    if inplace:
        fn.__doc__ = (f"TorchComm.{coll.method} in place through "
                      f"torch.ops.torchcomms.{coll.name}_: writes the output argument(s) "
                      "and returns them; with async_op=True (eager) they come back as "
                      "TorchCommsAsyncTensor. Under torch.compile, or when an input "
                      "requires grad, it is the functional operator followed by copy_.")
    else:
        fn.__doc__ = (f"TorchComm.{coll.method} as a function (torch.ops.torchcomms."
                      f"{coll.name}): no argument is written; returns the result as new "
                      "tensor(s) (output arguments give their shape and dtype). With "
                      "async_op=True it returns TorchCommsAsyncTensor(s) eagerly and "
                      "the waited result under torch.compile.")
    return fn


FUNCTIONS = {}
for _coll in COLLECTIVES.values():
    FUNCTIONS[_coll.method] = _make(_coll, False)
    if _coll.has_inplace:
        FUNCTIONS[_coll.method + "_"] = _make(_coll, True)


def wait_tensors(tensors):
    """Waits for the collectives writing `tensors` (through
    torch.ops.torchcomms.torchcomm_wait_tensors) and returns the waited
    tensors; TorchCommsAsyncTensor inputs are waited and unwrapped."""
    from torchcomms.functional.async_tensor import TorchCommsAsyncTensor

    plain = [t.wait() if isinstance(t, TorchCommsAsyncTensor) else t for t in tensors]
    return list(torch.ops.torchcomms.torchcomm_wait_tensors(plain))
