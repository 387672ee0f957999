"""torchcomms.functional: TorchComm collectives for torch.compile and autograd.

Importing this module (it imports torch; ``import torchcomms`` alone does
not) defines the custom operators ``torch.ops.torchcomms.torchcomm_<method>``
(functional) and ``torchcomm_<method>_`` (in place) for every collective of
:class:`torchcomms.TorchComm`, plus ``torchcomm_wait_tensors`` /
``torchcomm_wait_tensors_``, with fake implementations and autograd formulas
(see :mod:`torchcomms.functional.collectives`), and lets torch.compile trace
TorchComm's own collective methods (:mod:`torchcomms.functional.dynamo`).

Two ways to use it, both fine under ``torch.compile(fullgraph=True)``::

    import torchcomms.functional as F

    y = F.all_reduce(comm, x, ReduceOp.SUM)       # new tensor, differentiable
    F.all_reduce_(comm, x, ReduceOp.SUM)          # in place, returns x
    out = F.all_gather_single(comm, torch.empty(n * k), x)   # shape template

    comm.all_reduce(x, ReduceOp.SUM)              # the method, traced in place
    work = comm.all_reduce(x, ReduceOp.SUM, async_op=True); work.wait()

Eager ``async_op=True`` results are :class:`TorchCommsAsyncTensor`: the
first use waits; ``.wait()`` returns the plain tensor.
"""

import torch  # noqa: F401  (this module is torch's side of torchcomms)

from torchcomms.functional import collectives  # noqa: F401  (defines the operators)
from torchcomms.functional.async_tensor import FakeWork, TorchCommsAsyncTensor
from torchcomms.functional.collectives import COLLECTIVES, comm_key
from torchcomms.functional.dynamo import register_with_dynamo
from torchcomms.functional.functions import FUNCTIONS, wait_tensors

globals().update(FUNCTIONS)
register_with_dynamo()


def is_torch_compile_supported_and_enabled():
    """True: this build of torchcomms supports torch.compile of its
    collectives whenever torchcomms.functional is imported (torchcomms gates
    it behind TORCHCOMMS_PATCH_FOR_COMPILE=1 and torch >= 2.12)."""
    return True


__all__ = sorted(FUNCTIONS) + [
    "TorchCommsAsyncTensor", "FakeWork", "wait_tensors", "comm_key", "COLLECTIVES",
    "register_with_dynamo", "is_torch_compile_supported_and_enabled",
]
