"""torchcomms.hooks.NanCheckHook: refuses operations whose tensors hold NaN.

    hook = NanCheckHook(check_inputs=True, check_outputs=False)
    hook.register_with_comm(comm)
    comm.all_reduce(t)   # RuntimeError("NaN detected in input tensor for
                         #   'all_reduce' on comm 'main': NaN found in input
                         #   tensor. (rank 0)"); the operation is not issued

A pre hook (TorchComm.register_pre_hook): it runs before every operation,
and the RuntimeError it raises propagates out of the call, which is then not
issued. Only floating point tensors are checked (Inf passes), with
``torch.ops.c10d.check_for_nan`` when torch has it, else
``torch.isnan(t).any()``. torch is imported on the first check, never at
import.
"""

__all__ = ["NanCheckHook"]

_check_fn = None


def _checker():
    """torch.ops.c10d.check_for_nan, or a stand-in raising the same error."""
    global _check_fn
    if _check_fn is None:
        import torch

        fn = None
        try:
            import torch.distributed  # noqa: F401  (registers the c10d ops)

            fn = torch.ops.c10d.check_for_nan
        except (ImportError, AttributeError, RuntimeError):
            fn = None
        if fn is None:
            def fn(t):
                if bool(torch.isnan(t).any()):
                    raise RuntimeError("NaN found in input tensor.")
        _check_fn = fn
    return _check_fn


# op name -> (input fields, output fields); a field holds a tensor or a list
_FIELDS = {
    "send": (("tensor",), ()),
    "recv": ((), ("tensor",)),
    "all_gather": (("input",), ("output",)),
    "all_gather_v": (("input",), ("output",)),
    "all_gather_single": (("input",), ("output",)),
    "reduce_scatter": (("input",), ("output",)),
    "reduce_scatter_v": (("input",), ("output",)),
    "reduce_scatter_single": (("input",), ("output",)),
    "all_to_all_single": (("input",), ("output",)),
    "all_to_all_v_single": (("input",), ("output",)),
    "all_to_all": (("input",), ("output",)),
    "scatter": (("input",), ("output",)),
    "gather": (("input",), ("output",)),
    "gather_single": (("input",), ("output",)),
}
# in place: the one tensor is checked (as "input") when either check is on
_IN_PLACE = frozenset({"broadcast", "all_reduce", "reduce"})


class NanCheckHook:
    """Checks the tensors of every operation of the communicators it is
    registered with for NaN before the operation is issued."""

    def __init__(self, check_inputs=True, check_outputs=False):
        self._check_inputs = bool(check_inputs)
        self._check_outputs = bool(check_outputs)
        self._handles = []

    def register_with_comm(self, comm):
        name, rank = comm.get_name(), comm.get_rank()

        def pre_hook(op, op_id, args):
            self._pre_hook(name, rank, op, args)

        self._handles.append(comm.register_pre_hook(pre_hook))

    def unregister(self):
        handles, self._handles = self._handles, []
        for h in handles:
            h.remove()

    def is_enabled(self):
        return bool(self._handles)

    def _pre_hook(self, comm_name, rank, op, args):
        op_name = str(op).rsplit(".", 1)[-1]
        if op_name in _IN_PLACE:
            if self._check_inputs or self._check_outputs:
                self._check(args.tensor, "input", op_name, comm_name, rank)
            return
        fields = _FIELDS.get(op_name)
        if fields is None:  # barrier, split, new_window, finalize, batch_op_issue
            return
        if self._check_inputs:
            for f in fields[0]:
                self._check(getattr(args, f), "input", op_name, comm_name, rank)
        if self._check_outputs:
            for f in fields[1]:
                self._check(getattr(args, f), "output", op_name, comm_name, rank)

    @staticmethod
    def _check(value, label, op_name, comm_name, rank):
        tensors = value if isinstance(value, (list, tuple)) else (value,)
        for t in tensors:
            if t is None or not getattr(t, "is_floating_point", None) or \
                    not t.is_floating_point() or t.numel() == 0:
                continue
            try:
                _checker()(t)
            except RuntimeError as e:
                raise RuntimeError(
                    f"NaN detected in {label} tensor for '{op_name}' on comm "
                    f"'{comm_name}': {e} (rank {rank})") from None
