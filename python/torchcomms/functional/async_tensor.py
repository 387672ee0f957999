"""The async result of a functional collective, and the work handles behind it.

Eager: an ``async_op=True`` functional collective returns a
:class:`TorchCommsAsyncTensor` (a tensor subclass around the result and the
operation's :class:`torchcomms.TorchWork`); the first use of the tensor by
any torch function waits, ``.wait()`` waits explicitly and returns the plain
tensor. Autograd sees through it to the wrapped result.

Traced (torch.compile): a work handle is a :class:`FakeWork`; its ``wait()``
puts ``torch.ops.torchcomms.torchcomm_wait_tensors`` in the graph, so every
later use depends on the wait.

Between the two, the eager kernels of the custom ops keep the work of an
async collective in a table keyed by its first output tensor; the wrapper
(or the ``torchcomm_wait_tensors`` kernel) takes it from there.
"""

import threading

import torch
import torch.utils._pytree as pytree

__all__ = ["TorchCommsAsyncTensor", "FakeWork"]

# work of async collectives issued by an op kernel, until someone takes it:
# key = (data_ptr, id) of the first output tensor
_PENDING = {}
_PENDING_LOCK = threading.Lock()


def _key(t):
    return (t.data_ptr(), id(t.untyped_storage()) if t.numel() else id(t))


def _put_work(tensor, work):
    """Records `work` as the pending operation writing `tensor` (eager only)."""
    if torch.compiler.is_compiling():  # pragma: no cover - kernels do not run while tracing
        return
    with _PENDING_LOCK:
        _PENDING[_key(tensor)] = work


def _take_work(tensor):
    """The pending work recorded for `tensor`, removed from the table (or None)."""
    if torch.compiler.is_compiling():  # pragma: no cover
        return None
    with _PENDING_LOCK:
        return _PENDING.pop(_key(tensor), None)


def _pending_count():
    """How many async works were issued and not yet taken (a test hook)."""
    with _PENDING_LOCK:
        return len(_PENDING)


class _OnceWaitWork:
    """One work shared by several tensors (the outputs of one list
    collective): waits the first time only."""

    __slots__ = ("_work", "_waited")

    def __init__(self, work):
        self._work = work
        self._waited = False

    def wait(self):
        if not self._waited:
            self._waited = True
            if self._work is not None:
                self._work.wait()

    def is_completed(self):
        return self._waited or self._work is None or self._work.is_completed()


class FakeWork:
    """The work handle of an async collective while torch.compile traces.

    It holds the (traced) results of the collective; ``wait()`` emits
    ``torchcomm_wait_tensors`` on them and then runs the ``on_wait``
    callbacks with the waited tensors (the method form of the collectives
    copies them into the caller's buffers there). Waiting twice is a no-op.
    """

    def __init__(self, tensors, on_wait=None):
        self.tensors = list(tensors)
        self._on_wait = on_wait
        self._waited = False

    def wait(self):
        if not self._waited:
            self._waited = True
            if self.tensors:
                waited = torch.ops.torchcomms.torchcomm_wait_tensors(self.tensors)
                self.tensors = list(waited)
            if self._on_wait is not None:
                self._on_wait(self.tensors)
        return None

    def is_completed(self):
        return self._waited


class TorchCommsAsyncTensor(torch.Tensor):
    """A collective's result that is still being written.

    ``elem`` is the result tensor and ``work`` the operation writing it. Any
    torch function applied to the tensor waits first (once) and then works on
    ``elem``; ``wait()`` waits and returns ``elem``. ``grad_fn``, ``is_leaf``
    and ``grad`` are those of ``elem``, so autograd flows through.
    """

    __slots__ = ("elem", "work", "completed")

    @staticmethod
    def __new__(cls, elem, work):
        r = torch.Tensor._make_wrapper_subclass(
            cls, elem.size(), strides=elem.stride(), storage_offset=elem.storage_offset(),
            dtype=elem.dtype, layout=elem.layout, device=elem.device,
            requires_grad=elem.requires_grad)
        r.elem = elem
        r.work = work
        r.completed = work is None
        return r

    @property
    def grad_fn(self):
        return self.elem.grad_fn

    @property
    def is_leaf(self):
        return self.elem.is_leaf

    @property
    def grad(self):
        return self.elem.grad

    @grad.setter
    def grad(self, value):
        self.elem.grad = value

    def trigger_wait(self):
        """Waits for the operation (the first time) and returns ``elem``."""
        if not self.completed:
            if self.work is not None:
                self.work.wait()
            self.completed = True
        return self.elem

    def wait(self):
        """Waits for the operation and returns the plain result tensor."""
        return self.trigger_wait()

    def backward(self, gradient=None, retain_graph=None, create_graph=False, inputs=None):
        return self.trigger_wait().backward(gradient, retain_graph, create_graph, inputs)

    def __repr__(self):
        return f"TorchCommsAsyncTensor({self.trigger_wait()!r})"

    def __tensor_flatten__(self):
        return ["elem"], (self.work, self.completed)

    @staticmethod
    def __tensor_unflatten__(inner, meta, outer_size, outer_stride):
        work, completed = meta
        r = TorchCommsAsyncTensor(inner["elem"], work)
        r.completed = completed
        return r

    @staticmethod
    def _unwrap(x):
        return x.trigger_wait() if isinstance(x, TorchCommsAsyncTensor) else x

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        # before autograd: the op is recorded on elem (which has the grad_fn)
        args = pytree.tree_map(cls._unwrap, args)
        kwargs = pytree.tree_map(cls._unwrap, kwargs or {})
        return func(*args, **kwargs)

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        args = pytree.tree_map_only(TorchCommsAsyncTensor, lambda e: e.trigger_wait(), args)
        kwargs = pytree.tree_map_only(TorchCommsAsyncTensor, lambda e: e.trigger_wait(),
                                      kwargs or {})
        return func(*args, **kwargs)


def _wrap_async(results, work):
    """Eager: the outputs of an async collective, each a TorchCommsAsyncTensor
    sharing one wait (a list stays a list)."""
    if work is None:
        return results
    if isinstance(results, torch.Tensor):
        return TorchCommsAsyncTensor(results, work)
    once = _OnceWaitWork(work)
    return [TorchCommsAsyncTensor(t, once) for t in results]
