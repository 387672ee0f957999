#!/usr/bin/env python3
"""Writes the seed corpora of the fuzz targets (tests/fuzz/corpus/<name>/):
well-formed inputs that the fuzzers mutate. Run it after changing a format;
the files it writes are committed.

  python3 tests/fuzz/make_corpus.py
"""
import os
import random
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
rng = random.Random(20240610)


def write(target, name, data):
    d = os.path.join(HERE, "corpus", target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


# ---- store protocol: torch's TCPStore requests, as two clients' streams ----

Q = dict(VALIDATE=0, SET=1, COMPARE_SET=2, GET=3, ADD=4, CHECK=5, WAIT=6,
         GETNUMKEYS=7, DELETE_KEY=8, APPEND=9, MULTI_GET=10, MULTI_SET=11,
         CANCEL_WAIT=12, PING=13, QUEUE_PUSH=14, QUEUE_POP=15, QUEUE_LEN=16,
         LIST_KEYS=17, BARRIER=18)


def u32(v):
    return struct.pack("<I", v)


def u64(v):
    return struct.pack("<Q", v)


def s(b):
    b = b.encode() if isinstance(b, str) else b
    return u64(len(b)) + b


def req(name, *args):
    return bytes([Q[name]]) + b"".join(args)


def keys(*ks):
    return u64(len(ks)) + b"".join(s(k) for k in ks)


HELLO = req("VALIDATE", u32(0x3C85F7CE))


def chunked(streams):
    """Interleaves the clients' byte streams in chunks of random sizes."""
    out, pos = b"", [0] * len(streams)
    while any(p < len(st) for p, st in zip(pos, streams)):
        c = rng.choice([i for i, st in enumerate(streams) if pos[i] < len(st)])
        n = min(rng.randint(1, 127), len(streams[c]) - pos[c])
        out += bytes([(c << 7) | n]) + streams[c][pos[c]:pos[c] + n]
        pos[c] += n
    return out


store = {
    "basic": [HELLO + req("SET", s("/a"), s("1")) + req("GET", s("/a"))
              + req("ADD", s("/c"), u64(5)) + req("GETNUMKEYS")
              + req("DELETE_KEY", s("/a")) + req("PING", u32(7)), b""],
    "wait": [HELLO + req("WAIT", keys("/x", "/y")) + req("PING", u32(1))
             + req("CANCEL_WAIT"),
             HELLO + req("SET", s("/x"), s("v")) + req("ADD", s("/y"), u64(1))],
    "barrier": [HELLO + req("BARRIER", s("/b"), u64(2)),
                HELLO + req("BARRIER", s("/b"), u64(2))],
    "multi": [HELLO + req("MULTI_SET", u64(2), s("/m1"), s("one"), s("/m2"), s("two"))
              + req("MULTI_GET", keys("/m1", "/m2", "/none"))
              + req("CHECK", keys("/m1", "/m3")) + req("LIST_KEYS"), b""],
    "cas": [HELLO + req("COMPARE_SET", s("/k"), s(""), s("new"))
            + req("COMPARE_SET", s("/k"), s("new"), s("newer"))
            + req("COMPARE_SET", s("/k"), s("wrong"), s("x"))
            + req("APPEND", s("/k"), s("+tail")), b""],
    "queue": [HELLO + req("QUEUE_PUSH", s("/q"), s("item1"))
              + req("QUEUE_PUSH", s("/q"), s("item2")) + req("QUEUE_LEN", s("/q"))
              + req("QUEUE_POP", s("/q")) + req("QUEUE_POP", s("/q"))
              + req("QUEUE_POP", s("/q")),
              HELLO + req("WAIT", keys("/q"))],
    "refusal": [HELLO + req("SET", s("/big"), u64(1 << 20)) + b"x" * 64,
                HELLO + req("GET", s("torchcomms/refusal/fuzz:0"))],
    "big_value": [HELLO + req("SET", s("/v"), s(b"v" * 3000))
                  + req("MULTI_GET", keys("/v", "/v", "/v", "/v")), b""],
    "no_validate": [req("GET", s("/a")), HELLO + req("ADD", s("/n"), u64(1))
                    + req("SET", s("/n"), s("text")) + req("ADD", s("/n"), u64(1))],
    "unknown": [HELLO + bytes([200]), HELLO + req("PING", u32(3))],
}
for name, streams in store.items():
    write("store_proto", name, chunked(streams))

# ---- hello: {magic, version, rank, size, token} for a world of 4 ----

TOKEN = b"torchcomms-fuzz\0"


def hello(rank, size=4, magic=0x31484354, version=1, token=TOKEN):
    return struct.pack("<IIii", magic, version, rank, size) + token


W4 = bytes([3])  # 1 + 3 % 8 = 4 ranks
write("hello", "valid_rank0", W4 + hello(0))
write("hello", "valid_rank3", W4 + hello(3))
write("hello", "wrong_token", W4 + hello(1, token=b"x" * 16))
write("hello", "wrong_magic", W4 + hello(1, magic=0x12345678))
write("hello", "wrong_version", W4 + hello(1, version=2))
write("hello", "wrong_size", W4 + hello(1, size=5))
write("hello", "rank_out_of_range", W4 + hello(4))
write("hello", "negative_rank", W4 + hello(-1))
write("hello", "truncated", W4 + hello(2)[:20])
write("hello", "http", W4 + b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")

# ---- message header: {magic, kind, length} and what the receiver expects ----

MSG = 0x314D4354


def hdr_case(magic, kind, length, want_kind, want_len, peer=1, wl=200):
    return (struct.pack("<IIQ", magic, kind, length) + bytes([want_kind])
            + struct.pack("<Qi", want_len, peer) + bytes([wl]))


write("xfer_hdr", "match", hdr_case(MSG, 1, 64, 1, 64))
write("xfer_hdr", "match_empty", hdr_case(MSG, 1, 0, 1, 0))
write("xfer_hdr", "length_mismatch", hdr_case(MSG, 1, 8, 1, 16))
write("xfer_hdr", "goodbye_in_op", hdr_case(MSG, 2, 0, 1, 16))
write("xfer_hdr", "data_in_finalize", hdr_case(MSG, 1, 100, 2, 0))
write("xfer_hdr", "unknown_kind", hdr_case(MSG, 9, 0, 1, 0))
write("xfer_hdr", "bad_magic", hdr_case(0xDEADBEEF, 1, 0, 1, 0))
write("xfer_hdr", "tiny_reason_buffer", hdr_case(MSG, 1, 1, 1, 2, wl=1))

# two operation fingerprints after the header case: {seq, count, op, dtype,
# redop, flags, root}


def fp(seq=17, count=1024, op=3, dtype=0, redop=0, flags=0, root=-1):
    return struct.pack("<QQBBBBi", seq, count, op, dtype, redop, flags, root)


write("xfer_hdr", "fingerprints_same", hdr_case(MSG, 3, 24, 3, 24) + fp() + fp())
write("xfer_hdr", "fingerprints_differ", hdr_case(MSG, 3, 24, 3, 24) + fp() + fp(dtype=5))
print("corpora written under", os.path.join(HERE, "corpus"))
