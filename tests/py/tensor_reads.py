"""Runs one operation on each of a set of tensors at 1 rank and prints, as
JSON, what happened: the reader the extension used, then for each case the
bytes written (or read) or the exception's type and text. test_tensor_fastpath
runs it twice, with torch's C shim and with TORCHCOMMS_PY_TENSOR_SHIM=0
(DLPack), and compares: the two readers must agree on every case."""
import json

import torch

import torchcomms
import torchcomms._comms as _comms


def bytes_of(t):
    return t.detach().reshape(-1).contiguous().view(torch.uint8).tolist()


def cases():
    def q():
        return torch.quantize_per_tensor(torch.ones(4), 0.5, 0, torch.qint8)

    def cow():  # a lazy clone: writing must copy, not touch the original
        src = torch.zeros(4)
        return src, torch._lazy_clone(src)

    def grown():
        t = torch.arange(4.0)
        t.resize_(64)
        t[4:] = 7
        return t

    def channels_last():
        return torch.arange(16.0).view(1, 4, 2, 2).to(
            memory_format=torch.channels_last)

    def no_storage():
        t = torch.arange(3.0)
        t.untyped_storage().resize_(0)
        return t

    with torch.inference_mode():
        inference = torch.arange(5.0)
    out = {}
    dts = [torch.float32, torch.float64, torch.float16, torch.bfloat16,
           torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64,
           torch.bool, torch.float8_e4m3fn, torch.float8_e5m2]
    for dt in dts:
        out["dtype-" + str(dt)] = lambda dt=dt: torch.arange(6).to(dt)
    out.update({
        "offset-view": lambda: torch.arange(20.0)[7:13],
        "offset-2d": lambda: torch.arange(24.0).view(4, 6)[1:3],
        "size-1-dims": lambda: torch.arange(6.0).view(1, 6, 1),
        "size-1-odd-stride": lambda: torch.arange(12.0).view(6, 2)[:, :1].t(),
        "zero-dim": lambda: torch.tensor(3.5),
        "empty": lambda: torch.empty(0),
        "empty-offset": lambda: torch.arange(9.0)[4:4],
        "parameter": lambda: torch.nn.Parameter(torch.arange(4.0), requires_grad=False),
        "detached": lambda: torch.arange(4.0, requires_grad=True).detach(),
        "inference": lambda: inference,
        "grown": grown,
        "transposed": lambda: torch.arange(6.0).view(2, 3).t(),
        "expanded": lambda: torch.ones(1).expand(4),
        "stepped": lambda: torch.arange(8.0)[::2],
        "channels-last": channels_last,
        "negative-view": lambda: torch._neg_view(torch.ones(3)),
        "conjugate": lambda: torch.ones(2, dtype=torch.complex64).conj(),
        "uint16": lambda: torch.ones(2, dtype=torch.uint16),
        "quantized": q,
        "meta": lambda: torch.ones(2, device="meta"),
        "sparse": lambda: torch.ones(2, 2).to_sparse(),
        "nested": lambda: torch.nested.nested_tensor([torch.ones(2), torch.ones(3)]),
        "no-storage": no_storage,
        "cow": cow,
    })
    if torch.backends.mkldnn.is_available():
        out["mkldnn"] = lambda: torch.ones(4).to_mkldnn()
    return out


def run_one(comm, make):
    made = make()
    src = None
    if isinstance(made, tuple):
        src, made = made
    try:
        if src is not None:  # written: the output of an all_gather
            comm.all_gather_single(made, torch.arange(4.0))
            return ["ok", bytes_of(made), bytes_of(src)]
        comm.broadcast(made, 0)  # read (1 rank: nothing moves)
        outp = torch.zeros(made.numel(), dtype=made.dtype)
        comm.all_gather_single(outp, made)
        return ["ok", bytes_of(outp)]
    except Exception as e:  # noqa: BLE001 - the words are the result
        return [type(e).__name__, str(e).split("\n")[0]]


def main():
    comm = torchcomms.new_comm("cpu", torch.device("cpu"), name="reads")
    res = {name: run_one(comm, make) for name, make in cases().items()}
    print(json.dumps({"reader": _comms._tensor_reader(), "cases": res}))
    comm.finalize()


if __name__ == "__main__":
    main()
