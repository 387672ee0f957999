"""The Python classes of ``torchcomms._comms``: Timeout, the enums, the
option classes and the hook argument classes. The extension imports this module when it initialises and
exports every name of ``__all__`` as its own (``torchcomms._comms.CommOptions``
is ``torchcomms._comms_classes.CommOptions``); the classes say they belong to
``torchcomms._comms``, where the stub (``_comms.pyi``) declares them.

It imports neither torch nor the extension: ``DEFAULT_TIMEOUT`` is set by the
extension from the C library's ``TC_DEFAULT_TIMEOUT_S`` before any class is
used (``torchcomms._comms.DEFAULT_TIMEOUT_SECONDS``).
"""
import collections as _collections
import datetime as _datetime
import enum as _enum

__all__ = ["Timeout", "RedOpType", "WorkStatus", "P2POpType", "CommOptions",
           "SendOptions", "RecvOptions", "BatchP2POptions", "BroadcastOptions",
           "AllReduceOptions", "ReduceOptions", "AllGatherOptions",
           "AllGatherSingleOptions", "ReduceScatterOptions",
           "ReduceScatterSingleOptions", "AllToAllOptions", "AllToAllSingleOptions",
           "AllToAllvSingleOptions", "BarrierOptions", "ScatterOptions",
           "GatherOptions", "_OpOptions", "OpName", "InitHandle",
           "ReconfigureOptions", "TorchCommWinAccessType", "TorchCommWindowAttr",
           "TorchCommlWinAccessType"]

# The communicator's default timeout (a timedelta); set by torchcomms._comms.
DEFAULT_TIMEOUT = None

Timeout = _datetime.timedelta


class RedOpType(_enum.Enum):
    SUM = 1
    PRODUCT = 2
    MIN = 3
    MAX = 4
    BAND = 5
    BOR = 6
    BXOR = 7
    PREMUL_SUM = 8
    AVG = 9


class WorkStatus(_enum.Enum):
    NOT_STARTED = 1
    INPROGRESS = 2
    COMPLETED = 3
    TIMEDOUT = 4
    ERROR = 5


class P2POpType(_enum.Enum):
    SEND = 1
    RECV = 2


class TorchCommWinAccessType(_enum.Enum):
    """How a peer's window memory is reached (TorchCommWindow.get_attr):
    UNIFIED: mapped in this process (same host, shared memory):
    map_remote_tensor gives a tensor over it; SEPARATE: only through put
    and get (another host, or TCP)."""
    WIN_ACCESS_TYPE_UNIFIED = 0
    WIN_ACCESS_TYPE_SEPARATE = 1


# torchcomms' older spelling (its docstrings still use it)
TorchCommlWinAccessType = TorchCommWinAccessType


class TorchCommWindowAttr:
    """Attributes of a peer's window (TorchCommWindow.get_attr)."""
    __slots__ = ("access_type",)

    def __init__(self):
        self.access_type = TorchCommWinAccessType.WIN_ACCESS_TYPE_UNIFIED

    def __repr__(self):
        return f"TorchCommWindowAttr(access_type={self.access_type})"


class _OpOptions:
    '''Per-operation options: timeout (timedelta(0): the communicator's)
    and backend hints.'''
    __slots__ = ('timeout', 'hints')

    def __init__(self, timeout=None, hints=None):
        self.timeout = _datetime.timedelta(0) if timeout is None else timeout
        self.hints = {} if hints is None else dict(hints)

    def __repr__(self):
        return f'{type(self).__name__}(timeout={self.timeout!r}, hints={self.hints!r})'

    def __eq__(self, other):
        if type(other) is not type(self):
            return NotImplemented
        return self.timeout == other.timeout and self.hints == other.hints

    __hash__ = None


_op_options = ('SendOptions', 'RecvOptions', 'BatchP2POptions',
               'BroadcastOptions', 'AllReduceOptions', 'ReduceOptions',
               'AllGatherOptions', 'AllGatherSingleOptions', 'ReduceScatterOptions',
               'ReduceScatterSingleOptions', 'AllToAllOptions',
               'AllToAllSingleOptions', 'AllToAllvSingleOptions', 'BarrierOptions',
               'ScatterOptions', 'GatherOptions')
for _n in _op_options:
    globals()[_n] = type(_n, (_OpOptions,), {'__slots__': (), '__qualname__': _n})
del _n


class CommOptions:
    '''Options of a communicator (see TorchComm.get_options()). ``name``
    is the communicator's name (torchcomms' earlier CommOptions field;
    "" in a CommOptions made here, the name given to new_comm or split in
    get_options()).'''
    __slots__ = ('abort_process_on_timeout_or_error', 'timeout',
                 'high_priority_stream', 'store', 'enable_reconfigure',
                 'hints', 'name')

    def __init__(self, abort_process_on_timeout_or_error=False,
                 timeout=None, high_priority_stream=False, store=None,
                 enable_reconfigure=False, hints=None, name=''):
        self.abort_process_on_timeout_or_error = abort_process_on_timeout_or_error
        self.timeout = DEFAULT_TIMEOUT if timeout is None else timeout
        self.high_priority_stream = high_priority_stream
        self.store = store
        self.enable_reconfigure = enable_reconfigure
        self.hints = {} if hints is None else dict(hints)
        self.name = name

    def __repr__(self):
        return ('CommOptions(' + ', '.join(f'{k}={getattr(self, k)!r}'
                for k in self.__slots__) + ')')

    def __eq__(self, other):
        if type(other) is not CommOptions:
            return NotImplemented
        return all(getattr(self, k) == getattr(other, k) for k in self.__slots__)

    __hash__ = None


# An init handle (TorchComm.get_init_handle(), TorchComm.reconfigure()) is a
# str, as in torchcomms.
InitHandle = str


class ReconfigureOptions:
    """The arguments of a reconfiguration (torchcomms' ReconfigureOptions):
    ``uuid`` (int, the same on every member, used once), ``init_handles``
    (list: rank i is the i-th handle; or a set), ``timeout`` (timedelta or
    None: the communicator's) and ``hints``.
    ``comm.reconfigure(o.uuid, o.init_handles, o.timeout, o.hints)``."""
    __slots__ = ('uuid', 'init_handles', 'timeout', 'hints')

    def __init__(self, uuid=0, init_handles=None, timeout=None, hints=None):
        self.uuid = uuid
        self.init_handles = [] if init_handles is None else init_handles
        self.timeout = timeout
        self.hints = {} if hints is None else dict(hints)

    def __repr__(self):
        return ('ReconfigureOptions(' + ', '.join(f'{k}={getattr(self, k)!r}'
                for k in self.__slots__) + ')')

    def __eq__(self, other):
        if type(other) is not ReconfigureOptions:
            return NotImplemented
        return all(getattr(self, k) == getattr(other, k) for k in self.__slots__)

    __hash__ = None


class OpName(_enum.Enum):
    """The operation a pre hook is called for (``str(OpName.all_reduce)`` is
    ``"OpName.all_reduce"``). The values are torchcomms' C++ enum values;
    ``batch_op_issue`` (BatchSendRecv.issue), which torchcomms' Python binding
    does not expose, is ours and listed last."""
    send = 0
    recv = 1
    broadcast = 2
    all_reduce = 3
    reduce = 4
    all_gather = 5
    all_gather_v = 6
    all_gather_single = 7
    reduce_scatter = 8
    reduce_scatter_v = 9
    reduce_scatter_single = 10
    all_to_all_single = 11
    all_to_all_v_single = 12
    all_to_all = 13
    barrier = 14
    scatter = 15
    gather = 16
    gather_single = 17
    split = 18
    new_window = 19
    finalize = 21
    batch_op_issue = 20


# ---- hook arguments --------------------------------------------------------
# Pre hooks get one of these (read-only fields, the caller's own tensor
# objects; lists are new lists of them). They are named tuples: the extension
# builds them only while a pre hook is registered.
_PRE_HOOK_ARGS = {
    # op name: (class name, fields)
    "send": ("SendPreHookArgs", "tensor peer async_op"),
    "recv": ("RecvPreHookArgs", "tensor peer async_op"),
    "broadcast": ("BroadcastPreHookArgs", "tensor root async_op"),
    "all_reduce": ("AllReducePreHookArgs", "tensor async_op"),
    "reduce": ("ReducePreHookArgs", "tensor root async_op"),
    "all_gather": ("AllGatherPreHookArgs", "input output async_op"),
    "all_gather_v": ("AllGatherVPreHookArgs", "input output async_op"),
    "all_gather_single": ("AllGatherSinglePreHookArgs", "input output async_op"),
    "reduce_scatter": ("ReduceScatterPreHookArgs", "input output async_op"),
    "reduce_scatter_v": ("ReduceScatterVPreHookArgs", "input output async_op"),
    "reduce_scatter_single": ("ReduceScatterSinglePreHookArgs", "input output async_op"),
    "all_to_all_single": ("AllToAllSinglePreHookArgs", "input output async_op"),
    "all_to_all_v_single": ("AllToAllVSinglePreHookArgs",
                            "input output input_split_sizes output_split_sizes async_op"),
    "all_to_all": ("AllToAllPreHookArgs", "input output async_op"),
    "barrier": ("BarrierPreHookArgs", "async_op"),
    "scatter": ("ScatterPreHookArgs", "output input root async_op"),
    "gather": ("GatherPreHookArgs", "input output root async_op"),
    "gather_single": ("GatherSinglePreHookArgs", "input output root async_op"),
    "split": ("SplitPreHookArgs", "ranks name"),
    "new_window": ("NewWindowPreHookArgs", ""),
    "batch_op_issue": ("BatchOpIssuePreHookArgs", "num_ops async_op"),
    "finalize": ("FinalizePreHookArgs", ""),
}
# op name -> class (the extension reads this)
PRE_HOOK_ARGS_BY_OP = {}
for _op, (_n, _f) in _PRE_HOOK_ARGS.items():
    _cls = _collections.namedtuple(_n, _f.split(), module="torchcomms._comms")
    _cls.__doc__ = f"The arguments of {_op} given to pre hooks (read-only)."
    globals()[_n] = _cls
    PRE_HOOK_ARGS_BY_OP[_op] = _cls
    __all__.append(_n)
del _op, _n, _f, _cls


class CollectivePostHookArgs:
    """What post hooks get for a collective or point-to-point operation
    (no attributes, as in torchcomms' Python binding)."""
    __slots__ = ()

    def __repr__(self):
        return f"{type(self).__name__}()"


class SplitPostHookArgs:
    """What post hooks get after a split that made a communicator."""
    __slots__ = ()
    __repr__ = CollectivePostHookArgs.__repr__


class NewWindowPostHookArgs:
    """What post hooks get after new_window."""
    __slots__ = ()
    __repr__ = CollectivePostHookArgs.__repr__


class BatchOpIssuePostHookArgs:
    """What post hooks get after BatchSendRecv.issue."""
    __slots__ = ()
    __repr__ = CollectivePostHookArgs.__repr__


class FinalizePostHookArgs:
    """What post hooks get after finalize."""
    __slots__ = ()
    __repr__ = CollectivePostHookArgs.__repr__


__all__ += ["CollectivePostHookArgs", "SplitPostHookArgs", "NewWindowPostHookArgs",
            "BatchOpIssuePostHookArgs", "FinalizePostHookArgs"]

# One post-hook argument class per collective and point-to-point operation,
# each a CollectivePostHookArgs (torchcomms' SendPostHookArgs, ...); op name
# -> class (the extension reads this).
POST_HOOK_ARGS_BY_OP = {"split": SplitPostHookArgs, "new_window": NewWindowPostHookArgs,
                        "batch_op_issue": BatchOpIssuePostHookArgs,
                        "finalize": FinalizePostHookArgs}
for _op, (_n, _f) in _PRE_HOOK_ARGS.items():
    if _op in POST_HOOK_ARGS_BY_OP:
        continue
    _n = _n.replace("PreHookArgs", "PostHookArgs")
    _cls = type(_n, (CollectivePostHookArgs,), {
        "__slots__": (), "__doc__": f"What post hooks get after {_op} (no attributes)."})
    globals()[_n] = _cls
    POST_HOOK_ARGS_BY_OP[_op] = _cls
    __all__.append(_n)
del _op, _n, _f, _cls
# Backends written in Python (_backend_base.py).
from torchcomms._backend_base import (  # noqa: E402
    TorchCommBackend, _NativeBackend, _BackendNotFoundError)
__all__ += ["TorchCommBackend", "_NativeBackend", "_BackendNotFoundError"]


# They are torchcomms._comms's classes (pickling, reprs, the stub).
for _n in __all__:
    if _n not in ("Timeout", "InitHandle"):
        globals()[_n].__module__ = "torchcomms._comms"
del _n
