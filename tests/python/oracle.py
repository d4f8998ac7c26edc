#!/usr/bin/env python3
"""PyTorch as the oracle: the user's side of Conveyor, in the tests.

Debian's python3-torch (1.13, the same version as libtorch-dev) plays the user:
it defines models as nn.Sequential, scripts them, writes their weights and data
with torch.save, and trains the same job in a plain PyTorch loop, whose
per-step losses and final parameters a Conveyor run must equal.

    oracle.py make MODEL DIR      model.pt (TorchScript), init.pt (state_dict),
                                  train.pt / test.pt ({"inputs", "targets"};
                                  the tokens model: train.bin / test.bin, flat
                                  uint16 token ids), job.json (a Conveyor job
                                  over them)
    oracle.py train JOB OUT.json  trains the job (JSON; its paths relative to its
                                  folder) in PyTorch; writes the losses of
                                  every step and OUT.pt, the final state_dict;
                                  with eval: true also the test split's mean
                                  loss, accuracy and perplexity (evaluate())
    oracle.py train JOB OUT.json --live
                                  PyTorch 2, an exported program: its own module
                                  (torch.export.load) trains, not model.pt
    oracle.py compare OUT.json RUN.json STATE_A.pt STATE_B.pt
                                  the largest differences, as JSON
    oracle.py pretrained DIR      DIR/pretrained.pt: DIR's initial weights,
                                  changed, for init_from
    oracle.py losses DIR          scripted losses of (output, target):
                                  smoothed.pt (label-smoothed cross-entropy,
                                  0.1), per_sample.pt (no reduction: refused)
    oracle.py batch MANIFEST      the commands MANIFEST (JSON: a list of argument
                                  lists, each one of these but batch) lists,
                                  in one process: the suite's cases pay for
                                  importing torch once, not once each
    oracle.py load FILE...        each FILE read by torch.load(weights_only=True)
    oracle.py bad DIR             files a job must refuse: notscript.pt (a
                                  state_dict), module.pt (a scripted module
                                  that is no Sequential), uneven.pt (inputs
                                  and targets of different lengths),
                                  wide.pt (a state_dict of the wrong shapes),
                                  extra.pt (one key too many), odd.bin (a
                                  token file of 47 bytes: 23.5 uint16 ids),
                                  nan.pt (mlp data, sample 37 with a NaN)

MODEL: mlp, cnn-bn (BatchNorm), decoder (a small GPT-style decoder on token
data, an (hidden, mask) tuple crossing every block boundary: float hidden
states and a bool per-sample attention mask), decoder-ids (the same with
(hidden, token ids) crossing: int64 ids that the head reads again), dropout (an
MLP with nn.Dropout), exported-cnn (tests/fixtures/pt2/cnn.pt2, a program PyTorch 2.11's
torch.export.save wrote, which Conveyor trains; the loop trains the module it was exported
from, rebuilt here with its weights: PyTorch 1.13 has no torch.export), exported-mlp (mlp.pt2
there, cut by the pipe_split() mark in the program), exported-dec (dec_pair.pt2 there: a decoder
whose mark cuts the pair (hidden, positions), on token data), exported-dyn (dec_dyn.pt2: the
same with its batch dynamic), exported-mask (dec_mask.pt2: the same with a mask sliced from a
buffer crossing the mark), exported-shared (dec_shared.pt2: a mask buffer read on both sides
of the mark), exported-ids (dec_ids.pt2: the token ids crossing it), exported-heads (dec_heads.pt2:
attention's heads split as nanoGPT splits them), exported-gpt (gpt_dyn.pt2:
a nanoGPT-style decoder that PyTorch 2.11 exported with its batch dynamic), frozen (an MLP whose first layer has
requires_grad=False), tokens (Embedding, Linear, GELU, Linear over a flat
token file: data {format: tokens}).

data {format: tokens, dtype, seq_len: N} is read as Conveyor reads it
(model/dataset.h): a file of T token ids holds (T - 1) // N samples, sample i
the window tokens[i*N : i*N+N], its target tokens[i*N+1 : i*N+N+1].

The loop does what Conveyor does (docs/models.md): batch `step` of epoch e is
rows perm_e[pos*b:(pos+1)*b] of the training set, perm_e = torch.randperm(N)
from a generator seeded with Mix(seed, 1000 + e) (or file order with
shuffle: false); the batch is cut into micro_batches near-equal parts
(tensor_split); each part's loss is scaled by its share of the batch and
back-propagated, gradients accumulate, then one optimizer step: torch.optim's
SGD, Adam or AdamW (no_decay: a second parameter group without weight decay),
the learning rate from a LambdaLR with issue 18's schedule, the gradients
clipped by torch.nn.utils.clip_grad_norm_ with clip_grad_norm; with
precision: bf16-mixed each forward runs under torch.autocast("cpu",
torch.bfloat16). OUT.json has
each step's loss, lr and global gradient norm (before clipping). A step's loss
is the sum of the scaled micro-batch losses. BatchNorm sees each micro-batch
alone, as in torchgpipe. The layers run one by one, torch.manual_seed(
dropout_seed(seed, step, micro_batch, layer)) before each (dropout).
"""
import json
import os
import math
import sys
from collections import OrderedDict

import torch
from torch import nn

MASK64 = (1 << 64) - 1


def mix(seed, salt):
    """Conveyor's seed mixer (splitmix64 finaliser), common/dataset.cpp."""
    z = (seed + 0x9E3779B97F4A7C15 * (salt + 1)) & MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


def dropout_seed(seed, step, micro_batch, layer):
    """What Conveyor seeds the default generators with before a layer's forward
    in training (model/partition.h DropoutSeed, docs/models.md)."""
    return mix(mix(mix(seed, step), micro_batch), layer)


# ----------------------------------------------------------------- models --

class Flatten(nn.Module):
    def forward(self, x):
        return x.flatten(1)


class Embed(nn.Module):
    """Token ids -> (hidden states, causal mask per sample), or with `ids`
    (hidden states, the ids): the tuple crosses boundaries (every tensor that
    crosses has the batch first)."""

    def __init__(self, vocab: int, width: int, seq_len: int, ids: bool = False):
        super().__init__()
        self.ids = ids
        self.tokens = nn.Embedding(vocab, width)
        self.positions = nn.Embedding(seq_len, width)

    def forward(self, ids: torch.Tensor):
        pos = torch.arange(ids.size(1), device=ids.device)
        h = self.tokens(ids) + self.positions(pos)
        if self.ids:
            return h, ids
        n = ids.size(1)
        mask = torch.triu(torch.ones(n, n, device=ids.device, dtype=torch.bool), diagonal=1)
        return h, mask.expand(ids.size(0), n, n)


class Block(nn.Module):
    """(hidden, mask per sample) or with `ids` (hidden, ids), passed on."""

    def __init__(self, width: int, heads: int, ids: bool = False):
        super().__init__()
        self.heads = heads
        self.ids = ids
        self.norm1 = nn.LayerNorm(width)
        self.attn = nn.MultiheadAttention(width, heads, batch_first=True)
        self.norm2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x: tuple[torch.Tensor, torch.Tensor]):
        h, other = x
        if self.ids:
            n = other.size(1)
            attn_mask = torch.triu(torch.ones(n, n, device=h.device, dtype=torch.bool), diagonal=1)
        else:
            attn_mask = other.repeat_interleave(self.heads, 0)  # [batch * heads, L, S]
        a = self.norm1(h)
        h = h + self.attn(a, a, a, attn_mask=attn_mask, need_weights=False)[0]
        h = h + self.mlp(self.norm2(h))
        return h, other


class Head(nn.Module):
    def __init__(self, width: int, vocab: int):
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.out = nn.Linear(width, vocab)

    def forward(self, x: tuple[torch.Tensor, torch.Tensor]):
        return self.out(self.norm(x[0]))


class HeadIds(nn.Module):
    """The decoder's logits plus bigram logits of the ids that crossed."""

    def __init__(self, width: int, vocab: int):
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.out = nn.Linear(width, vocab)
        self.bigram = nn.Embedding(vocab, vocab)

    def forward(self, x: tuple[torch.Tensor, torch.Tensor]):
        h, ids = x
        return self.out(self.norm(h)) + self.bigram(ids)


def build(name):
    torch.manual_seed(1234)
    if name in ("mlp", "frozen"):
        model = nn.Sequential(Flatten(), nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 10))
        if name == "frozen":
            for p in model[1].parameters():
                p.requires_grad_(False)
        return model, "images"
    if name == "cnn-bn":
        model = nn.Sequential(
            nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(),
            nn.Conv2d(4, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
            Flatten(), nn.Linear(8 * 8 * 8, 10))
        return model, "images"
    if name == "decoder":
        vocab, width, seq = 50, 32, 16
        model = nn.Sequential(Embed(vocab, width, seq), Block(width, 4), Block(width, 4), Head(width, vocab))
        return model, "tokens"
    if name == "decoder-ids":
        vocab, width, seq = 50, 32, 16
        model = nn.Sequential(Embed(vocab, width, seq, ids=True), Block(width, 4, ids=True),
                              Block(width, 4, ids=True), HeadIds(width, vocab))
        return model, "tokens"
    if name == "dropout":
        model = nn.Sequential(Flatten(), nn.Linear(64, 32), nn.ReLU(), nn.Dropout(0.3), nn.Linear(32, 32),
                              nn.Tanh(), nn.Dropout(0.5), nn.Linear(32, 10))
        return model, "images"
    if name in EXPORTED:  # no module for PyTorch 1.13 where the program needs PyTorch 2 (train --live)
        builder = EXPORTED[name][2]
        return (builder() if builder else None), EXPORTED[name][3]
    if name == "tokens":
        vocab, width = 64, 16
        model = nn.Sequential(nn.Embedding(vocab, width), nn.Linear(width, width), nn.GELU(),
                              nn.Linear(width, vocab))
        return model, "token-file"
    raise SystemExit(f"oracle.py: unknown model {name}")


# tests/fixtures/pt2: programs PyTorch 2.11 exported (export_programs.py there).
PT2 = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures", "pt2")
EXPORTED_CNN = os.path.join(PT2, "cnn.pt2")
EXPORTED_CNN_CUTS = "bn, fc"  # model.cut_before: three layers


def exported_weights(path):
    """The state of a torch.export.save archive, read without torch.export (PyTorch 1.13 has none):
    data/weights/model_weights_config.json names each tensor's raw little-endian bytes."""
    import zipfile
    dtypes = {5: torch.int64, 7: torch.float32, 8: torch.float64, 13: torch.bfloat16}
    with zipfile.ZipFile(path) as z:
        root = z.namelist()[0].split("/")[0]
        config = json.loads(z.read(f"{root}/data/weights/model_weights_config.json"))["config"]
        state = {}
        for name, entry in config.items():
            meta = entry["tensor_meta"]
            raw = bytearray(z.read(f"{root}/data/weights/{entry['path_name']}"))
            sizes = [s["as_int"] for s in meta["sizes"]]
            state[name] = torch.frombuffer(raw, dtype=dtypes[meta["dtype"]]).clone().view(sizes)
    return state


def with_exported_weights(model, path, layer):
    """`model` (an nn.Sequential of the program's layers) with the program's weights: each state
    name goes to the layer `layer` maps its first component to, strictly."""
    state = {f"{layer[name.split('.')[0]]}.{name}": t for name, t in exported_weights(path).items()}
    model.load_state_dict(state, strict=True)
    return model


def exported_cnn():
    """The module the program in EXPORTED_CNN was exported from, as the nn.Sequential of the
    three layers Conveyor cuts it into (cut_before: bn, fc), each keeping its modules' names, with
    the program's weights: the oracle's loop seeds and runs these layers as Conveyor runs them."""
    from collections import OrderedDict
    model = nn.Sequential(
        nn.Sequential(OrderedDict(conv=nn.Conv2d(1, 4, 3, padding=1))),
        nn.Sequential(OrderedDict(bn=nn.BatchNorm2d(4), relu=nn.ReLU(), pool=nn.MaxPool2d(2), drop=nn.Dropout(0.1),
                                  flat=Flatten())),
        nn.Sequential(OrderedDict(fc=nn.Linear(64, 3))))
    return with_exported_weights(model, EXPORTED_CNN, {"conv": 0, "bn": 1, "fc": 2})


def exported_mlp():
    """mlp.pt2's module as the two layers its pipe_split() mark cuts it into, with its weights."""
    from collections import OrderedDict
    model = nn.Sequential(nn.Sequential(OrderedDict(l1=nn.Linear(16, 32), relu=nn.ReLU())),
                          nn.Sequential(OrderedDict(l2=nn.Linear(32, 32), relu=nn.ReLU(), l3=nn.Linear(32, 4))))
    return with_exported_weights(model, os.path.join(PT2, "mlp.pt2"), {"l1": 0, "l2": 1, "l3": 1})


class MathBlock(nn.Module):
    """export_programs.py's MathBlock: attention written out, then x + o(attention) + pos, pos."""
    def __init__(self, width: int, seq: int):
        super().__init__()
        self.ln = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.o = nn.Linear(width, width)
        self.register_buffer("mask", torch.zeros(seq, seq))

    def forward(self, x: torch.Tensor, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        c = self.qkv(self.ln(x)).chunk(3, dim=-1)
        s = torch.matmul(c[0], c[1].transpose(-2, -1)) * 0.25 + self.mask  # 16 ** -0.5, as exported
        return x + self.o(torch.matmul(torch.softmax(s, dim=-1), c[2])) + pos, pos


class PairHead(nn.Module):
    """dec_pair.pt2's first layer: embedding, the positions broadcast over the batch, block 1; the pair out."""
    def __init__(self):
        super().__init__()
        self.pos = nn.Parameter(torch.zeros(8, 16))
        self.emb = nn.Embedding(50, 16)
        self.b1 = MathBlock(16, 8)

    def forward(self, t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        e = self.emb(t)
        return self.b1(e, torch.zeros_like(e) + self.pos)


class PairTail(nn.Module):
    """dec_pair.pt2's second layer: block 2 on the pair, then the vocabulary head."""
    def __init__(self):
        super().__init__()
        self.b2 = MathBlock(16, 8)
        self.head = nn.Linear(16, 50)

    def forward(self, x: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        h, pos = self.b2(x[0], x[1])
        return self.head(h)


def exported_dec(program="dec_pair.pt2"):
    """dec_pair.pt2's module (tests/fixtures/pt2/edit_programs.py) as the two layers its mark cuts it
    into, the pair (hidden, positions) between them, with the weights of `program` (dec_pair.pt2,
    or dec_dyn.pt2, dec_mask.pt2 and dec_shared.pt2: the same weights and numbers, their graphs
    edited further)."""
    model = nn.Sequential(PairHead(), PairTail())
    return with_exported_weights(model, os.path.join(PT2, program),
                                 {"pos": 0, "emb": 0, "b1": 0, "b2": 1, "head": 1})


class HeadsBlock(MathBlock):
    """dec_heads.pt2's block: MathBlock's with 2 heads of 8, split from the projection as nanoGPT
    splits them (view, permute, unbind), joined again before the output projection."""
    def forward(self, x: torch.Tensor, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        b, t, w = x.shape
        q, k, v = self.qkv(self.ln(x)).view(b, t, 3, 2, w // 2).permute(2, 0, 3, 1, 4).unbind(0)
        s = torch.matmul(q, k.transpose(-2, -1)) * 0.25 + self.mask  # the scale dec_pair.pt2 has
        a = torch.matmul(torch.softmax(s, dim=-1), v).transpose(1, 2).reshape(b, t, w)
        return x + self.o(a) + pos, pos


def exported_heads():
    """dec_heads.pt2's module: exported_dec's with HeadsBlock for both blocks (its batch dynamic, as
    dec_dyn.pt2's)."""
    model = nn.Sequential(PairHead(), PairTail())
    model[0].b1, model[1].b2 = HeadsBlock(16, 8), HeadsBlock(16, 8)
    return with_exported_weights(model, os.path.join(PT2, "dec_heads.pt2"),
                                 {"pos": 0, "emb": 0, "b1": 0, "b2": 1, "head": 1})


class IdsHead(PairHead):
    """dec_ids.pt2's first layer: PairHead's, and the token ids passed on."""
    def forward(self, t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        e = self.emb(t)
        h, pos = self.b1(e, torch.zeros_like(e) + self.pos)
        return h, pos, t


class IdsTail(PairTail):
    """dec_ids.pt2's second layer: block 2, the positions whose token id is 0 zeroed, the head."""
    def forward(self, x: tuple[torch.Tensor, torch.Tensor, torch.Tensor]) -> torch.Tensor:
        h, pos = self.b2(x[0], x[1])
        return self.head(h * (x[2] != 0).unsqueeze(-1))


def exported_ids():
    """dec_ids.pt2's module: the token ids cross its mark beside the pair."""
    return with_exported_weights(nn.Sequential(IdsHead(), IdsTail()), os.path.join(PT2, "dec_ids.pt2"),
                                 {"pos": 0, "emb": 0, "b1": 0, "b2": 1, "head": 1})


class GptAttention(nn.Module):
    """tests/fixtures/pt2/export_dynamic.py's Attention (nanoGPT's, width 16, 2 heads, 8 positions)."""
    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(16, 48)
        self.proj = nn.Linear(16, 16)
        self.register_buffer("mask", torch.tril(torch.ones(8, 8)).view(1, 1, 8, 8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.size()
        qkv = self.qkv(x).split(C, dim=2)
        q = qkv[0].view(B, T, 2, C // 2).transpose(1, 2)
        k = qkv[1].view(B, T, 2, C // 2).transpose(1, 2)
        v = qkv[2].view(B, T, 2, C // 2).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.mask[:, :, :T, :T] == 0, float("-inf"))
        y = torch.softmax(att, dim=-1) @ v
        return self.proj(y.transpose(1, 2).contiguous().view(B, T, C))


class GptBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1 = nn.LayerNorm(16)
        self.attn = GptAttention()
        self.ln2 = nn.LayerNorm(16)
        self.fc = nn.Linear(16, 64)
        self.out = nn.Linear(64, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.out(torch.nn.functional.gelu(self.fc(self.ln2(x))))


class GptHead(nn.Module):
    """gpt_dyn.pt2 before its pipe_split() mark: embeddings of tokens and positions, block 1."""
    def __init__(self):
        super().__init__()
        self.wte = nn.Embedding(50, 16)
        self.wpe = nn.Embedding(8, 16)
        self.b1 = GptBlock()

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        T = idx.size(1)
        pos = torch.arange(0, T, dtype=torch.long, device=idx.device)
        return self.b1(self.wte(idx) + self.wpe(pos))


class GptTail(nn.Module):
    """gpt_dyn.pt2 after its mark: block 2, the final norm, the output layer."""
    def __init__(self):
        super().__init__()
        self.b2 = GptBlock()
        self.ln_f = nn.LayerNorm(16)
        self.head = nn.Linear(16, 50)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.ln_f(self.b2(x)))


def exported_gpt():
    """gpt_dyn.pt2's module (exported by PyTorch 2.11 with its batch dynamic: export_dynamic.py)
    as the two layers its mark cuts it into, with its weights."""
    return with_exported_weights(nn.Sequential(GptHead(), GptTail()), os.path.join(PT2, "gpt_dyn.pt2"),
                                 {"wte": 0, "wpe": 0, "b1": 0, "b2": 1, "ln_f": 1, "head": 1})


# model name -> (the program's file, model.cut_before or None, the module it came from, data kind)
EXPORTED = {"exported-cnn": ("cnn.pt2", EXPORTED_CNN_CUTS, exported_cnn, "images3"),
            "exported-mlp": ("mlp.pt2", None, exported_mlp, "vectors16"),
            "exported-dec": ("dec_pair.pt2", None, exported_dec, "token-file50"),
            # the batch dynamic: sizes computed from it before the mark, used after it
            "exported-dyn": ("dec_dyn.pt2", None, lambda: exported_dec("dec_dyn.pt2"), "token-file50"),
            # a mask without the batch, sliced from a buffer before the mark and read after it
            "exported-mask": ("dec_mask.pt2", None, lambda: exported_dec("dec_mask.pt2"), "token-file50"),
            # block 2 adds block 1's mask buffer: read on both sides of the mark, copied after it
            "exported-shared": ("dec_shared.pt2", None, lambda: exported_dec("dec_shared.pt2"), "token-file50"),
            # export_dynamic.py's nanoGPT-style decoder, exported by PyTorch 2.11 with its batch dynamic
            # (its sizes in sympy's srepr form); the batch crosses the mark as a symbolic size
            "exported-gpt": ("gpt_dyn.pt2", None, exported_gpt, "token-file50"),
            # attention's heads split from the projection (view, permute, unbind): one split in Conveyor
            "exported-heads": ("dec_heads.pt2", None, exported_heads, "token-file50"),
            # the token ids (int64) cross the mark: the head skips padding (id 0)
            "exported-ids": ("dec_ids.pt2", None, exported_ids, "token-file50"),
            # scaled_dot_product_attention, which PyTorch 1.13 lacks: `train --live` only (PyTorch 2).
            "exported-sdpa": ("dec.pt2", None, None, "token-file50")}


def make_data(kind, n, seed):
    g = torch.Generator().manual_seed(seed)
    if kind == "vectors16":  # mlp.pt2's input: 16 features, 4 classes
        return {"inputs": torch.randn(n, 16, generator=g), "targets": torch.randint(0, 4, (n,), generator=g)}
    if kind in ("images", "images3"):
        x = torch.randn(n, 1, 8, 8, generator=g)
        y = torch.randint(0, 3 if kind == "images3" else 10, (n,), generator=g)
        return {"inputs": x, "targets": y}
    ids = torch.randint(0, 50, (n, 17), generator=g)
    return {"inputs": ids[:, :-1].contiguous(), "targets": ids[:, 1:].contiguous()}


TOKEN_TYPECODES = {"uint16": "H", "uint32": "I"}  # array's native (little-endian) widths


def write_tokens(path, n, seed, vocab=64):
    """A flat uint16 token file, as nanoGPT's prepare.py writes its .bin files."""
    import array
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (n,), generator=g).tolist()
    with open(path, "wb") as f:
        array.array(TOKEN_TYPECODES["uint16"], ids).tofile(f)


def read_tokens(path, dtype, seq_len):
    """(inputs, targets), int64 [samples, seq_len]: windows and the same shifted by one."""
    import array
    ids = array.array(TOKEN_TYPECODES[dtype])
    with open(path, "rb") as f:
        ids.frombytes(f.read())
    tokens = torch.tensor(ids.tolist(), dtype=torch.int64)
    n = (tokens.numel() - 1) // seq_len if tokens.numel() else 0
    return tokens[:n * seq_len].view(n, seq_len), tokens[1:n * seq_len + 1].view(n, seq_len)


def read_split(spec, split, folder):
    """(inputs, targets) of the job's data.train or data.test file."""
    if spec.get("format") == "tokens":
        return read_tokens(f"{folder}/{spec[split]}", spec["dtype"], spec["seq_len"])
    if any(c in spec[split] for c in "*?["):
        # Shards: the files the pattern matches, in name order, are one split
        # (Conveyor maps them; here they are simply concatenated).
        import glob
        parts = [torch.load(f, weights_only=True) for f in sorted(glob.glob(f"{folder}/{spec[split]}"))]
        return torch.cat([p["inputs"] for p in parts]), torch.cat([p["targets"] for p in parts])
    data = torch.load(f"{folder}/{spec[split]}", weights_only=True)
    return data["inputs"], data["targets"]


def make(name, out):
    import os
    os.makedirs(out, exist_ok=True)
    model, kind = build(name)
    if model is not None:
        torch.jit.script(model).save(f"{out}/model.pt")
        init = model.state_dict()
        if name in EXPORTED:  # the program's names: each layer's own, without the layer's index
            init = {k.split(".", 1)[1]: t for k, t in init.items()}
        torch.save(init, f"{out}/init.pt")
    if kind.startswith("token-file"):
        # 96 windows of 8 and the token after the last, then a tail of 3 that is dropped.
        vocab = 50 if kind == "token-file50" else 64
        write_tokens(f"{out}/train.bin", 96 * 8 + 1 + 3, 1, vocab)
        write_tokens(f"{out}/test.bin", 32 * 8 + 1, 2, vocab)
        data = {"format": "tokens", "train": "train.bin", "test": "test.bin", "dtype": "uint16", "seq_len": 8}
    else:
        train = make_data(kind, 96, 1)
        torch.save(train, f"{out}/train.pt")
        # The same 96 samples in three uneven shards (data.train: PATTERN).
        for k, (a, b) in enumerate([(0, 37), (37, 60), (60, 96)]):
            torch.save({key: t[a:b].clone() for key, t in train.items()}, f"{out}/train-shard-{k}.pt")
        torch.save(make_data(kind, 32, 2), f"{out}/test.pt")
        data = {"format": "tensors", "train": "train.pt", "test": "test.pt"}
    model_spec = {"torchscript": "model.pt"}
    if name in EXPORTED:  # Conveyor trains the program; the loop, model.pt beside it
        import shutil
        program, cuts = EXPORTED[name][:2]
        shutil.copy(os.path.join(PT2, program), f"{out}/{program}")
        model_spec = {"exported": program}
        if cuts:
            model_spec["cut_before"] = cuts
    job = {
        "name": name,
        "model": model_spec,
        "data": data,
        "batch_size": 16,
        "micro_batches": 4,
        "optimizer": {"name": "sgd", "lr": 0.05, "momentum": 0.9},
        "loss": "cross_entropy",
        "steps": 8,
        "seed": 3,
    }
    with open(f"{out}/job.json", "w") as f:
        json.dump(job, f, indent=1)


# ------------------------------------------------------------------ train --

def no_decay(name, patterns):
    """A no_decay pattern matches a whole component of the dotted name."""
    return any(part in patterns for part in name.split("."))


def optimizer(model, spec):
    """torch.optim's own optimizer; with no_decay, [decay, no decay] groups as nanoGPT builds them."""
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    patterns = spec.get("no_decay", [])
    name = spec.get("name", "sgd")
    lr = spec.get("lr", 0.01 if name == "sgd" else 1e-3)
    wd = spec.get("weight_decay", 0.01 if name == "adamw" else 0.0)
    decay = [p for n, p in named if not no_decay(n, patterns)]
    off = [p for n, p in named if no_decay(n, patterns)]
    params = [g for g in ({"params": decay}, {"params": off, "weight_decay": 0.0}) if g["params"]]
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=spec.get("momentum", 0.0), weight_decay=wd,
                               nesterov=spec.get("nesterov", False))
    betas = tuple(spec.get("betas", (0.9, 0.999)))
    eps = spec.get("eps", 1e-8)
    if name == "adam":
        return torch.optim.Adam(params, lr=lr, betas=betas, eps=eps, weight_decay=wd)
    if name == "adamw":
        return torch.optim.AdamW(params, lr=lr, betas=betas, eps=eps, weight_decay=wd)
    raise SystemExit(f"oracle.py: unknown optimizer {name}")


def lr_factor(spec, lr, total):
    """Issue 18's schedule as LambdaLR's factor of step t (t counts optimizer steps from 0)."""
    w = spec.get("warmup_steps", 0)
    decay = spec.get("decay", "none")
    min_lr = spec.get("min_lr", 0.0)

    def factor(t):
        if t < w:
            return (t + 1) / w
        p = min(1.0, (t - w) / (total - w)) if total > w else 0.0
        if decay == "cosine":
            return (min_lr + 0.5 * (lr - min_lr) * (1 + math.cos(math.pi * p))) / lr
        if decay == "linear":
            return (lr - (lr - min_lr) * p) / lr
        if decay == "step":
            return spec.get("gamma", 0.1) ** ((t - w) // spec["step_size"])
        return 1.0
    return factor

class SmoothedCrossEntropy(nn.Module):
    """A user's loss: cross-entropy with label smoothing, the batch's mean."""

    def __init__(self, smoothing: float = 0.1):
        super().__init__()
        self.smoothing = smoothing

    def forward(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        logp = nn.functional.log_softmax(output.reshape(-1, output.size(-1)), dim=-1)
        target = target.reshape(-1)
        nll = -logp.gather(1, target.unsqueeze(1)).squeeze(1)
        return ((1.0 - self.smoothing) * nll - self.smoothing * logp.mean(dim=-1)).mean()


class PerSampleLoss(nn.Module):
    """A loss that forgets to reduce: one value per sample, no scalar."""

    def forward(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return nn.functional.cross_entropy(output, target, reduction="none")


def losses(folder):
    import os
    os.makedirs(folder, exist_ok=True)
    torch.jit.script(SmoothedCrossEntropy()).save(f"{folder}/smoothed.pt")
    torch.jit.script(PerSampleLoss()).save(f"{folder}/per_sample.pt")


_scripted_losses = {}


def loss_fn(name, out, y):
    if isinstance(name, dict):  # loss: {torchscript: PATH}, PATH as train() resolved it
        path = name["torchscript"]
        if path not in _scripted_losses:
            _scripted_losses[path] = torch.jit.load(path)
        return _scripted_losses[path](out, y)
    if name == "cross_entropy":
        return nn.functional.cross_entropy(out.reshape(-1, out.size(-1)), y.reshape(-1))
    if name == "mse":
        return nn.functional.mse_loss(out, nn.functional.one_hot(y, out.size(-1)).to(out.dtype))
    raise SystemExit(f"oracle.py: unknown loss {name}")


class LiveProgram(nn.Sequential):
    """An exported program's own module (torch.export.load(PATH).module()) as the one layer of the
    loop. Such a module refuses train() and eval() (it runs in the mode it was exported in): the flag
    alone is set, for this loop's own use."""

    def train(self, mode=True):
        self.training = mode
        return self


def load_live(path):
    """PyTorch 2: the module of the program at `path`, as LiveProgram."""
    if not hasattr(torch, "export"):
        raise SystemExit(f"oracle.py train --live: PyTorch {torch.__version__} has no torch.export")
    import importlib
    try:
        importlib.import_module("torch.distributed.pipelining")  # registers pipe_split's operator
    except ImportError:
        pass
    module = torch.export.load(path).module()
    # The guard torch.export puts before the module's forward holds every input to the example's
    # shapes (its batch of 8, without dynamic_shapes); Conveyor runs the program on any batch, and
    # the loop feeds micro-batches of 4 and evaluation batches of 10: the guard goes. Earlier
    # PyTorch 2 releases hook it before forward; 2.11 calls it from the graph, as the submodule
    # _guards_fn (seen on the GPU machine: "Guard failed: x.size()[0] == 8" with the hooks gone).
    module._forward_pre_hooks.clear()
    guards = [n for n in module.graph.nodes
              if n.op == "call_module" and str(n.target).startswith("_guards") and not n.users]
    for n in guards:
        module.graph.erase_node(n)
    if guards:
        module.recompile()
    return LiveProgram(module)


def train(job_path, out_json, live=False):
    """PyTorch's loop over the job. `live`, for an exported program (PyTorch 2): the program's own
    module, loaded by torch.export.load, rather than the module rebuilt beside it (model.pt); its
    layers run as one, so only programs without dropout match Conveyor's cut step for step."""
    import os
    folder = os.path.dirname(os.path.abspath(job_path))
    with open(job_path) as f:
        job = json.load(f)
    exported = "exported" in job["model"]  # an exported program: the module it came from, beside it
    script = os.path.join(os.path.dirname(job["model"]["exported"]), "model.pt") if exported else job["model"]["torchscript"]
    if live and exported:
        model = load_live(f"{folder}/{job['model']['exported']}")
    else:
        model = torch.jit.load(f"{folder}/{script}")
    if isinstance(job.get("loss"), dict):
        job["loss"] = {"torchscript": f"{folder}/{job['loss']['torchscript']}"}
    if "init_from" in job:
        init = torch.load(f"{folder}/{job['init_from']}", weights_only=True)
        if exported:  # the program's names, into the layers that hold them
            full = {k.split(".", 1)[1]: k for k in model.state_dict()}
            init = {full[k]: t for k, t in init.items()}
        model.load_state_dict(init)
    x_all, y_all = read_split(job["data"], "train", folder)
    n, b = x_all.size(0), job["batch_size"]
    m = job.get("micro_batches", 1)
    per_epoch = n // b  # batches
    acc = job.get("accumulate_steps", 1)  # batches per optimizer step
    steps = job.get("steps") or job.get("epochs", 1) * (per_epoch // acc)
    seed = job.get("seed", 0)
    shuffle = job["data"].get("shuffle", True)
    opt = optimizer(model, job.get("optimizer", {}))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_factor(job.get("lr_schedule", {}), opt.defaults["lr"], steps))
    clip = job.get("clip_grad_norm", 0)
    # bf16-mixed: fp32 parameters, each forward under CPU autocast in bf16, the
    # loss outside it on the output made fp32 (as Conveyor computes it).
    mixed = job.get("precision", "fp32") == "bf16-mixed"
    # fp16-mixed (CUDA only): the same on the GPU under autocast in float16,
    # with the loss scaling below (GradScaler's rule).
    fp16 = job.get("precision") == "fp16-mixed"
    dev = torch.device("cuda" if fp16 else "cpu")
    model.to(dev)
    x_all, y_all = x_all.to(dev), y_all.to(dev)
    # Dynamic loss scaling, torch.cuda.amp.GradScaler's rule written out (its
    # class is CUDA-only in 1.13): scaled loss, unscaled gradients, a step
    # with gradients that are not finite skipped (the scheduler still steps,
    # as in a plain GradScaler loop), the scale backed off, grown after
    # growth_interval finite steps in a row.
    ls = job.get("loss_scale", {})
    scaling = ls.get("dynamic", False) or job.get("precision") == "fp16-mixed"
    scale, tracker = float(ls.get("init", 65536.0)), 0
    infs = {g["step"] for g in job.get("inject_inf_gradients", [])}  # any stage's overflow is the model's
    layers = list(model.children())

    def forward(x, data_step, mb):
        # The children one after the other, as Conveyor runs them: each seeded
        # for its dropout by (seed, batch, micro-batch, layer) (dropout_seed),
        # and under autocast for bf16-mixed (from its second call TorchScript's
        # profiling executor runs a scripted Sequential as one optimised graph,
        # whose autocast backward rounds otherwise: up to 1.6e-2 on an mlp's
        # bf16 gradient).
        with torch.autocast(dev.type, dtype=torch.float16 if fp16 else torch.bfloat16, enabled=mixed or fp16):
            for layer, child in enumerate(layers):
                torch.manual_seed(dropout_seed(seed, data_step, mb, layer))
                x = child(x)
        return x
    model.train()
    losses, perms, lrs, norms, scales = [], {}, [], [], []
    for step in range(steps):
        opt.zero_grad(set_to_none=True)
        total = 0.0
        for k in range(acc):
            epoch, pos = divmod(step * acc + k, per_epoch)
            if shuffle:
                if epoch not in perms:
                    perms[epoch] = torch.randperm(n, generator=torch.Generator().manual_seed(mix(seed, 1000 + epoch)))
                idx = perms[epoch][pos * b:(pos + 1) * b]
            else:
                idx = torch.arange(pos * b, (pos + 1) * b)
            x, y = x_all[idx], y_all[idx]
            for mb, (xm, ym) in enumerate(zip(x.tensor_split(m), y.tensor_split(m))):
                out = forward(xm, step * acc + k, mb)
                loss = loss_fn(job.get("loss", "cross_entropy"), out.float(), ym) * (xm.size(0) / (b * acc))
                (loss * scale if scaling else loss).backward()
                total += loss.item()
        lrs.append(opt.param_groups[0]["lr"])
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        if scaling:
            for g in grads:
                g.mul_(1.0 / scale)  # GradScaler.unscale_
            if step in infs:
                grads[0].view(-1)[0] = float("inf")
        if clip:
            norms.append(torch.nn.utils.clip_grad_norm_(model.parameters(), clip).item())
        else:
            norms.append(torch.norm(torch.stack([torch.norm(g, 2.0) for g in grads]), 2.0).item())
        found_inf = scaling and not math.isfinite(norms[-1])
        if not found_inf:
            opt.step()
        sched.step()
        if scaling:
            scales.append(scale)
            if found_inf:
                scale, tracker = scale * ls.get("backoff_factor", 0.5), 0
            else:
                tracker += 1
                if tracker == ls.get("growth_interval", 2000):
                    scale, tracker = scale * ls.get("growth_factor", 2.0), 0
        losses.append(total)
    model.to("cpu")
    state = model.state_dict()
    if exported:  # the program's names: its layers' own, without the layer's index
        state = {name.split(".", 1)[1]: t for name, t in state.items()}
    torch.save(state, out_json[:-len(".json")] + ".pt")
    result = {"losses": losses}
    if job.get("eval"):
        result.update(evaluate(model, job, folder))
    with open(out_json, "w") as f:
        # A norm that is not finite (a skipped step) is null, as Conveyor's --json writes it.
        result.update({"lrs": lrs, "grad_norms": [n if math.isfinite(n) else None for n in norms],
                       "loss_scales": scales})
        json.dump(result, f)



def evaluate(model, job, folder):
    """The test split as Conveyor evaluates it: in file order, batches of
    eval_batch_size (the last one smaller), each batch's mean loss weighed by
    its samples; accuracy over samples, or over tokens for sequences. For
    token data the loss is per token, and its exp the perplexity."""
    x_all, y_all = read_split(job["data"], "test", folder)
    eb = job.get("eval_batch_size", 1000)
    model.eval()
    loss_sum, correct, seen = 0.0, 0, 0
    with torch.no_grad():
        for start in range(0, x_all.size(0), eb):
            x, y = x_all[start:start + eb], y_all[start:start + eb]
            # As Conveyor evaluates: the layers one by one, under autocast for bf16-mixed.
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=job.get("precision") == "bf16-mixed"):
                out = x
                for child in model.children():
                    out = child(out)
            out = out.float()
            loss_sum += loss_fn(job.get("loss", "cross_entropy"), out, y).item() * x.size(0)
            correct += int((out.argmax(-1) == y).sum())
            seen += y.numel()
    model.train()
    mean = loss_sum / x_all.size(0)
    return {"eval_loss": mean, "eval_accuracy": correct / seen, "eval_perplexity": math.exp(mean)}


def compare(ref_json, run_json, a_path, b_path):
    ref = json.load(open(ref_json))["losses"]
    run = json.load(open(run_json))["losses"]
    loss_diff = max((abs(x - y) for x, y in zip(ref, run)), default=math.inf)
    a = torch.load(a_path, weights_only=True)
    b = torch.load(b_path, weights_only=True)
    worst, where = 0.0, ""
    for k in a:
        d = (a[k].double() - b[k].double()).abs().max().item() if a[k].numel() else 0.0
        if d > worst:
            worst, where = d, k
    print(json.dumps({"steps": [len(ref), len(run)], "max_loss_diff": loss_diff, "max_param_diff": worst,
                      "worst_param": where, "keys_equal": list(a.keys()) == list(b.keys())}))


def pretrained(folder):
    state = torch.load(f"{folder}/init.pt", weights_only=True)
    g = torch.Generator().manual_seed(7)
    for k, v in state.items():
        if v.is_floating_point():
            state[k] = v * 0.5 + 0.01 * torch.randn(v.shape, generator=g)
    torch.save(state, f"{folder}/pretrained.pt")


def load(paths):
    for path in paths:
        try:
            torch.load(path, weights_only=True)
        except Exception as e:
            raise SystemExit(f"{path}: torch.load(weights_only=True) failed: {e}")


def run(argv):
    """One command: argv as after `oracle.py`."""
    cmd, n = argv[:1], len(argv)
    if cmd == ["make"] and n == 3:
        make(argv[1], argv[2])
    elif cmd == ["train"] and n == 3:
        train(argv[1], argv[2])
    elif cmd == ["train"] and n == 4 and argv[3] == "--live":
        train(argv[1], argv[2], live=True)
    elif cmd == ["compare"] and n == 5:
        compare(*argv[1:5])
    elif cmd == ["pretrained"] and n == 2:
        pretrained(argv[1])
    elif cmd == ["losses"] and n == 2:
        losses(argv[1])
    elif cmd == ["bad"] and n == 2:
        import bad_files  # beside this file
        bad_files.bad(argv[1])
    elif cmd == ["load"] and n >= 2:
        load(argv[1:])
    elif cmd == ["batch"] and n == 2:
        with open(argv[1]) as f:
            commands = json.load(f)
        for command in commands:
            if command[:1] == ["batch"]:
                raise SystemExit(f"{argv[1]}: a batch inside a batch")
            run(command)
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    run(sys.argv[1:])
