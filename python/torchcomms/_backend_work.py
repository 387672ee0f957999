"""The torch.distributed Work objects of _BackendWrapper (``_WorkWrapper``)
and the helper thread that completes their futures (``_Completer``); see
torchcomms._backend_wrapper."""

import atexit
import threading
import weakref
from datetime import timedelta

from torch._C._distributed_c10d import Work as _Work

__all__ = ["_WorkWrapper", "_Completer"]


class _WorkWrapper(_Work):
    """A torch.distributed Work over TorchWork(s) of one operation."""

    def __init__(self, pg, works, result, post=(), deps=(), p2p=False):
        super().__init__()
        self._pg = pg
        self._works = list(works)
        self._result = result
        self._post = list(post)
        self._deps = list(deps)
        self._p2p_pending = p2p
        self._lock = threading.Lock()
        self._done = False
        self._exc = None
        self._fut = None
        self._fut_set = False

    # the one place where completion happens (idempotent, thread-safe)
    def _complete(self):
        if not self._done:
            with self._lock:
                if not self._done:
                    try:
                        if self._p2p_pending:
                            self._pg._flush_p2p()
                        for d in self._deps:
                            d._complete()
                        for w in self._works:
                            w.wait()
                        for f in self._post:
                            f()
                    except BaseException as e:  # noqa: BLE001  re-raised below
                        self._exc = e
                    self._post = []
                    self._done = True
        if self._exc is not None:
            raise self._exc

    def _ready(self):
        """True when every part finished (never blocks)."""
        if self._done:
            return True
        if self._p2p_pending:
            self._pg._flush_p2p()
        return all(d._ready() for d in self._deps) and all(w.is_completed() for w in self._works)

    def _set_future(self):
        with self._lock:
            if self._fut_set:
                return
            self._fut_set = True
        try:
            self._complete()
        except BaseException as e:  # noqa: BLE001
            self._fut_src.set_result(_Failed(e))
        else:
            self._fut_src.set_result(self._result)

    # -- torch.distributed.Work API --
    def wait(self, timeout=None):
        if timeout is not None and timeout > timedelta(0):
            import time

            deadline = time.monotonic() + timeout.total_seconds()
            while not self._ready():
                if time.monotonic() > deadline:
                    raise RuntimeError(f"torchcomms: Work.wait timed out after {timeout}")
                time.sleep(0.0005)
        self._complete()
        if self._fut is not None and not self._fut_set:
            self._set_future()
        return True

    def synchronize(self):
        self.wait()

    def is_completed(self):
        if self._ready():
            try:
                self._complete()
            except BaseException:  # noqa: BLE001  reported by wait() / exception()
                pass
            return True
        return False

    def is_success(self):
        return self.is_completed() and self._exc is None

    def exception(self):
        return self._exc

    def result(self):
        self.wait()
        return self._result

    def get_future(self):
        if self._fut is None:
            import torch.futures

            # What get_future returns is a then() of the future this work
            # completes, so that a failure is an error of the C++ future
            # (the callback raises): torch's Future.set_exception stores the
            # exception as the VALUE, which C++ readers (DDP's reducer:
            # parseCppCommHookResult) take for a result, and crash on.
            self._fut_src = torch.futures.Future()
            self._fut = self._fut_src.then(_unwrap)
            if self._ready():
                self._set_future()
            else:
                self._pg._completer_submit(self)
        return self._fut

    def get_future_result(self):
        return self.get_future()


class _Failed:
    """The value a failed work's source future carries (see get_future)."""

    __slots__ = ("exc",)

    def __init__(self, exc):
        self.exc = exc


def _unwrap(fut):
    v = fut.value()
    if isinstance(v, _Failed):
        raise v.exc
    return v


_COMPLETERS = weakref.WeakSet()
_atexit_registered = False


def _stop_completers():
    """At exit: let every helper thread finish what it is doing. A daemon
    thread still inside torch's C++ (Future.set_result) when the interpreter
    finalizes is unwound from a noexcept frame: std::terminate."""
    for c in list(_COMPLETERS):
        c.stop(join_timeout=10.0)


class _Completer:
    """One daemon thread that completes futures in issue order (started on
    demand, exits when idle for 5 s or on stop())."""

    def __init__(self, name):
        self._name = name
        self._cv = threading.Condition()
        self._queue = []
        self._thread = None

    def submit(self, work):
        global _atexit_registered
        with self._cv:
            self._queue.append(work)
            if self._thread is None or not self._thread.is_alive():
                if not _atexit_registered:
                    atexit.register(_stop_completers)
                    _atexit_registered = True
                _COMPLETERS.add(self)
                self._thread = threading.Thread(target=self._run, daemon=True,
                                                name=f"torchcomms-futures-{self._name}")
                self._thread.start()
            self._cv.notify()

    def _run(self):
        while True:
            with self._cv:
                while not self._queue:
                    if not self._cv.wait(timeout=5.0) and not self._queue:
                        self._thread = None  # idle: exit; the next submit starts another
                        return
                work = self._queue.pop(0)
                if work is None:  # stop(): exit, unless work came in after it
                    if self._queue:
                        continue
                    self._thread = None
                    return
            work._set_future()

    def stop(self, join_timeout=None):
        """Asks the thread to exit once its queue is done; with join_timeout,
        waits for it (at most that many seconds)."""
        with self._cv:
            t = self._thread
            if t is not None:
                self._queue.append(None)
                self._cv.notify()
        if join_timeout is not None and t is not None and t is not threading.current_thread():
            t.join(join_timeout)
