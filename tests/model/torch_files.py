#!/usr/bin/env python3
"""Fixtures and checks for tests/model/{torch_file,state_dict}_test.cpp.

Run by the tests with the python3 that has PyTorch (1.13 from Debian here, 2.x on
the GPU machine):

  torch_files.py state-dict OUT EXPECT     model().state_dict() saved by torch.save
  torch_files.py tensor-dict OUT EXPECT    {"inputs": X, "targets": Y}, a plain dict
  torch_files.py malicious OUT MARKER      a pickle whose __reduce__ calls os.system
  torch_files.py legacy OUT                the pre-1.6 (non-zip) format
  torch_files.py fixtures DIR              all four in one run (one import of torch): DIR/sd.pt and
        sd.txt, td.pt and td.txt, evil.pt (marker DIR/PWNED), legacy.pt
  torch_files.py check-big FILE NUMEL      one uint8 tensor "big" of NUMEL bytes (over 4 GiB:
        zip64), 1 first, 3 at 2**32, 2 last; loaded with weights_only=True
  torch_files.py check FILE EXPECT [--model] [--plain]
        torch.load(FILE, weights_only=True) must give exactly EXPECT's tensors (dtype,
        shape, bytes), in its order; --model: model().load_state_dict(strict=True)
        accepts it; --plain: the root is a dict, not an OrderedDict.

EXPECT has one line per tensor, tab-separated: name, dtype, shape, stride, storage
offset, storage group (the first name over the same storage), hex of its bytes in
row-major order. Shapes and strides are comma-separated ("" for a scalar).
"""
import collections
import os
import sys
import zipfile

import torch
from torch import nn


def model():
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(4, 3), nn.Conv2d(2, 3, 3), nn.BatchNorm2d(3), nn.Embedding(10, 4))
    m[2].num_batches_tracked.fill_(7)
    m[2].running_mean.uniform_()
    g = torch.Generator().manual_seed(1)
    m.register_buffer("f16", torch.randn(5, generator=g).half())
    m.register_buffer("bf16", torch.randn(2, 3, generator=g).bfloat16())
    m.register_buffer("f64", torch.randn(3, generator=g).double())
    m.register_buffer("i32", torch.arange(-3, 3, dtype=torch.int32))
    m.register_buffer("i16", torch.arange(-300, 300, 100, dtype=torch.int16))
    m.register_buffer("i8", torch.arange(-4, 4, dtype=torch.int8))
    m.register_buffer("u8", torch.arange(250, 256, dtype=torch.uint8))
    m.register_buffer("mask", torch.tensor([True, False, True]))
    m.register_buffer("transposed", torch.randn(3, 5, generator=g).t())  # non-contiguous
    base = torch.randn(6, 4, generator=g)
    m.register_buffer("base", base)
    m.register_buffer("view", base[1:4, ::2])  # shares base's storage, offset 4, strides (4, 2)
    m.register_buffer("scalar", torch.tensor(2.5))
    m.register_buffer("empty", torch.zeros(0, 3))
    return m


def raw(t):
    return t.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def dtype_name(t):
    return str(t.dtype).replace("torch.", "")


def ints(v):
    return ",".join(str(x) for x in v)


def write_expect(tensors, path):
    groups = {}
    with open(path, "w") as f:
        for name, t in tensors.items():
            ptr = t.storage().data_ptr()
            group = groups.setdefault(ptr, name)
            f.write("\t".join([name, dtype_name(t), ints(t.shape), ints(t.stride()), str(t.storage_offset()),
                               group, raw(t).hex()]) + "\n")


def read_expect(path):
    out = []
    with open(path) as f:
        for line in f:
            fields = line.rstrip("\n").split("\t")
            out.append((fields[0], fields[1], [int(x) for x in fields[2].split(",") if x], bytes.fromhex(fields[6])))
    return out


def save_pickle_alone(path):
    """The data.pkl beside the file, for the unpickler's own fuzzing."""
    with zipfile.ZipFile(path) as z:
        name = next(n for n in z.namelist() if n.endswith("/data.pkl"))
        with open(path + ".data.pkl", "wb") as f:
            f.write(z.read(name))


class Evil:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, ("touch " + self.marker,))


def main(argv):
    cmd = argv[1]
    if cmd == "fixtures":
        d = argv[2]
        for args in (["state-dict", "sd.pt", "sd.txt"], ["tensor-dict", "td.pt", "td.txt"],
                     ["malicious", "evil.pt", "PWNED"], ["legacy", "legacy.pt"]):
            main([argv[0], args[0]] + [os.path.join(d, a) for a in args[1:]])
    elif cmd == "state-dict":
        sd = model().state_dict()
        torch.save(sd, argv[2])
        write_expect(sd, argv[3])
        save_pickle_alone(argv[2])
    elif cmd == "tensor-dict":
        g = torch.Generator().manual_seed(2)
        d = {"inputs": torch.randn(4, 3, generator=g), "targets": torch.randint(0, 10, (4,), generator=g)}
        torch.save(d, argv[2])
        write_expect(d, argv[3])
    elif cmd == "malicious":
        torch.save({"weights": torch.ones(2), "payload": Evil(argv[3])}, argv[2])
    elif cmd == "legacy":
        torch.save(model().state_dict(), argv[2], _use_new_zipfile_serialization=False)
    elif cmd == "check-big":
        loaded = torch.load(argv[2], weights_only=True)
        t = loaded["big"]
        n = int(argv[3])
        if t.dtype != torch.uint8 or t.numel() != n or (int(t[0]), int(t[2**32]), int(t[-1])) != (1, 3, 2):
            sys.exit(f"big: {t.dtype} of {t.numel()} with {int(t[0])}, {int(t[2**32])}, {int(t[-1])}")
        print(f"ok: torch {torch.__version__} loaded {n} bytes with weights_only=True")
    elif cmd == "check":
        loaded = torch.load(argv[2], weights_only=True)
        want = read_expect(argv[3])
        if "--plain" in argv:
            if type(loaded) is not dict:
                sys.exit(f"root is {type(loaded).__name__}, not dict")
        elif not isinstance(loaded, collections.OrderedDict):
            sys.exit(f"root is {type(loaded).__name__}, not OrderedDict")
        if list(loaded.keys()) != [w[0] for w in want]:
            sys.exit(f"keys {list(loaded.keys())} != {[w[0] for w in want]}")
        for name, dtype, shape, data in want:
            t = loaded[name]
            if type(t) is not torch.Tensor:
                sys.exit(f"{name}: {type(t).__name__}, not a tensor")
            if dtype_name(t) != dtype or list(t.shape) != shape or raw(t) != data:
                sys.exit(f"{name}: {dtype_name(t)} {list(t.shape)} differs from {dtype} {shape} or its bytes")
        if "--model" in argv:
            m = model()
            m.load_state_dict(loaded, strict=True)
            for name, t in m.state_dict().items():
                if raw(t) != raw(loaded[name]):
                    sys.exit(f"{name}: load_state_dict did not copy the values")
        print(f"ok: torch {torch.__version__} loaded {len(want)} tensors with weights_only=True")
    else:
        sys.exit(f"unknown command {cmd}")


if __name__ == "__main__":
    main(sys.argv)
