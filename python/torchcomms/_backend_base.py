"""The base class of backends written in Python (``TorchCommBackend``), the
object ``TorchComm.get_backend_impl()`` returns for a C backend, and the
exception ``new_comm`` raises for a backend name nothing provides.

``torchcomms._comms`` exports these names (through ``_comms_classes``); the
extension (``_comms_pybackend.c``) runs a registered subclass behind the C
core's backend table, so that a Python backend gets the core's work objects,
timeouts, hooks and flight recorder like any other (docs/backends.md,
"Backends written in Python").

It imports neither torch nor the extension.
"""

__all__ = ["TorchCommBackend"]


def _pure(name):
    def method(self, *args, **kwargs):
        raise RuntimeError(
            f'Tried to call pure virtual function "TorchCommBackend::{name}"')
    method.__name__ = name
    method.__qualname__ = f"TorchCommBackend.{name}"
    method.__doc__ = (f"Must be overridden: the default raises RuntimeError "
                      f"('Tried to call pure virtual function "
                      f"\"TorchCommBackend::{name}\"').")
    return method


class TorchCommBackend:
    """Base class of a communication backend written in Python.

    Subclass it, override the methods below and register the class with
    ``torchcomms.register_backend(name, cls)`` (or declare it in the
    ``torchcomms.backends`` entry-point group of an installed package); then
    ``torchcomms.new_comm(name, device, name=...)`` creates an instance with
    no arguments, calls ``init(device, name, options)`` and asks
    ``get_rank()`` / ``get_size()``.

    Every operation receives torchcomms' arguments without hints and timeout
    and ends with ``async_op``; it returns None once the operation is
    complete, or an object with a ``wait()`` method that completes it:

        send(tensor, dst, async_op)        recv(tensor, src, async_op)
        broadcast(tensor, root, async_op)  all_reduce(tensor, op, async_op)
        reduce(tensor, root, op, async_op)
        all_gather(tensor_list, tensor, async_op)      (and all_gather_v)
        all_gather_single(output, input, async_op)
        reduce_scatter(output, input_list, op, async_op)  (and _v)
        reduce_scatter_single(output, input, op, async_op)
        all_to_all_single(output, input, async_op)
        all_to_all_v_single(output, input, output_split_sizes,
                            input_split_sizes, async_op)
        all_to_all(output_tensor_list, input_tensor_list, async_op)
        barrier(async_op)
        scatter(output_tensor, input_tensor_list, root, async_op)
        gather(output_tensor_list, input_tensor, root, async_op)
        gather_single(output, input, root, async_op)   (default: gather)
        split(ranks, name, options) -> a new, initialised instance

    They run on the communicator's own thread, one at a time in issue order
    (a returned work object is waited on before the next operation starts);
    an exception fails the operation (a synchronous call re-raises it).
    ``TorchComm.split`` first agrees on the groups with an
    ``all_gather_single`` of int64 tensors, then calls ``split`` on every
    rank of the parent (``ranks == []`` on a rank in no group, whose return
    value is ignored). A backend that does not return within an operation's
    timeout has that operation failed (its call goes on). Batches
    (``batch_op_create().issue``) are not supported.
    """

    def __init__(self):
        pass

    def set_timeout(self, timeout):
        """Called by TorchComm.set_timeout(timeout) (a timedelta); the
        default does nothing."""

    def gather_single(self, output, input, root, async_op):
        """gather into one tensor: the default calls gather() with views
        of `output`, one block per rank (at root; [] elsewhere)."""
        if self.get_rank() == root:
            n = input.numel()
            flat = output.view(-1)
            blocks = [flat[i * n:(i + 1) * n].view(input.shape)
                      for i in range(self.get_size())]
        else:
            blocks = []
        return self.gather(blocks, input, root, async_op)


for _name in ("init", "finalize", "get_rank", "get_size", "get_backend_name",
              "get_comm_name", "send", "recv", "broadcast", "all_reduce",
              "reduce", "all_gather", "all_gather_v", "all_gather_single",
              "reduce_scatter", "reduce_scatter_v", "reduce_scatter_single",
              "all_to_all_single", "all_to_all_v_single", "all_to_all",
              "barrier", "scatter", "gather", "split"):
    setattr(TorchCommBackend, _name, _pure(_name))
del _name


class _NativeBackend(TorchCommBackend):
    """What TorchComm.get_backend_impl() returns for a backend written in C
    (the native "cpu", "nccl", a plugin): a description of it. Its
    operations are the TorchComm's own; the pure methods stay pure."""

    def __init__(self, backend, version, comm_name, rank, size):
        super().__init__()
        self._backend, self._version = backend, version
        self._comm_name, self._rank, self._size = comm_name, rank, size

    def get_backend_name(self):
        return self._backend

    def get_backend_version(self):
        return self._version

    def get_comm_name(self):
        return self._comm_name

    def get_rank(self):
        return self._rank

    def get_size(self):
        return self._size

    def __repr__(self):
        return (f"<torchcomms backend {self._backend!r} (C, version "
                f"{self._version!r}) of communicator {self._comm_name!r}, "
                f"rank {self._rank} of {self._size}>")


class _BackendNotFoundError(ModuleNotFoundError, RuntimeError):
    """new_comm found no backend of that name: neither registered, nor an
    entry point, nor a plugin or built-in of the C loader. A
    ModuleNotFoundError (what torchcomms raises) and a RuntimeError (what
    the C loader's errors are)."""


for _n in ("TorchCommBackend", "_NativeBackend", "_BackendNotFoundError"):
    globals()[_n].__module__ = "torchcomms._comms"
del _n
