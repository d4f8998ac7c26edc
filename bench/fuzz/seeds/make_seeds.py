#!/usr/bin/env python3
"""Writes the seeds that no fixture provides (python3 alone, no PyTorch):
pickle/state_dict.pkl and torch_file/state_dict.pt (an OrderedDict state_dict
with _metadata, as torch.save writes it: stand-ins for torch's globals pickle
under their names), checkpoint/* (stage_server/checkpoint.cpp's layout) and
http_request/*. torch_file/sample_inputs.pt and pickle/sample_inputs.pkl come
from tests/fixtures/pt2/mlp.pt2 (its data/sample_inputs/model.pt, torch.save's own)."""
import collections, hashlib, io, os, pickle, struct, sys, types, zipfile

here = os.path.dirname(os.path.abspath(__file__))


def fake_torch():
    torch = types.ModuleType("torch")
    utils = types.ModuleType("torch._utils")
    def _rebuild_tensor_v2(*a): pass
    def _rebuild_parameter(*a): pass
    for f in (_rebuild_tensor_v2, _rebuild_parameter):
        f.__module__, f.__qualname__ = utils.__name__, f.__name__
    utils._rebuild_tensor_v2, utils._rebuild_parameter = _rebuild_tensor_v2, _rebuild_parameter
    for name in ("FloatStorage", "LongStorage", "Size", "device"):
        setattr(torch, name, type(name, (tuple,) if name == "Size" else (), {"__module__": "torch"}))
    torch._utils = utils
    sys.modules["torch"], sys.modules["torch._utils"] = torch, utils
    return torch, utils


torch, utils = fake_torch()


class Storage:
    def __init__(self, cls, key, numel): self.cls, self.key, self.numel = cls, key, numel


class Tensor:
    def __init__(self, storage, offset, size, stride, param=False):
        self.args = (storage, offset, size, stride, False, collections.OrderedDict())
        self.param = param
    def __reduce__(self):
        if self.param:
            inner = Tensor(*self.args[:4])
            return (utils._rebuild_parameter, (inner, True, collections.OrderedDict()))
        return (utils._rebuild_tensor_v2, self.args)


class Pickler(pickle.Pickler):
    def persistent_id(self, obj):
        if isinstance(obj, Storage):
            return ("storage", obj.cls, obj.key, "cpu", obj.numel)
        return None


def state_dict_pickle():
    sd = collections.OrderedDict()
    sd["0.weight"] = Tensor(Storage(torch.FloatStorage, "0", 8), 0, (2, 4), (4, 1), param=True)
    sd["0.bias"] = Tensor(Storage(torch.FloatStorage, "1", 2), 0, (2,), (1,))
    sd["steps"] = Tensor(Storage(torch.LongStorage, "2", 1), 0, (), ())
    sd._metadata = collections.OrderedDict({"": {"version": 1}, "0": {"version": 1}})
    out = io.BytesIO()
    Pickler(out, protocol=2).dump(sd)
    return out.getvalue()


def torch_zip(pkl, storages):
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as z:
        z.writestr("archive/data.pkl", pkl)
        z.writestr("archive/byteorder", "little")
        for key, data in storages.items():
            z.writestr("archive/data/" + key, data)
        z.writestr("archive/version", "3\n")
    return out.getvalue()


def varint(n):
    out = b""
    n &= (1 << 64) - 1
    while True:
        b, n = n & 0x7F, n >> 7
        out += bytes([b | (0x80 if n else 0)])
        if not n:
            return out


def field(num, value):
    if isinstance(value, int):
        return varint(num << 3) + varint(value)
    value = value.encode() if isinstance(value, str) else value
    return varint(num << 3 | 2) + varint(len(value)) + value


def checkpoint(payload, step):
    chunk = field(1, 0) + field(2, 0) + field(3, 2) + field(4, 4)
    header = (field(1, "job-1") + field(2, 1) + field(3, step) + field(4, chunk) + field(5, len(payload)) +
              field(6, "digest") + field(7, "p0") + field(8, "b0"))
    body = b"CVYCKPT1" + struct.pack("<I", len(header)) + header + payload
    return body


def write(path, data):
    with open(os.path.join(here, path), "wb") as f:
        f.write(data)


pkl = state_dict_pickle()
write("pickle/state_dict.pkl", pkl)
write("torch_file/state_dict.pt", torch_zip(pkl, {"0": bytes(32), "1": bytes(8), "2": bytes(8)}))
ckpt = checkpoint(b"\x00" * 40, 1000)
write("checkpoint/with-sum-appended", b"\x01" + ckpt)  # the target appends the SHA-256
write("checkpoint/whole-file", b"\x00" + ckpt + hashlib.sha256(ckpt).digest())
write("http_request/get", b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1:9400\r\nAccept: */*\r\n\r\n")
write("http_request/head-query", b"HEAD /metrics?name[]=x HTTP/1.0\r\n\r\n")
write("http_request/post", b"POST /metrics HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc")
write("http_request/other-path", b"GET / HTTP/1.1\r\n\r\n")
# fuzz_exported_program: the byte that picks the fixture (its list's order),
# then that program's models/model.json.
fixtures = os.path.join(here, "..", "..", "..", "tests", "fixtures", "pt2")
os.makedirs(os.path.join(here, "exported_program"), exist_ok=True)
for i, name in enumerate(["cnn", "mlp", "dec", "dec_dyn", "dec_heads", "dec_ids", "dec_mask", "dec_math",
                          "dec_pair", "dec_shared", "gpt_dyn"]):
    with zipfile.ZipFile(os.path.join(fixtures, name + ".pt2")) as z:
        model = next(n for n in z.namelist() if n.endswith("/models/model.json"))
        write(f"exported_program/{name}", bytes([i]) + z.read(model))
