"""torchcomms.hooks: a flight recorder for the operations of a communicator.

``torch.distributed`` imports ``FlightRecorderHook`` from here (while torch
itself is still being imported) and, on its ``use_torchcomms`` path, attaches
one to every communicator it creates::

    recorder = FlightRecorderHook(max_entries=int(TORCH_FR_BUFFER_SIZE or 0))
    recorder.register_with_comm(comm)

What is recorded: every operation issued through the c10d process group over
the communicator (``torchcomms._backend_wrapper._BackendWrapper``, i.e. every
``torch.distributed`` call, DDP, FSDP2, DTensor ...), in a ring of the last
``max_entries`` entries (0: nothing is recorded). Operations called directly
on the ``TorchComm`` are not seen: the C library has no hook for them. The
entries use the field names of PyTorch's flight recorder (a subset), so that
``dump_json()`` reads like torch's trace.

This module imports only the standard library: it must be importable while
torch is being imported.
"""

import json
import threading
import time

__all__ = ["FlightRecorderHook"]

# id(comm) -> (comm, [recorders]); the comm is held so its id stays unique
_REGISTRY = {}
_REGISTRY_LOCK = threading.Lock()


def _recorders_for(comm):
    """The recorders registered with `comm` (a tuple; empty when none)."""
    entry = _REGISTRY.get(id(comm))
    if entry is None or entry[0] is not comm:
        return ()
    return tuple(entry[1])


class FlightRecorderHook:
    """Records the last `max_entries` operations of the communicators it is
    registered with (see the module docstring for what is seen)."""

    def __init__(self, max_entries=2048):
        max_entries = int(max_entries)
        if max_entries < 0:
            raise ValueError(f"FlightRecorderHook: max_entries must be >= 0, got {max_entries}")
        self._max = max_entries
        self._entries = []
        self._next_id = 0
        self._seq = {}  # (comm name, is_p2p) -> next sequence number
        self._comms = []
        self._lock = threading.Lock()

    # -- registration -------------------------------------------------------

    def register_with_comm(self, comm):
        """Starts recording the operations issued through c10d on `comm`."""
        with _REGISTRY_LOCK:
            entry = _REGISTRY.get(id(comm))
            if entry is None or entry[0] is not comm:
                entry = (comm, [])
                _REGISTRY[id(comm)] = entry
            if self not in entry[1]:
                entry[1].append(self)
        if comm not in self._comms:
            self._comms.append(comm)

    def unregister(self):
        """Stops recording on every communicator (the entries are kept)."""
        with _REGISTRY_LOCK:
            for comm in self._comms:
                entry = _REGISTRY.get(id(comm))
                if entry is not None and entry[0] is comm:
                    if self in entry[1]:
                        entry[1].remove(self)
                    if not entry[1]:
                        del _REGISTRY[id(comm)]
        self._comms = []

    def is_enabled(self):
        return self._max > 0

    # -- recording (called by the c10d wrapper) -----------------------------

    def _record(self, comm_name, op, inputs, outputs, is_p2p, timeout_ms):
        """Adds an entry in state "scheduled"; returns it (None if disabled)."""
        if self._max <= 0:
            return None
        with self._lock:
            key = (comm_name, is_p2p)
            seq = self._seq.get(key, 0) + 1
            self._seq[key] = seq
            e = {
                "record_id": self._next_id,
                "pg_id": comm_name,
                "process_group": [comm_name, ""],
                "collective_seq_id": 0 if is_p2p else seq,
                "p2p_seq_id": seq if is_p2p else 0,
                "op_id": seq,
                "profiling_name": f"torchcomms:{op}",
                "time_created_ns": time.time_ns(),
                "input_sizes": [list(t.shape) for t in inputs],
                "input_dtypes": [str(t.dtype).replace("torch.", "") for t in inputs],
                "output_sizes": [list(t.shape) for t in outputs],
                "output_dtypes": [str(t.dtype).replace("torch.", "") for t in outputs],
                "state": "scheduled",
                "time_discovered_started_ns": None,
                "time_discovered_completed_ns": None,
                "retired": False,
                "timeout_ms": timeout_ms,
                "is_p2p": is_p2p,
            }
            self._next_id += 1
            self._entries.append(e)
            if len(self._entries) > self._max:
                del self._entries[: len(self._entries) - self._max]
            return e

    @staticmethod
    def _completed(entry, ok=True):
        if entry is not None and entry["state"] != "completed":
            entry["state"] = "completed" if ok else "error"
            entry["time_discovered_completed_ns"] = time.time_ns()
            entry["retired"] = True

    # -- reading -------------------------------------------------------------

    def entries(self):
        """A copy of the recorded entries, oldest first."""
        with self._lock:
            return [dict(e) for e in self._entries]

    def reset(self):
        with self._lock:
            self._entries = []

    def dump_json(self, include_completed=True):
        """The trace as a JSON string: {"version", "pg_config", "entries"}."""
        entries = [e for e in self.entries() if include_completed or e["state"] != "completed"]
        pg_config = {}
        for c in self._comms:
            try:
                pg_config[c.get_name()] = {"name": c.get_name(), "desc": c.get_backend(),
                                           "ranks": str(list(range(c.get_size())))}
            except Exception:  # noqa: BLE001  (a finalized communicator)
                pass
        return json.dumps({"version": "2.10", "comm_lib_version": "torchcomms",
                           "pg_config": pg_config, "entries": entries})
