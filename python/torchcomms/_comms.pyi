# Stubs for torchcomms._comms (the C extension over libtorchcomms).
# Names, argument order and defaults follow meta-pytorch/torchcomms'
# comms/torchcomms/_comms.pyi for the surface implemented here.

from datetime import timedelta
from enum import Enum
from typing import Any, Callable, Dict, List, NamedTuple, Sequence, Set, Union

__version__: str
__all__: List[str]
# The communicator's default timeout in seconds (C: TC_DEFAULT_TIMEOUT_S);
# CommOptions().timeout is timedelta(seconds=DEFAULT_TIMEOUT_SECONDS).
DEFAULT_TIMEOUT_SECONDS: float

Timeout = timedelta
InitHandle = str

class RedOpType(Enum):
    SUM = 1
    PRODUCT = 2
    MIN = 3
    MAX = 4
    BAND = 5
    BOR = 6
    BXOR = 7
    PREMUL_SUM = 8
    AVG = 9

class ReduceOp:
    SUM: ReduceOp
    PRODUCT: ReduceOp
    MIN: ReduceOp
    MAX: ReduceOp
    BAND: ReduceOp
    BOR: ReduceOp
    BXOR: ReduceOp
    AVG: ReduceOp
    def __init__(self, type: RedOpType | ReduceOp) -> None: ...
    @staticmethod
    def PREMUL_SUM(factor: Any) -> ReduceOp:
        """factor: a float or a one-element tensor."""
    @property
    def type(self) -> RedOpType: ...
    def __eq__(self, other: object) -> bool: ...
    def __hash__(self) -> int: ...

class WorkStatus(Enum):
    NOT_STARTED = 1
    INPROGRESS = 2
    COMPLETED = 3
    TIMEDOUT = 4
    ERROR = 5

class P2POpType(Enum):
    SEND = 1
    RECV = 2

class ReconfigureOptions:
    """Options of a reconfiguration (fault tolerance); see
    TorchComm.reconfigure."""
    uuid: int
    init_handles: List[InitHandle] | Set[InitHandle]
    timeout: timedelta | None
    hints: Dict[str, str]
    def __init__(
        self,
        uuid: int = 0,
        init_handles: List[InitHandle] | Set[InitHandle] | None = None,
        timeout: timedelta | None = None,
        hints: Dict[str, str] | None = None,
    ) -> None: ...

class CommOptions:
    abort_process_on_timeout_or_error: bool
    timeout: timedelta
    high_priority_stream: bool
    store: Any
    enable_reconfigure: bool
    hints: Dict[str, str]
    # the communicator's name (torchcomms' earlier field): "" here, the name
    # given to new_comm / split in TorchComm.get_options()
    name: str
    def __init__(
        self,
        abort_process_on_timeout_or_error: bool = False,
        timeout: timedelta | None = None,
        high_priority_stream: bool = False,
        store: Any = None,
        enable_reconfigure: bool = False,
        hints: Dict[str, str] | None = None,
        name: str = "",
    ) -> None: ...

class _OpOptions:
    timeout: timedelta
    hints: Dict[str, str]
    def __init__(
        self, timeout: timedelta | None = None, hints: Dict[str, str] | None = None
    ) -> None: ...

class SendOptions(_OpOptions): ...
class RecvOptions(_OpOptions): ...
class BatchP2POptions(_OpOptions): ...
class BroadcastOptions(_OpOptions): ...
class AllReduceOptions(_OpOptions): ...
class ReduceOptions(_OpOptions): ...
class AllGatherOptions(_OpOptions): ...
class AllGatherSingleOptions(_OpOptions): ...
class ReduceScatterOptions(_OpOptions): ...
class ReduceScatterSingleOptions(_OpOptions): ...
class AllToAllOptions(_OpOptions): ...
class AllToAllSingleOptions(_OpOptions): ...
class AllToAllvSingleOptions(_OpOptions): ...
class BarrierOptions(_OpOptions): ...
class ScatterOptions(_OpOptions): ...
class GatherOptions(_OpOptions): ...

class TorchWork:
    def is_completed(self) -> bool:
        """True once the operation finished (also when it failed)."""
    def wait(self) -> None:
        """Blocks with the GIL released; RuntimeError if the operation failed."""
    def wait_blocking(self) -> None:
        """RuntimeError "[TorchWork]: waitBlocking not implemented for this
        work type", as torchcomms for a backend without fault tolerance; the
        work is untouched (wait() still works)."""
    def _set_status(self, status: WorkStatus) -> None:
        """RuntimeError "_set_status is only supported on Python-created work
        objects" (every TorchWork here is the library's); TypeError for a
        non-WorkStatus."""
    def status(self) -> WorkStatus: ...

class MemAllocator:
    """The cpu backend's allocator (get_mem_allocator): torch.cuda.MemPool
    does not take it (CPU has no memory pools)."""
    @property
    def backend(self) -> str: ...
    @property
    def device(self) -> Any: ...
    def empty(self, size: int | Sequence[int], dtype: Any = None) -> Any:
        """A CPU tensor over page-aligned, zero-filled memory of its own
        (released with the tensor's storage)."""

def get_mem_allocator(backend: str) -> MemAllocator:
    """One allocator per backend: "cpu" (and "gloo", "torchcomms") ->
    MemAllocator; others: RuntimeError "No allocator factory registered for
    backend: <name>"."""

class P2POp:
    type: P2POpType
    tensor: Any
    peer: int
    def __init__(self, type: P2POpType, tensor: Any, peer: int) -> None: ...

class BatchSendRecv:
    ops: List[P2POp]
    def send(self, tensor: Any, dst: int) -> None: ...
    def recv(self, tensor: Any, src: int) -> None: ...
    def issue(
        self,
        async_op: bool = False,
        options: BatchP2POptions | None = None,
        hints: Dict[str, str] | None = None,
        timeout: timedelta | float | None = None,
    ) -> TorchWork: ...

# ---- hooks (TorchComm.register_pre_hook / _post_hook / _abort_hook) ----

class OpName(Enum):
    """str(OpName.all_reduce) == "OpName.all_reduce". Values: torchcomms'
    C++ enum; batch_op_issue (BatchSendRecv.issue) is ours, listed last."""
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

class RemovableHandle:
    def remove(self) -> None:
        """Unregisters the hook; idempotent; nothing once the communicator
        is gone. Dropping the handle does not unregister."""

# pre-hook arguments: named tuples of the caller's own objects (read-only)
class SendPreHookArgs(NamedTuple):
    tensor: Any
    peer: int
    async_op: bool
class RecvPreHookArgs(NamedTuple):
    tensor: Any
    peer: int
    async_op: bool
class BroadcastPreHookArgs(NamedTuple):
    tensor: Any
    root: int
    async_op: bool
class AllReducePreHookArgs(NamedTuple):
    tensor: Any
    async_op: bool
class ReducePreHookArgs(NamedTuple):
    tensor: Any
    root: int
    async_op: bool
class AllGatherPreHookArgs(NamedTuple):
    input: Any
    output: List[Any]
    async_op: bool
class AllGatherVPreHookArgs(NamedTuple):
    input: Any
    output: List[Any]
    async_op: bool
class AllGatherSinglePreHookArgs(NamedTuple):
    input: Any
    output: Any
    async_op: bool
class ReduceScatterPreHookArgs(NamedTuple):
    input: List[Any]
    output: Any
    async_op: bool
class ReduceScatterVPreHookArgs(NamedTuple):
    input: List[Any]
    output: Any
    async_op: bool
class ReduceScatterSinglePreHookArgs(NamedTuple):
    input: Any
    output: Any
    async_op: bool
class AllToAllSinglePreHookArgs(NamedTuple):
    input: Any
    output: Any
    async_op: bool
class AllToAllVSinglePreHookArgs(NamedTuple):
    input: Any
    output: Any
    input_split_sizes: List[int]
    output_split_sizes: List[int]
    async_op: bool
class AllToAllPreHookArgs(NamedTuple):
    input: List[Any]
    output: List[Any]
    async_op: bool
class BarrierPreHookArgs(NamedTuple):
    async_op: bool
class ScatterPreHookArgs(NamedTuple):
    output: Any
    input: List[Any]
    root: int
    async_op: bool
class GatherPreHookArgs(NamedTuple):
    input: Any
    output: List[Any]
    root: int
    async_op: bool
class GatherSinglePreHookArgs(NamedTuple):
    input: Any
    output: Any
    root: int
    async_op: bool
class SplitPreHookArgs(NamedTuple):
    ranks: List[int]
    name: str
class NewWindowPreHookArgs(NamedTuple): ...
class BatchOpIssuePreHookArgs(NamedTuple):
    num_ops: int
    async_op: bool
class FinalizePreHookArgs(NamedTuple): ...

PreHookArgs = Union[
    SendPreHookArgs, RecvPreHookArgs, BroadcastPreHookArgs, AllReducePreHookArgs,
    ReducePreHookArgs, AllGatherPreHookArgs, AllGatherVPreHookArgs,
    AllGatherSinglePreHookArgs, ReduceScatterPreHookArgs, ReduceScatterVPreHookArgs,
    ReduceScatterSinglePreHookArgs, AllToAllSinglePreHookArgs, AllToAllVSinglePreHookArgs,
    AllToAllPreHookArgs, BarrierPreHookArgs, ScatterPreHookArgs, GatherPreHookArgs,
    GatherSinglePreHookArgs, SplitPreHookArgs, NewWindowPreHookArgs,
    BatchOpIssuePreHookArgs, FinalizePreHookArgs,
]

# post-hook arguments: no attributes; each collective and p2p operation gets
# its own <Op>PostHookArgs, a CollectivePostHookArgs
class CollectivePostHookArgs: ...
class SendPostHookArgs(CollectivePostHookArgs): ...
class RecvPostHookArgs(CollectivePostHookArgs): ...
class BroadcastPostHookArgs(CollectivePostHookArgs): ...
class AllReducePostHookArgs(CollectivePostHookArgs): ...
class ReducePostHookArgs(CollectivePostHookArgs): ...
class AllGatherPostHookArgs(CollectivePostHookArgs): ...
class AllGatherVPostHookArgs(CollectivePostHookArgs): ...
class AllGatherSinglePostHookArgs(CollectivePostHookArgs): ...
class ReduceScatterPostHookArgs(CollectivePostHookArgs): ...
class ReduceScatterVPostHookArgs(CollectivePostHookArgs): ...
class ReduceScatterSinglePostHookArgs(CollectivePostHookArgs): ...
class AllToAllSinglePostHookArgs(CollectivePostHookArgs): ...
class AllToAllVSinglePostHookArgs(CollectivePostHookArgs): ...
class AllToAllPostHookArgs(CollectivePostHookArgs): ...
class BarrierPostHookArgs(CollectivePostHookArgs): ...
class ScatterPostHookArgs(CollectivePostHookArgs): ...
class GatherPostHookArgs(CollectivePostHookArgs): ...
class GatherSinglePostHookArgs(CollectivePostHookArgs): ...
class SplitPostHookArgs: ...
class NewWindowPostHookArgs: ...
class BatchOpIssuePostHookArgs: ...
class FinalizePostHookArgs: ...

PostHookArgs = Union[CollectivePostHookArgs, SplitPostHookArgs, NewWindowPostHookArgs,
                     BatchOpIssuePostHookArgs, FinalizePostHookArgs]  # + the subclasses above

_Timeout = timedelta | float | None
_Hints = Dict[str, str] | None

class TorchCommWinAccessType(Enum):
    WIN_ACCESS_TYPE_UNIFIED = 0
    WIN_ACCESS_TYPE_SEPARATE = 1

TorchCommlWinAccessType = TorchCommWinAccessType  # torchcomms' older spelling

class TorchCommWindowAttr:
    access_type: TorchCommWinAccessType
    def __init__(self) -> None: ...

class TorchCommWindow:
    """A one-sided window (TorchComm.new_window). tensor_register moves the
    tensor onto window memory the library allocates (shared memory on one
    host), so the tensor itself reads what peers put."""
    @property
    def dtype(self) -> Any: ...
    @property
    def shape(self) -> List[int]: ...
    @property
    def device(self) -> Any: ...
    @property
    def comm(self) -> TorchComm: ...
    def get_size(self) -> int: ...
    def get_tensor(self) -> Any | None: ...
    def tensor_register(self, tensor: Any, owning: bool = True, *,
                        hints: _Hints = None, timeout: _Timeout = None) -> None: ...
    def tensor_deregister(self) -> None: ...
    def put(self, tensor: Any, dst_rank: int, target_offset_nelems: int, async_op: bool,
            hints: _Hints = None, timeout: _Timeout = None) -> TorchWork: ...
    def get(self, tensor: Any, src_rank: int, source_offset_nelems: int, async_op: bool,
            hints: _Hints = None, timeout: _Timeout = None) -> TorchWork:
        """Not in torchcomms: reads src_rank's window into tensor."""
    def signal(self, dst_rank: int, async_op: bool, hints: _Hints = None,
               timeout: _Timeout = None) -> TorchWork: ...
    def wait_signal(self, peer_rank: int, async_op: bool, hints: _Hints = None,
                    timeout: _Timeout = None) -> TorchWork: ...
    def flush(self, peer_rank: int = -1, async_op: bool = False, hints: _Hints = None,
              timeout: _Timeout = None) -> TorchWork:
        """Not in torchcomms: every put to peer_rank (-1: all) is in place."""
    def fence(self, hints: _Hints = None, timeout: _Timeout = None) -> None:
        """Not in torchcomms: collective; every rank's earlier puts are in
        place everywhere (MPI_Win_fence)."""
    def map_remote_tensor(self, rank: int) -> Any: ...
    def get_attr(self, peer_rank: int) -> TorchCommWindowAttr: ...
    def get_device_window(self, signal_count: int = -1, counter_count: int = -1,
                          barrier_count: int = 1) -> int:
        """GPU-only in torchcomms: RuntimeError on the cpu backend."""
    def register_local_buffer(self, tensor: Any) -> Any:
        """GPU-only in torchcomms: RuntimeError on the cpu backend."""
    def deregister_local_buffer(self, handle: Any) -> None:
        """GPU-only in torchcomms: RuntimeError on the cpu backend."""
    def __copy__(self) -> TorchCommWindow: ...
    def __deepcopy__(self, memo: Dict[int, Any]) -> TorchCommWindow: ...

class TorchComm:
    @property
    def rank(self) -> int: ...
    @property
    def size(self) -> int: ...
    @property
    def name(self) -> str: ...
    def finalize(self) -> None: ...
    def abort(self) -> None: ...
    def is_aborted(self) -> bool: ...
    def is_abort_supported(self) -> bool:
        """True: abort() stops pending operations at once and leaves the
        process usable (cpu backend)."""
    def get_init_handle(self) -> InitHandle:
        """This communicator's endpoint, for reconfigure (only with
        enable_reconfigure=True; RuntimeError otherwise)."""
    def reconfigure(
        self,
        uuid: int,
        init_handles: List[InitHandle] | Set[InitHandle] | Dict[InitHandle, int],
        timeout: timedelta | None = None,
        hints: Dict[str, str] | None = None,
    ) -> TorchWork:
        """Makes this communicator the group of init_handles (list: rank i
        is the i-th handle; set: sorted; dict: handle -> rank). Every member
        calls it with the same uuid and handles; blocks until the group is
        connected and returns a completed work; RuntimeError naming the
        member that disagrees or could not be reached (the communicator is
        then unconfigured; retry with a new uuid). Requires
        enable_reconfigure=True (docs/fault_tolerance.md)."""
    def set_timeout(self, timeout: timedelta | float) -> None: ...
    def set_hints(self, hints: Dict[str, str]) -> None:
        """Adds or replaces the communicator's hints (other keys kept):
        get_options().hints and later splits without hints see them. Not in
        torchcomms' Python API (MCCL's C++ setHints); the cpu backend reads
        no hint after init."""
    def get_rank(self) -> int: ...
    def get_size(self) -> int: ...
    def get_name(self) -> str: ...
    def get_options(self) -> CommOptions: ...
    def get_device(self) -> Any: ...
    def get_backend(self) -> str: ...
    def get_backend_version(self) -> str: ...
    def get_backend_impl(self) -> TorchCommBackend:
        """The TorchCommBackend instance new_comm made for a backend written
        in Python; for a C backend a description of it (_NativeBackend:
        get_backend_name, get_backend_version, get_comm_name, get_rank,
        get_size). The same object on every call."""
    def unsafe_get_backend(self) -> TorchCommBackend:
        """Deprecated (DeprecationWarning): get_backend_impl()."""
    def send(
        self, tensor: Any, dst: int, async_op: bool = False,
        hints: _Hints = None, timeout: _Timeout = None,
    ) -> TorchWork: ...
    def recv(
        self, tensor: Any, src: int, async_op: bool = False,
        hints: _Hints = None, timeout: _Timeout = None,
    ) -> TorchWork: ...
    def broadcast(
        self, tensor: Any, root: int, async_op: bool = False,
        hints: _Hints = None, timeout: _Timeout = None,
    ) -> TorchWork: ...
    def all_reduce(
        self, tensor: Any, op: ReduceOp = ..., async_op: bool = False,
        hints: _Hints = None, timeout: _Timeout = None,
    ) -> TorchWork: ...
    def reduce(
        self, tensor: Any, root: int, op: ReduceOp = ..., async_op: bool = False,
        hints: _Hints = None, timeout: _Timeout = None,
    ) -> TorchWork: ...
    def all_gather(
        self, tensor_list: Sequence[Any], tensor: Any, async_op: bool = False,
        hints: _Hints = None, timeout: _Timeout = None,
    ) -> TorchWork: ...
    def all_gather_v(
        self, tensor_list: Sequence[Any], tensor: Any, async_op: bool = False,
        hints: _Hints = None, timeout: _Timeout = None,
    ) -> TorchWork: ...
    def all_gather_single(
        self, output: Any, input: Any, async_op: bool = False,
        hints: _Hints = None, timeout: _Timeout = None,
    ) -> TorchWork: ...
    def reduce_scatter(
        self, output: Any, input_list: Sequence[Any], op: ReduceOp = ...,
        async_op: bool = False, hints: _Hints = None, timeout: _Timeout = None,
    ) -> TorchWork: ...
    def reduce_scatter_v(
        self, output: Any, input_list: Sequence[Any], op: ReduceOp = ...,
        async_op: bool = False, hints: _Hints = None, timeout: _Timeout = None,
    ) -> TorchWork: ...
    def reduce_scatter_single(
        self, output: Any, input: Any, op: ReduceOp = ..., async_op: bool = False,
        hints: _Hints = None, timeout: _Timeout = None,
    ) -> TorchWork: ...
    def all_to_all_single(
        self, output: Any, input: Any, async_op: bool = False,
        hints: _Hints = None, timeout: _Timeout = None,
    ) -> TorchWork: ...
    def all_to_all_v_single(
        self, output: Any, input: Any, output_split_sizes: Sequence[int],
        input_split_sizes: Sequence[int], async_op: bool = False,
        hints: _Hints = None, timeout: _Timeout = None,
    ) -> TorchWork:
        """Split sizes count rows of dim 0; [] means equal splits."""
    def all_to_all(
        self, output_tensor_list: Sequence[Any], input_tensor_list: Sequence[Any],
        async_op: bool = False, hints: _Hints = None, timeout: _Timeout = None,
    ) -> TorchWork: ...
    def barrier(
        self, async_op: bool = False, hints: _Hints = None, timeout: _Timeout = None,
    ) -> TorchWork: ...
    def scatter(
        self, output_tensor: Any, input_tensor_list: Sequence[Any], root: int,
        async_op: bool = False, hints: _Hints = None, timeout: _Timeout = None,
    ) -> TorchWork: ...
    def gather(
        self, output_tensor_list: Sequence[Any], input_tensor: Any, root: int,
        async_op: bool = False, hints: _Hints = None, timeout: _Timeout = None,
    ) -> TorchWork: ...
    def gather_single(
        self, output: Any, input: Any, root: int, async_op: bool = False,
        hints: _Hints = None, timeout: _Timeout = None,
    ) -> TorchWork: ...
    def split(
        self, ranks: Sequence[int], name: str, hints: _Hints = None,
        timeout: _Timeout = None,
    ) -> TorchComm | None:
        """Collective over every rank. RuntimeError on every rank when any
        rank's list is refused (duplicates, out of range, the caller missing
        from a non-empty list) or members pass different lists."""
    def tensor_register(self, tensor: Any) -> None:
        """Validates and records the tensor's memory (nothing is pinned on
        the cpu backend); counted, until tensor_deregister or finalize."""
    def tensor_deregister(self, tensor: Any) -> None:
        """Undoes one tensor_register; RuntimeError if not registered."""
    def _registered(self) -> Dict[int, tuple]: ...
    def get_mem_allocator(self) -> MemAllocator: ...
    @property
    def mem_allocator(self) -> MemAllocator:
        """Deprecated alias of get_mem_allocator() (as in torchcomms)."""
    def batch_op_create(self) -> BatchSendRecv: ...
    def new_window(self, tensor: Any | None = None) -> TorchCommWindow:
        """A one-sided window on this communicator; with a tensor,
        tensor_register(tensor) right away (collective). Runs the pre and
        post hooks (OpName.new_window)."""
    def register_pre_hook(
        self, callback: Callable[[OpName, int, PreHookArgs], None]
    ) -> RemovableHandle:
        """callback(name, op_id, args) on the calling thread before every
        operation (after its arguments were checked); its exception
        propagates and the operation is not issued. op_id: the C core's
        number of the operation (2**64-1 for finalize)."""
    def register_post_hook(
        self, callback: Callable[[int, PostHookArgs], None]
    ) -> RemovableHandle:
        """callback(op_id, args) right after every operation was issued
        (synchronous ones: finished); exceptions go to sys.unraisablehook."""
    def register_abort_hook(self, callback: Callable[[], None]) -> RemovableHandle:
        """callback() before the communicator aborts: abort(), or before the
        process aborts on a failed operation (abort_process_on_timeout_or_error)."""
    def _register_split_hook(self, callback: Callable[[TorchComm], None]) -> RemovableHandle: ...
    def _fr_reserve(self, n: int) -> None: ...
    def _fr_dump_json(self, include_completed: bool = True) -> str: ...
    def _fr_size(self) -> int: ...
    def _fr_reset(self) -> None: ...
    def _next_op_id(self) -> int: ...
    # aliases
    allreduce = all_reduce
    allgather = all_gather
    allgather_v = all_gather_v
    allgather_single = all_gather_single
    reducescatter = reduce_scatter
    reducescatter_v = reduce_scatter_v
    reducescatter_single = reduce_scatter_single
    alltoall = all_to_all
    alltoall_single = all_to_all_single
    alltoallv_single = all_to_all_v_single

def new_comm(
    backend: str,
    device: Any,
    name: str | None = None,
    abort_process_on_timeout_or_error: bool | None = None,
    timeout: timedelta | float | None = None,
    high_priority_stream: bool | None = None,
    store: Any | None = None,
    enable_reconfigure: bool = False,
    hints: Dict[str, str] | None = None,
    *,
    rank: int | None = None,
    size: int | None = None,
) -> TorchComm:
    """Rank and size come from the environment, unless `rank` and `size`
    (ours, keyword-only, given together) say otherwise: a communicator over
    some of the job's processes (torch.distributed.new_group over the
    "torchcomms" c10d backend). On device cpu, the c10d backend names "gloo"
    and "torchcomms" select the native "cpu" backend (torch.distributed's
    use_torchcomms path passes them). torchcomms' argument order; its
    earlier order (abort, timeout, store, name, ... after device) is taken
    when the third positional argument is not a str."""

class TorchCommBackend:
    """Base class of a backend written in Python (register_backend). Every
    method but set_timeout and gather_single raises RuntimeError('Tried to
    call pure virtual function "TorchCommBackend::<name>"') until overridden.
    Operations take torchcomms' arguments without hints/timeout, end with
    async_op, and return None or an object with wait()."""
    def __init__(self) -> None: ...
    def init(self, device: Any, name: str, options: CommOptions) -> None: ...
    def finalize(self) -> None: ...
    def get_rank(self) -> int: ...
    def get_size(self) -> int: ...
    def get_backend_name(self) -> str: ...
    def get_comm_name(self) -> str: ...
    def set_timeout(self, timeout: timedelta) -> None: ...
    def send(self, tensor: Any, dst: int, async_op: bool) -> Any: ...
    def recv(self, tensor: Any, src: int, async_op: bool) -> Any: ...
    def broadcast(self, tensor: Any, root: int, async_op: bool) -> Any: ...
    def all_reduce(self, tensor: Any, op: ReduceOp, async_op: bool) -> Any: ...
    def reduce(self, tensor: Any, root: int, op: ReduceOp, async_op: bool) -> Any: ...
    def all_gather(self, tensor_list: List[Any], tensor: Any, async_op: bool) -> Any: ...
    def all_gather_v(self, tensor_list: List[Any], tensor: Any, async_op: bool) -> Any: ...
    def all_gather_single(self, output: Any, input: Any, async_op: bool) -> Any: ...
    def reduce_scatter(
        self, output: Any, input_list: List[Any], op: ReduceOp, async_op: bool) -> Any: ...
    def reduce_scatter_v(
        self, output: Any, input_list: List[Any], op: ReduceOp, async_op: bool) -> Any: ...
    def reduce_scatter_single(
        self, output: Any, input: Any, op: ReduceOp, async_op: bool) -> Any: ...
    def all_to_all_single(self, output: Any, input: Any, async_op: bool) -> Any: ...
    def all_to_all_v_single(
        self, output: Any, input: Any, output_split_sizes: List[int],
        input_split_sizes: List[int], async_op: bool) -> Any: ...
    def all_to_all(
        self, output_tensor_list: List[Any], input_tensor_list: List[Any],
        async_op: bool) -> Any: ...
    def barrier(self, async_op: bool) -> Any: ...
    def scatter(
        self, output_tensor: Any, input_tensor_list: List[Any], root: int,
        async_op: bool) -> Any: ...
    def gather(
        self, output_tensor_list: List[Any], input_tensor: Any, root: int,
        async_op: bool) -> Any: ...
    def gather_single(self, output: Any, input: Any, root: int, async_op: bool) -> Any: ...
    def split(self, ranks: List[int], name: str, options: CommOptions) -> TorchCommBackend | None: ...

def register_backend(name: str, backend_class: type[TorchCommBackend]) -> None:
    """new_comm(name, ...) then runs backend_class (instantiated with no
    arguments per communicator) behind the C core. The first registration of
    a name stays (another class: RuntimeWarning, ignored); a registration
    wins over an entry point and a C plugin of that name."""

def _is_backend_registered(name: str) -> bool:
    """True once a class is registered under name in this process."""

def _registered_backend(name: str) -> type[TorchCommBackend] | None: ...

class _NativeBackend(TorchCommBackend):
    def get_backend_version(self) -> str: ...

class _BackendNotFoundError(ModuleNotFoundError, RuntimeError):
    """What new_comm raises for a name nothing provides."""

def _store_call(
    store: Any, op: str, key: str | Sequence[str], arg: Any = None, timeout: float = 1.0
) -> Any:
    """Test hook: one C store call (set/get/add/check/wait/delete) on a Python
    store through the adapter new_comm(store=...) uses."""

def _fr_dump_file(path: str | None = None) -> str:
    """Writes the flight recorder trace of every live communicator (torch's
    pickled dump) to path (None: <TORCH_FR_DUMP_TEMP_FILE><global rank>);
    returns the path written."""

class _BackendWrapper:
    """torch.distributed's process group over a TorchComm (what torch 2.13
    imports as ``from torchcomms._comms import _BackendWrapper``). Defined in
    torchcomms._backend_wrapper (a torch ProcessGroup subclass) and resolved
    here on first access, which imports torch; see docs/python_api.md ("The c10d wrapper")."""
    def __init__(self, comm: TorchComm, store: Any | None = None) -> None: ...
    def get_comm(self) -> TorchComm: ...
    @property
    def supports_coalescing(self) -> bool: ...
    def _start_coalescing(self, device: Any = None) -> None: ...
    def _end_coalescing(self, device: Any = None) -> Any: ...
    def monitored_barrier(
        self, timeout: timedelta | float | None = None, wait_all_ranks: bool = False
    ) -> None: ...
    def shutdown(self) -> None: ...
    def abort(self) -> None: ...

class _WorkWrapper:
    """The torch.distributed Work of a _BackendWrapper operation (resolved
    lazily, like _BackendWrapper)."""
    def wait(self, timeout: timedelta | None = None) -> bool: ...
    def is_completed(self) -> bool: ...
    def result(self) -> List[Any]: ...
    def get_future(self) -> Any: ...

# torchcomms.functional (python/torchcomms/functional/, imports torch; loaded
# on `import torchcomms.functional` or first attribute access): every
# collective <m> of TorchComm as torch.ops.torchcomms.torchcomm_<m> (functional)
# and torchcomm_<m>_ (in place), torchcomm_wait_tensors(_); Python functions
# F.<m>(comm, *method_args) -> new tensor(s) and F.<m>_(comm, ...) -> written
# tensor(s); TorchCommsAsyncTensor, FakeWork, wait_tensors, comm_key. See
# docs/functional.md.
