"""The Python classes of ``torchcomms._comms``: Timeout, the enums and the
option classes. The extension imports this module when it initialises and
exports every name of ``__all__`` as its own (``torchcomms._comms.CommOptions``
is ``torchcomms._comms_classes.CommOptions``); the classes say they belong to
``torchcomms._comms``, where the stub (``_comms.pyi``) declares them.

It imports neither torch nor the extension: ``DEFAULT_TIMEOUT`` is set by the
extension from the C library's ``TC_DEFAULT_TIMEOUT_S`` before any class is
used (``torchcomms._comms.DEFAULT_TIMEOUT_SECONDS``).
"""
import datetime as _datetime
import enum as _enum

__all__ = ["Timeout", "RedOpType", "WorkStatus", "P2POpType", "CommOptions",
           "SendOptions", "RecvOptions", "BatchP2POptions", "BroadcastOptions",
           "AllReduceOptions", "ReduceOptions", "AllGatherOptions",
           "AllGatherSingleOptions", "ReduceScatterOptions",
           "ReduceScatterSingleOptions", "AllToAllOptions", "AllToAllSingleOptions",
           "AllToAllvSingleOptions", "BarrierOptions", "ScatterOptions",
           "GatherOptions", "_OpOptions"]

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
    '''Options of a communicator (see TorchComm.get_options()).'''
    __slots__ = ('abort_process_on_timeout_or_error', 'timeout',
                 'high_priority_stream', 'store', 'enable_reconfigure',
                 'hints')

    def __init__(self, abort_process_on_timeout_or_error=False,
                 timeout=None, high_priority_stream=False, store=None,
                 enable_reconfigure=False, hints=None):
        self.abort_process_on_timeout_or_error = abort_process_on_timeout_or_error
        self.timeout = DEFAULT_TIMEOUT if timeout is None else timeout
        self.high_priority_stream = high_priority_stream
        self.store = store
        self.enable_reconfigure = enable_reconfigure
        self.hints = {} if hints is None else dict(hints)

    def __repr__(self):
        return ('CommOptions(' + ', '.join(f'{k}={getattr(self, k)!r}'
                for k in self.__slots__) + ')')

    def __eq__(self, other):
        if type(other) is not CommOptions:
            return NotImplemented
        return all(getattr(self, k) == getattr(other, k) for k in self.__slots__)

    __hash__ = None


# They are torchcomms._comms's classes (pickling, reprs, the stub).
for _n in __all__:
    if _n != "Timeout":
        globals()[_n].__module__ = "torchcomms._comms"
del _n
