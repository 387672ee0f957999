"""Fault tolerance of _BackendWrapper (torchcomms._backend_wrapper): the
group follows a reconfigurable communicator (``new_comm(...,
enable_reconfigure=True)``) through every ``reconfigure``.

- ``rank()`` / ``size()`` are the communicator's at every call (-1 / 0
  before the first reconfigure), for Python callers
  (``dist.get_world_size(group)``, DDP) and C++ ones (DDP's reducer), which
  reach them through torch's ``PyProcessGroup`` trampoline
  (``getRank`` / ``getSize``).
- ``reconfigure(uuid, init_handles, timeout=None, hints=None)`` (or with
  one ReconfigureOptions-like object: ``uuid``, ``handles``, ``timeout``,
  ``hints``, what torchft's Manager passes to a native group),
  ``get_init_handle()`` / ``get_reconfigure_handle()``,
  ``supports_reconfigure``, ``get_error()``: what torchft's Manager uses
  on a native group (``Manager(pg=_BackendWrapper(comm), ...)``).
- Sends and recvs issued but not yet posted (they are posted lazily) fail
  at ``abort()`` and ``reconfigure()``: their peers are ranks of the old
  configuration. ``reconfigure`` on the group also restarts
  ``monitored_barrier``'s count under the uuid (so members old and new
  agree); ``comm.reconfigure`` called on the communicator directly does not.

What DDP needs after a reconfigure: docs/fault_tolerance.md.
"""

from torchcomms._backend_work import _WorkWrapper

__all__ = ["_Reconfigurable"]


def _as_timedelta(t):
    from datetime import timedelta

    if t is None or isinstance(t, timedelta):
        return t
    return timedelta(seconds=float(t))


class _Reconfigurable:
    """Mixin of _BackendWrapper (which sets ``_comm``, ``_p2p``,
    ``_p2p_lock``, ``_coalescing``, ``_mb_calls``, ``_mb_tag``, ``_last_rank_size``)."""

    # torch binds rank()/size() to the virtual getRank()/getSize(), which its
    # PyProcessGroup trampoline forwards here: Python callers
    # (dist.get_rank(group), DDP) and C++ ones (DDP's reducer) both see the
    # communicator's current rank and size, also after a reconfigure
    def _rank_size(self):
        try:
            self._last_rank_size = (self._comm.get_rank(), self._comm.get_size())
        except Exception:  # noqa: BLE001  (a finalized communicator: its last ones)
            pass
        return self._last_rank_size

    def getRank(self):
        return self._rank_size()[0]

    def getSize(self):
        return self._rank_size()[1]

    # -- fault tolerance (a communicator made with enable_reconfigure=True) --
    def get_init_handle(self):
        return self._comm.get_init_handle()

    def reconfigure(self, uuid, init_handles=None, timeout=None, hints=None):
        """``comm.reconfigure(uuid, init_handles, timeout, hints)`` (every
        member, same uuid and handles; blocks until connected), after failing
        the sends and recvs this group had not posted yet (their peers are
        ranks of the old configuration). Also takes a ReconfigureOptions-like
        object (``uuid``, ``handles``, ``timeout``, ``hints``), as torchft's
        Manager passes to a native group. Returns a completed Work;
        afterwards rank()/size() are the new ones."""
        if init_handles is None and hasattr(uuid, "handles"):
            opts = uuid
            uuid, init_handles = opts.uuid, opts.handles
            timeout = getattr(opts, "timeout", None)
            hints = getattr(opts, "hints", None) or None
        self._fail_pending_p2p("reconfigure")
        self._coalescing = None
        # monitored_barrier's store keys: counted from 0 in each configuration
        # (members new and old agree), under the configuration's uuid
        self._mb_tag, self._mb_calls = f"u{int(uuid)}/", 0
        tw = self._comm.reconfigure(uuid=uuid, init_handles=init_handles,
                                    timeout=_as_timedelta(timeout), hints=hints)
        self._rank_size()
        return _WorkWrapper(self, [tw], [])

    @property
    def supports_reconfigure(self):
        return True

    def get_reconfigure_handle(self):
        """The communicator's init handle (torchft's name for it)."""
        return self._comm.get_init_handle()

    def get_error(self):
        """torch's Backend.get_error (torchft's Manager asks a native group
        in should_commit): COMM_ERROR while the communicator is aborted (until
        a reconfigure), else SUCCESS; failed operations report themselves
        through their works and futures."""
        from torch._C._distributed_c10d import ErrorType

        try:
            aborted = self._comm.is_aborted()
        except Exception:  # noqa: BLE001  (finalized)
            aborted = True
        return ErrorType.COMM_ERROR if aborted else ErrorType.SUCCESS

    def _fail_pending_p2p(self, why):
        with self._p2p_lock:
            ops, self._p2p = self._p2p, []
        for _, _, peer, w in ops:
            w._p2p_pending = False
            w._exc = RuntimeError(
                f"torchcomms: a send/recv with peer {peer} on communicator "
                f"{self._comm.get_name()!r} was not posted before {why}")
            w._done = True

