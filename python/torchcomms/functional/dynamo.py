"""torch.compile of code that calls TorchComm's own methods.

TorchComm is a C type, so dynamo cannot trace into its methods. Here each
collective method (and its alias: allreduce, allgather, ...) gets a
polyfill through ``torch._dynamo.decorators.substitute_in_graph``: while
dynamo traces, ``comm.all_reduce(t, op)`` becomes the functional operator
``torch.ops.torchcomms.torchcomm_all_reduce`` plus a copy into ``t`` (the
method's in-place semantics); with ``async_op=True`` it returns a
:class:`FakeWork` whose ``wait()`` emits ``torchcomm_wait_tensors`` and then
copies. A synchronous call returns None in the graph (the eager method
returns a completed TorchWork). ``get_rank``, ``get_size``, ``get_name``
become constants. Eager calls are untouched.
"""

import torch
from torch._dynamo.decorators import substitute_in_graph

from torchcomms._comms import TorchComm
from torchcomms.functional.async_tensor import FakeWork
from torchcomms.functional.collectives import COLLECTIVES
from torchcomms.functional.functions import _copy_back, bind, flatten, op_args, unflatten

ALIASES = {
    "allreduce": "all_reduce", "allgather": "all_gather", "allgather_v": "all_gather_v",
    "allgather_single": "all_gather_single", "reducescatter": "reduce_scatter",
    "reducescatter_v": "reduce_scatter_v", "reducescatter_single": "reduce_scatter_single",
    "alltoall": "all_to_all", "alltoall_single": "all_to_all_single",
    "alltoallv_single": "all_to_all_v_single",
}


def _traced_method(coll_name, attr):
    # only str constants in the closure: dynamo inlines polyfills without a
    # source for their closure, and reads the table through the module global
    def method(self, *args, **kwargs):
        coll = COLLECTIVES[coll_name]
        vals, async_op, hints, timeout = bind(coll, args, kwargs, f"TorchComm.{attr}")
        oargs, hints, timeout = op_args(coll, self, vals, hints, timeout)
        res = getattr(torch.ops.torchcomms, coll.name)(*oargs, async_op, hints, timeout)
        if res == () or res is None:
            return FakeWork([]) if async_op else None
        if isinstance(res, tuple):
            res = list(res)
        if not async_op:
            _copy_back(coll, vals, res)
            return None

        def on_wait(waited):
            _copy_back(coll, vals, unflatten(res, waited))

        return FakeWork(flatten(res), on_wait)

    method.__name__ = attr
    return method


@torch._dynamo.assume_constant_result
def _info(comm, what):
    return getattr(comm, what)()


def _constant(what):
    def method(self):
        return _info(self, what)
    method.__name__ = what
    return method


_REGISTERED = []


def register_with_dynamo():
    """Installs the polyfills (once; importing torchcomms.functional does it)."""
    if _REGISTERED:
        return
    for attr in list(COLLECTIVES) + list(ALIASES):
        original = TorchComm.__dict__[attr]
        substitute_in_graph(original, skip_signature_check=True)(
            _traced_method(ALIASES.get(attr, attr), attr))
        _REGISTERED.append(attr)
    for attr in ("get_rank", "get_size", "get_name"):
        substitute_in_graph(TorchComm.__dict__[attr], skip_signature_check=True)(
            _constant(attr))
        _REGISTERED.append(attr)
