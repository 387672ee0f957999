"""Object collectives over a TorchComm: picklable Python objects instead of
tensors.

Same functions, argument order and semantics as meta-pytorch/torchcomms'
``torchcomms.objcol``::

    all_gather_object(comm, object_list, obj, timeout=None, weights_only=True)
    gather_object(comm, obj, root, object_gather_list=None, timeout=None,
                  weights_only=True)
    broadcast_object_list(comm, object_list, root, timeout=None,
                          weights_only=True)
    scatter_object_list(comm, root, scatter_object_output_list,
                        scatter_object_input_list=None, timeout=None,
                        weights_only=True)
    send_object_list(comm, object_list, dst, timeout=None)
    recv_object_list(comm, object_list, src, timeout=None, weights_only=True)

For code written against torch.distributed, the ``src=`` / ``dst=`` keyword
spellings are accepted too, and gather_object / scatter_object_list also take
torch.distributed's positional order (``gather_object(comm, obj,
object_gather_list, dst)``, ``scatter_object_list(comm, output_list,
input_list, src)``): a rank is an int, a list never is, so the two orders
cannot be confused.

Objects are serialized into uint8 tensors on the communicator's device with
``torch.save`` (read back with ``torch.load(weights_only=weights_only)``), or
with plain ``pickle`` when ``TORCHCOMMS_SERIALIZATION=pickle`` -- as upstream.
With the default serializer and ``weights_only=True`` only "safe" objects
(tensors, containers, numbers, strings, bytes, None) can be received; pass
``weights_only=False`` (trusted peers only) for arbitrary picklable objects.
Sizes are exchanged first as int64 tensors, then the (padded) payloads. Every
function is blocking and must be called by every rank involved, in the same
order, like any other collective.

This module imports neither torch.distributed nor, until first use, torch.
"""

import io
import operator
import os
import pickle
from datetime import timedelta
from typing import Any, List, Optional

__all__ = [
    "all_gather_object",
    "gather_object",
    "broadcast_object_list",
    "scatter_object_list",
    "send_object_list",
    "recv_object_list",
]

_UNSET = object()


def _torch():
    import torch

    return torch


def _use_pickle() -> bool:
    return os.environ.get("TORCHCOMMS_SERIALIZATION") == "pickle"


def _serialize(obj: object) -> bytes:
    f = io.BytesIO()
    if _use_pickle():
        pickle.Pickler(f, protocol=pickle.HIGHEST_PROTOCOL).dump(obj)
    else:
        _torch().save(obj, f)
    return f.getvalue()


def _deserialize(data: bytes, weights_only: bool) -> object:
    f = io.BytesIO(data)
    if _use_pickle():
        return pickle.Unpickler(f).load()
    return _torch().load(f, weights_only=weights_only)


def _bytes_tensor(data: bytes, device, length: Optional[int] = None):
    """A uint8 tensor on `device` holding `data`, zero-padded to `length`."""
    torch = _torch()
    n = len(data)
    length = n if length is None else length
    if n and n == length:
        t = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    else:
        t = torch.zeros(length, dtype=torch.uint8)
        if n:
            t[:n] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    return t.to(device)


def _tensor_bytes(t, n: int) -> bytes:
    """The first `n` bytes of the uint8 tensor `t`."""
    n = int(n)
    if n == 0:
        return b""
    t = t[:n]
    if t.device.type != "cpu":
        t = t.cpu()
    t = t.contiguous()
    import ctypes

    return ctypes.string_at(t.data_ptr(), n)


def _sizes_tensor(sizes, device):
    torch = _torch()
    return torch.tensor(list(sizes), dtype=torch.int64, device=device)


def _is_rank(x) -> bool:
    if isinstance(x, bool):
        return False
    try:
        operator.index(x)
    except TypeError:
        return False
    return True


def _pick_rank(name: str, value, alias_name: str, alias) -> int:
    if value is None and alias is None:
        raise TypeError(f"missing the rank argument '{name}' (or '{alias_name}')")
    if value is not None and alias is not None and value != alias:
        raise ValueError(f"both '{name}' ({value}) and '{alias_name}' ({alias}) given")
    return operator.index(value if value is not None else alias)


def all_gather_object(
    comm,
    object_list: List[Any],
    obj: object,
    timeout: Optional[timedelta] = None,
    weights_only: bool = True,
) -> None:
    """Gathers one picklable object from every rank into ``object_list``
    (which must have ``comm.get_size()`` slots) on every rank."""
    torch = _torch()
    device = comm.get_device()
    size = comm.get_size()
    data = _serialize(obj)

    sizes = torch.zeros(size, dtype=torch.int64, device=device)
    comm.all_gather_single(
        sizes, _sizes_tensor([len(data)], device), async_op=False, timeout=timeout
    )
    sizes = sizes.tolist()
    max_size = max(sizes)

    out = torch.empty(max_size * size, dtype=torch.uint8, device=device)
    comm.all_gather_single(
        out, _bytes_tensor(data, device, max_size), async_op=False, timeout=timeout
    )
    for i in range(size):
        object_list[i] = _deserialize(
            _tensor_bytes(out[i * max_size :], sizes[i]), weights_only
        )


def gather_object(
    comm,
    obj: object,
    root: Any = None,
    object_gather_list: Optional[List[Any]] = None,
    timeout: Optional[timedelta] = None,
    weights_only: bool = True,
    *,
    dst: Optional[int] = None,
) -> None:
    """Gathers one picklable object from every rank into
    ``object_gather_list`` on rank ``root`` (other ranks: the list is not
    touched and may be None)."""
    # torch.distributed's order: gather_object(comm, obj, object_gather_list, dst)
    if not _is_rank(root):
        if _is_rank(object_gather_list):
            root, object_gather_list = object_gather_list, root
        elif isinstance(root, list) and object_gather_list is None:
            root, object_gather_list = None, root
    root = _pick_rank("root", root, "dst", dst)

    torch = _torch()
    device = comm.get_device()
    rank = comm.get_rank()
    size = comm.get_size()
    data = _serialize(obj)

    # Every rank needs the largest size (gather moves equal-sized tensors).
    sizes = torch.zeros(size, dtype=torch.int64, device=device)
    comm.all_gather_single(
        sizes, _sizes_tensor([len(data)], device), async_op=False, timeout=timeout
    )
    sizes = sizes.tolist()
    max_size = max(sizes)

    out = torch.empty(max_size * size, dtype=torch.uint8, device=device)
    out_list = [out[i * max_size : (i + 1) * max_size] for i in range(size)]
    comm.gather(
        out_list,
        _bytes_tensor(data, device, max_size),
        root,
        async_op=False,
        timeout=timeout,
    )
    if rank != root:
        return
    if object_gather_list is None:
        raise ValueError("gather_object: the root rank must pass object_gather_list")
    for i in range(size):
        object_gather_list[i] = _deserialize(
            _tensor_bytes(out_list[i], sizes[i]), weights_only
        )


def broadcast_object_list(
    comm,
    object_list: List[Any],
    root: Optional[int] = None,
    timeout: Optional[timedelta] = None,
    weights_only: bool = True,
    *,
    src: Optional[int] = None,
) -> None:
    """Broadcasts the objects of ``object_list`` on rank ``root`` into
    ``object_list`` on every rank (every rank passes a list of the same
    length)."""
    root = _pick_rank("root", root, "src", src)
    torch = _torch()
    device = comm.get_device()
    rank = comm.get_rank()
    n = len(object_list)
    if n == 0:
        return

    if rank == root:
        blobs = [_serialize(o) for o in object_list]
        sizes = _sizes_tensor([len(b) for b in blobs], device)
    else:
        sizes = torch.zeros(n, dtype=torch.int64, device=device)
    comm.broadcast(sizes, root, async_op=False, timeout=timeout)
    sizes = sizes.tolist()

    if rank == root:
        payload = _bytes_tensor(b"".join(blobs), device)
    else:
        payload = torch.empty(sum(sizes), dtype=torch.uint8, device=device)
    comm.broadcast(payload, root, async_op=False, timeout=timeout)

    if rank == root:
        return
    offset = 0
    for i, s in enumerate(sizes):
        object_list[i] = _deserialize(_tensor_bytes(payload[offset:], s), weights_only)
        offset += s


def scatter_object_list(
    comm,
    root: Any = None,
    scatter_object_output_list: Optional[List[Any]] = None,
    scatter_object_input_list: Optional[List[Any]] = None,
    timeout: Optional[timedelta] = None,
    weights_only: bool = True,
    *,
    src: Optional[int] = None,
) -> None:
    """Scatters ``scatter_object_input_list`` (``comm.get_size()`` objects,
    only read on rank ``root``): rank i receives object i into
    ``scatter_object_output_list[0]``."""
    # torch.distributed's order: (comm, output_list, input_list, src)
    if isinstance(root, list):
        out_list, in_list = root, scatter_object_output_list
        root = scatter_object_input_list
        scatter_object_output_list, scatter_object_input_list = out_list, in_list
    root = _pick_rank("root", root, "src", src)

    if (
        not isinstance(scatter_object_output_list, list)
        or len(scatter_object_output_list) < 1
    ):
        raise ValueError(
            "Expected argument scatter_object_output_list to be a list of size at least 1."
        )

    torch = _torch()
    device = comm.get_device()
    rank = comm.get_rank()
    size = comm.get_size()

    if rank == root:
        if scatter_object_input_list is None:
            raise ValueError("source rank must provide non-None scatter_object_input_list")
        if len(scatter_object_input_list) != size:
            raise ValueError(
                f"scatter_object_list: scatter_object_input_list has "
                f"{len(scatter_object_input_list)} objects, expected {size} (the world size)"
            )
        blobs = [_serialize(o) for o in scatter_object_input_list]
        sizes = _sizes_tensor([len(b) for b in blobs], device)
    else:
        sizes = torch.zeros(size, dtype=torch.int64, device=device)
    # One broadcast of every size: each rank learns its own size and the max.
    comm.broadcast(sizes, root, async_op=False, timeout=timeout)
    sizes = sizes.tolist()
    max_size = max(sizes)

    output = torch.empty(max_size, dtype=torch.uint8, device=device)
    if rank == root:
        inputs = [_bytes_tensor(b, device, max_size) for b in blobs]
    else:
        inputs = []
    comm.scatter(output, inputs, root, async_op=False, timeout=timeout)
    scatter_object_output_list[0] = _deserialize(
        _tensor_bytes(output, sizes[rank]), weights_only
    )


def send_object_list(
    comm,
    object_list: List[Any],
    dst: int,
    timeout: Optional[timedelta] = None,
) -> None:
    """Sends the objects of ``object_list`` to rank ``dst``, which calls
    recv_object_list with a list of the same length."""
    dst = operator.index(dst)
    device = comm.get_device()
    if len(object_list) == 0:
        return
    blobs = [_serialize(o) for o in object_list]
    comm.send(
        _sizes_tensor([len(b) for b in blobs], device), dst, async_op=False, timeout=timeout
    )
    comm.send(_bytes_tensor(b"".join(blobs), device), dst, async_op=False, timeout=timeout)


def recv_object_list(
    comm,
    object_list: List[Any],
    src: int,
    timeout: Optional[timedelta] = None,
    weights_only: bool = True,
) -> None:
    """Receives into ``object_list`` the objects that rank ``src`` sent with
    send_object_list (lists of the same length on both sides)."""
    src = operator.index(src)
    torch = _torch()
    device = comm.get_device()
    n = len(object_list)
    if n == 0:
        return
    sizes = torch.zeros(n, dtype=torch.int64, device=device)
    comm.recv(sizes, src, async_op=False, timeout=timeout)
    sizes = sizes.tolist()
    payload = torch.empty(sum(sizes), dtype=torch.uint8, device=device)
    comm.recv(payload, src, async_op=False, timeout=timeout)
    offset = 0
    for i, s in enumerate(sizes):
        object_list[i] = _deserialize(_tensor_bytes(payload[offset:], s), weights_only)
        offset += s
