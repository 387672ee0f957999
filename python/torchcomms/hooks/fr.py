"""torchcomms.hooks.FlightRecorderHook: torchcomms' flight recorder API over
the C library's flight recorder.

The recording itself is done in C: every communicator keeps a ring of its
last operations (``TORCH_FR_BUFFER_SIZE``, default 2000; 0 records nothing),
whoever issues them (Python, the c10d wrapper, C code), with their state
(scheduled, started, completed, failed, timed_out), sizes, dtypes, times and
sequence numbers, and writes it to ``<TORCH_FR_DUMP_TEMP_FILE><rank>`` on a
timeout, a lost peer or an abort when that prefix is set. A hook only picks
communicators and reads their rings, so it costs the operations nothing:

    recorder = FlightRecorderHook(max_entries=2048)
    recorder.register_with_comm(comm)   # the ring keeps >= max_entries ops,
                                        # recorded from now on
    recorder.dump_json()                # torch's Flight Recorder JSON
    recorder.dump_file(rank)            # torch's pickled dump (fr_trace reads it)

``torch.distributed`` imports this class while torch itself is being
imported, and (``use_torchcomms`` path) attaches one to every communicator
it creates with ``max_entries=int(TORCH_FR_BUFFER_SIZE or 0)``: 0 keeps the
ring's size. This module imports only the standard library.
"""

import json
import os
import threading
import weakref

__all__ = ["FlightRecorderHook"]


def _truthy(value):
    return value is not None and value.strip().lower() in ("1", "true", "yes", "y", "on")


def dump_path(rank):
    """The file dump_file(rank) writes, as torchcomms' DebugInfoWriter names
    it: TORCHCOMM_FR_DUMP_TEMP_FILE itself when
    TORCHCOMM_FR_DUMP_DYNAMIC_FILE_NAME is set; else the prefix
    TORCHCOMM_FR_DUMP_TEMP_FILE, TORCH_FR_DUMP_TEMP_FILE or
    TORCH_NCCL_DEBUG_INFO_TEMP_FILE (default
    ``$XDG_CACHE_HOME/torch/comm_lib_trace_rank_``, XDG_CACHE_HOME defaulting
    to ``$HOME/.cache`` and HOME to /tmp; that folder is created) followed by
    the rank."""
    own = os.environ.get("TORCHCOMM_FR_DUMP_TEMP_FILE")
    if own and _truthy(os.environ.get("TORCHCOMM_FR_DUMP_DYNAMIC_FILE_NAME")):
        return own
    prefix = own or os.environ.get("TORCH_FR_DUMP_TEMP_FILE") or \
        os.environ.get("TORCH_NCCL_DEBUG_INFO_TEMP_FILE")
    if not prefix:
        cache = os.environ.get("XDG_CACHE_HOME") or \
            os.path.join(os.environ.get("HOME") or "/tmp", ".cache")
        folder = os.path.join(cache, "torch")
        os.makedirs(folder, exist_ok=True)
        prefix = os.path.join(folder, "comm_lib_trace_rank_")
    return f"{prefix}{int(rank)}"


class FlightRecorderHook:
    """Reads the flight recorder of the communicators it is registered with.

    max_entries: the rings of those communicators keep at least this many
    operations (a larger ring; never a smaller one; 0 keeps the size the
    library gave them, TORCH_FR_BUFFER_SIZE). isolated: accepted for
    torchcomms' signature; the rings are per communicator here, and op_ids
    are each communicator's own numbers, so every recorder is isolated.
    """

    def __init__(self, max_entries=2048, isolated=False):
        max_entries = int(max_entries)
        if max_entries < 0:
            raise ValueError(f"FlightRecorderHook: max_entries must be >= 0, got {max_entries}")
        self._max = max_entries
        self._isolated = bool(isolated)
        self._lock = threading.Lock()
        self._comms = []    # weakref.ref(TorchComm): the recorder keeps none alive
        self._handles = []  # their split hooks (children are registered too)
        self._registered = False

    # -- registration -------------------------------------------------------

    def register_with_comm(self, comm):
        """Reads `comm`'s operations from now on: its ring is sized to hold at
        least max_entries and starts afresh (the entries recorded before are
        dropped, so size() counts from here); communicators split from it
        are registered as they are made."""
        with self._lock:
            if any(r() is comm for r in self._comms):
                return
        if self._max > 0:
            comm._fr_reserve(self._max)
        comm._fr_reset()
        handle = comm._register_split_hook(self._on_split)
        with self._lock:
            self._comms.append(weakref.ref(comm))
            self._handles.append(handle)
            self._registered = True

    def _on_split(self, child):
        if self._registered:
            self.register_with_comm(child)

    def unregister(self):
        """Stops following every communicator (their rings go on recording:
        they are the communicators')."""
        with self._lock:
            handles, self._handles, self._comms = self._handles, [], []
            self._registered = False
        for h in handles:
            h.remove()

    def is_enabled(self):
        """True while registered with at least one communicator."""
        return self._registered

    def _live(self):
        with self._lock:
            refs = list(self._comms)
        return [c for c in (r() for r in refs) if c is not None]

    # -- reading -------------------------------------------------------------

    def size(self):
        """Entries recorded on the registered communicators since they were
        registered or reset (each ring holds its last entries only)."""
        return sum(c._fr_size() for c in self._live())

    def __len__(self):
        return self.size()

    def reset(self):
        """Forgets the entries of the registered communicators."""
        for c in self._live():
            c._fr_reset()

    def dump_json(self, include_completed=True):
        """The trace of the registered communicators as a JSON string in
        torch's Flight Recorder format: {"version": "2.10", "comm_lib_version",
        "rank", "pg_config": {name: {"name", "desc", "ranks"}}, "pg_status",
        "entries": [...]}, entries with torch's field names (record_id, pg_id,
        process_group, collective_seq_id, p2p_seq_id, op_id, profiling_name,
        time_created_ns, input_sizes, input_dtypes, output_sizes,
        output_dtypes, state, time_discovered_*, duration_ms, retired,
        timeout_ms, is_p2p). include_completed=False leaves completed
        entries out. pg_id numbers the communicators in registration order."""
        docs = [c._fr_dump_json(bool(include_completed)) for c in self._live()]
        if len(docs) == 1:
            return docs[0]
        out = {"version": "2.10", "comm_lib_version": "", "pg_config": {}, "pg_status": {},
               "entries": []}
        for pg_id, text in enumerate(docs):
            d = json.loads(text)
            if pg_id == 0:
                for k in ("version", "comm_lib_version", "rank"):
                    if k in d:
                        out[k] = d[k]
            out["pg_config"].update(d.get("pg_config", {}))
            out["pg_status"].update(d.get("pg_status", {}))
            for e in d.get("entries", []):
                e["pg_id"] = pg_id
                out["entries"].append(e)
        return json.dumps(out)

    def dump_file(self, rank, include_completed=True):
        """Writes torch's pickled Flight Recorder dump (what
        ``python -m torch.distributed.flight_recorder.fr_trace <folder>``
        reads) to dump_path(rank) and returns that path. The C library
        writes the trace of every live communicator of the process, completed
        entries included (as torchcomms' process-wide recorder does)."""
        from torchcomms import _comms

        return _comms._fr_dump_file(dump_path(rank))
