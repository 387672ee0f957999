"""Interoperability of our TCPStore (client and server, in libtorchcomms.so,
loaded with ctypes) with torch.distributed.TCPStore, in both directions.

The library is found in $TC_BUILD_DIR (default /work/main/build).
Run: .venv/bin/python -m pytest tests/py/test_store_interop.py
"""

import ctypes
import os
import threading
import time
from datetime import timedelta

import pytest

torch = pytest.importorskip("torch")
dist = torch.distributed

TC_OK = 0
TC_ERR_TIMEOUT = -3
TIMEOUT = timedelta(seconds=20)


def _load():
    path = os.path.join(
        os.environ.get("TC_BUILD_DIR", "/work/main/build"), "libtorchcomms.so"
    )
    if not os.path.exists(path):
        pytest.skip(f"{path} not built")
    lib = ctypes.CDLL(path)
    vp, cp, sz = ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t
    sig = {
        "tc_last_error": (cp, []),
        "tc_free": (None, [vp]),
        "tc_store_server_start": (ctypes.c_int, [cp, ctypes.c_int, ctypes.POINTER(vp)]),
        "tc_store_server_port": (ctypes.c_int, [vp]),
        "tc_store_server_stop": (None, [vp]),
        "tc_store_tcp_connect": (
            ctypes.c_int,
            [cp, ctypes.c_int, ctypes.c_double, ctypes.POINTER(vp)],
        ),
        "tc_store_release": (None, [vp]),
        "tc_store_set": (ctypes.c_int, [vp, cp, cp, sz]),
        "tc_store_get": (
            ctypes.c_int,
            [vp, cp, ctypes.POINTER(vp), ctypes.POINTER(sz), ctypes.c_double],
        ),
        "tc_store_add": (
            ctypes.c_int,
            [vp, cp, ctypes.c_int64, ctypes.POINTER(ctypes.c_int64)],
        ),
        "tc_store_check": (
            ctypes.c_int,
            [vp, ctypes.POINTER(cp), sz, ctypes.POINTER(ctypes.c_int)],
        ),
        "tc_store_wait": (ctypes.c_int, [vp, ctypes.POINTER(cp), sz, ctypes.c_double]),
        "tc_store_delete": (ctypes.c_int, [vp, cp, ctypes.POINTER(ctypes.c_int)]),
        "tc_store_local_addr": (cp, [vp]),
    }
    for name, (res, args) in sig.items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = res, args
    return lib


@pytest.fixture(scope="module")
def lib():
    return _load()


class CStore:
    """Our TCPStore client, through ctypes."""

    def __init__(self, lib, host, port, timeout=20.0):
        self.lib = lib
        self.h = ctypes.c_void_p()
        self._ok(lib.tc_store_tcp_connect(host.encode(), port, timeout, ctypes.byref(self.h)))

    def _ok(self, rc):
        if rc != TC_OK:
            raise RuntimeError(f"rc={rc}: {self.lib.tc_last_error().decode()}")

    def set(self, key, value: bytes):
        self._ok(self.lib.tc_store_set(self.h, key.encode(), value, len(value)))

    def get_rc(self, key, timeout=20.0):
        v, n = ctypes.c_void_p(), ctypes.c_size_t()
        rc = self.lib.tc_store_get(self.h, key.encode(), ctypes.byref(v), ctypes.byref(n), timeout)
        if rc != TC_OK:
            return rc, self.lib.tc_last_error().decode()
        data = ctypes.string_at(v, n.value)
        self.lib.tc_free(v)
        return rc, data

    def get(self, key, timeout=20.0):
        rc, data = self.get_rc(key, timeout)
        if rc != TC_OK:
            raise RuntimeError(data)
        return data

    def add(self, key, delta):
        r = ctypes.c_int64()
        self._ok(self.lib.tc_store_add(self.h, key.encode(), delta, ctypes.byref(r)))
        return r.value

    def _keys(self, keys):
        return (ctypes.c_char_p * len(keys))(*[k.encode() for k in keys])

    def check(self, keys):
        ready = ctypes.c_int(-1)
        self._ok(self.lib.tc_store_check(self.h, self._keys(keys), len(keys), ctypes.byref(ready)))
        return bool(ready.value)

    def wait_rc(self, keys, timeout):
        return self.lib.tc_store_wait(self.h, self._keys(keys), len(keys), timeout)

    def delete(self, key):
        d = ctypes.c_int(-1)
        self._ok(self.lib.tc_store_delete(self.h, key.encode(), ctypes.byref(d)))
        return bool(d.value)

    def local_addr(self):
        a = self.lib.tc_store_local_addr(self.h)
        return a.decode() if a else None

    def close(self):
        if self.h:
            self.lib.tc_store_release(self.h)
            self.h = ctypes.c_void_p()


@pytest.fixture
def our_server(lib):
    srv = ctypes.c_void_p()
    assert lib.tc_store_server_start(b"127.0.0.1", 0, ctypes.byref(srv)) == TC_OK, (
        lib.tc_last_error()
    )
    port = lib.tc_store_server_port(srv)
    assert port > 0
    yield port
    lib.tc_store_server_stop(srv)


# --------------------------------------------------------------------------
# (1) torch's TCPStore client against our server
# --------------------------------------------------------------------------


@pytest.mark.parametrize("use_libuv", [True, False])
def test_torch_client_on_our_server(lib, our_server, use_libuv):
    s = dist.TCPStore(
        "127.0.0.1", our_server, is_master=False, timeout=TIMEOUT, use_libuv=use_libuv
    )
    s.set("a", b"hello")
    assert s.get("a") == b"hello"
    s.set("a", "world")
    assert s.get("a") == b"world"
    s.set("bin", b"\x00\x01\xff")
    assert s.get("bin") == b"\x00\x01\xff"
    assert s.add("cnt", 5) == 5
    assert s.add("cnt", -7) == -2
    assert s.get("cnt") == b"-2"
    assert s.check(["a", "cnt"]) is True
    assert s.check(["a", "missing"]) is False
    s.wait(["a", "cnt"])
    s.wait(["a"], timedelta(seconds=5))
    with pytest.raises(Exception, match="(?i)timeout"):
        s.wait(["never"], timedelta(seconds=0.3))
    # the connection stays usable after a cancelled wait
    assert s.get("a") == b"world"

    assert s.delete_key("bin") is True
    assert s.delete_key("bin") is False
    assert s.check(["bin"]) is False

    # compare_set: torch's four cases
    assert s.compare_set("cs", "", "first") == b"first"  # missing, expected ""
    assert s.compare_set("cs2", "x", "y") == b"x"  # missing, expected "x"
    assert s.check(["cs2"]) is False
    assert s.compare_set("cs", "first", "second") == b"second"  # match
    assert s.compare_set("cs", "nope", "third") == b"second"  # mismatch
    assert s.get("cs") == b"second"

    s.append("ap", b"abc")
    s.append("ap", b"def")
    assert s.get("ap") == b"abcdef"

    s.multi_set(["m1", "m2", "m3"], ["v1", "v2", ""])
    assert s.multi_get(["m1", "m2", "m3", "a"]) == [b"v1", b"v2", b"", b"world"]

    keys = {"a", "cnt", "cs", "ap", "m1", "m2", "m3"}
    assert s.num_keys() == len(keys)
    assert set(s.list_keys()) == keys

    if use_libuv:  # queues are refused by torch's client otherwise
        s.queue_push("q", "one")
        s.queue_push("q", "two")
        assert s.queue_len("q") == 2
        assert s.queue_pop("q") == b"one"
        assert s.queue_pop("q", False) == b"two"
        assert s.queue_len("q") == 0
        assert s.check(["q"]) is False

    # a second torch client, with world_size (it adds to "init/" on connect)
    s2 = dist.TCPStore(
        "127.0.0.1", our_server, world_size=2, is_master=False, timeout=TIMEOUT,
        use_libuv=use_libuv,
    )
    assert s2.get("a") == b"world"
    assert s2.add("cnt", 2) == 0
    s.set("x/y", "z")
    assert s2.get("x/y") == b"z"

    # barrier: both clients, one in a thread
    err = []

    def other():
        try:
            s2.barrier("bar", 2, timedelta(seconds=20))
        except Exception as e:  # pragma: no cover - reported below
            err.append(e)

    t = threading.Thread(target=other)
    t.start()
    s.barrier("bar", 2, timedelta(seconds=20))
    t.join(30)
    assert not t.is_alive() and not err
    del s2, s


def test_torch_waiting_get_satisfied_by_our_client(lib, our_server):
    """A torch get that waits is answered when our C client sets the key."""
    s = dist.TCPStore("127.0.0.1", our_server, is_master=False, timeout=TIMEOUT)
    c = CStore(lib, "127.0.0.1", our_server)
    out = []

    def getter():
        g = dist.TCPStore("127.0.0.1", our_server, is_master=False, timeout=TIMEOUT)
        g.set("getter/ready", "1")
        out.append(g.get("late"))

    t = threading.Thread(target=getter)
    t.start()
    assert c.wait_rc(["getter/ready"], 20.0) == TC_OK
    c.set("late", b"from C")
    t.join(30)
    assert out == [b"from C"]
    # both clients see the same keys ("/" prefixed on the wire by both)
    c.set("c-key", b"c-value")
    assert s.get("c-key") == b"c-value"
    s.set("py-key", "py-value")
    assert c.get("py-key") == b"py-value"
    assert c.add("py-cnt", 3) == 3
    assert s.add("py-cnt", 4) == 7
    assert c.local_addr() == "127.0.0.1"
    c.close()


def test_our_server_survives_torch_client_exit(lib, our_server):
    for i in range(5):
        s = dist.TCPStore("127.0.0.1", our_server, is_master=False, timeout=TIMEOUT)
        s.add("visits", 1)
        del s
    c = CStore(lib, "127.0.0.1", our_server)
    assert c.get("visits") == b"5"
    c.close()


@pytest.mark.parametrize("use_libuv", [True, False])
def test_torch_client_over_our_value_limit(lib, use_libuv, monkeypatch):
    """torch's client setting a value over TORCHCOMMS_STORE_MAX_VALUE_BYTES
    gets an error (the connection is closed: torch's protocol has no error
    answer); our server keeps serving the others."""
    monkeypatch.setenv("TORCHCOMMS_STORE_MAX_VALUE_BYTES", "64K")
    srv = ctypes.c_void_p()
    assert lib.tc_store_server_start(b"127.0.0.1", 0, ctypes.byref(srv)) == TC_OK
    port = lib.tc_store_server_port(srv)
    try:
        s = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=TIMEOUT,
                          use_libuv=use_libuv)
        s.set("small", b"x" * 65536)  # exactly the limit
        with pytest.raises(Exception):
            s.set("big", b"y" * 65537)
            s.get("small")  # a set has no answer: the next request fails
        c = CStore(lib, "127.0.0.1", port)
        assert c.get("small") == b"x" * 65536
        assert c.check(["big"]) is False
        with pytest.raises(RuntimeError, match="refused the request: a value of "
                           "65537 bytes exceeds its limit of 65536"):
            c.set("big", b"y" * 65537)
        c.close()
        t = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=TIMEOUT,
                          use_libuv=use_libuv)
        assert t.get("small") == b"x" * 65536
        del s, t
    finally:
        lib.tc_store_server_stop(srv)


# --------------------------------------------------------------------------
# (2) our client against torch's TCPStore server
# --------------------------------------------------------------------------


@pytest.fixture(params=[True, False], ids=["libuv", "legacy"])
def torch_master(request):
    m = dist.TCPStore(
        "127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=TIMEOUT,
        use_libuv=request.param,
    )
    yield m
    del m


def test_our_client_on_torch_server(lib, torch_master):
    m = torch_master
    c = CStore(lib, "127.0.0.1", m.port)
    assert c.local_addr() == "127.0.0.1"

    c.set("k", b"v1")
    assert m.get("k") == b"v1"
    assert c.get("k") == b"v1"
    c.set("k", b"")
    assert c.get("k") == b""
    blob = bytes(range(256)) * 4096  # 1 MiB, every byte value
    c.set("blob", blob)
    assert m.get("blob") == blob
    assert c.get("blob") == blob

    m.set("from-torch", "hello C")
    assert c.get("from-torch") == b"hello C"

    assert c.add("n", 10) == 10
    assert m.add("n", 1) == 11
    assert c.add("n", -20) == -9
    assert m.get("n") == b"-9"

    assert c.check(["k", "n"]) is True
    assert c.check(["k", "absent"]) is False

    assert c.delete("k") is True
    assert c.delete("k") is False
    assert m.check(["k"]) is False

    # get timeout: fast, TC_ERR_TIMEOUT, and the connection stays usable
    t0 = time.monotonic()
    rc, msg = c.get_rc("never/7", timeout=0.3)
    assert rc == TC_ERR_TIMEOUT
    assert "get('never/7') timed out" in msg and "rank 7" in msg
    assert time.monotonic() - t0 < 5
    assert c.wait_rc(["n", "never"], 0.2) == TC_ERR_TIMEOUT
    assert "still missing: 'never'" in lib.tc_last_error().decode()
    assert c.get("n") == b"-9"

    # a waiting C get is answered by torch's set (from another thread)
    def setter():
        m.wait(["c/ready"], timedelta(seconds=20))
        m.set("late", "now")

    t = threading.Thread(target=setter)
    t.start()
    c.set("c/ready", b"1")
    assert c.get("late", timeout=20) == b"now"
    assert c.wait_rc(["late", "n"], 5.0) == TC_OK
    t.join(30)
    c.close()


def test_our_client_many_connections_to_torch_server(lib, torch_master):
    clients = [CStore(lib, "127.0.0.1", torch_master.port) for _ in range(16)]
    for i, c in enumerate(clients):
        c.set(f"rank/{i}", str(i).encode())
        c.add("count", 1)
    for c in clients:
        assert c.wait_rc([f"rank/{i}" for i in range(16)], 10.0) == TC_OK
        assert c.get("count") == b"16"
    assert [torch_master.get(f"rank/{i}") for i in range(16)] == [
        str(i).encode() for i in range(16)
    ]
    for c in clients:
        c.close()
