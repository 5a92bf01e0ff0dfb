#!/usr/bin/env python3
"""Seed corpora for the fuzz targets, made from the reference fixtures (never committed).

    make_seeds.py FIXTURES_DIR OUT_DIR [SMOLLM2_GGUF]

writes OUT_DIR/{gguf_header,hf_config,spm_model}/*: small files, each under 64 KiB, built from
the fixture checkpoints (GGUF headers with the vocabulary cut short, tiny synthetic GGUF models
in every block type the runtime reads, config.json files, small safetensors files, compact
tokenizer.model files with and without a precompiled charsmap). The chat_request seeds are
committed JSON files (fuzz/seeds/chat_request/).
"""

import json
import os
import struct
import sys

MAX = 64 * 1024

# ---- GGUF ----------------------------------------------------------------------------------

SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<B", 10: "<Q", 11: "<q", 12: "<d"}


class Reader:
    def __init__(self, b):
        self.b, self.pos = b, 0

    def take(self, fmt):
        v = struct.unpack_from(fmt, self.b, self.pos)
        self.pos += struct.calcsize(fmt)
        return v[0]

    def string(self):
        n = self.take("<Q")
        s = self.b[self.pos:self.pos + n]
        self.pos += n
        return s

    def value(self, t):
        if t in SCALAR:
            return self.take(SCALAR[t])
        if t == 8:
            return self.string()
        if t == 9:
            et, n = self.take("<I"), self.take("<Q")
            return (et, [self.value(et) for _ in range(n)])
        raise ValueError(f"value type {t}")


def w_string(s):
    if isinstance(s, str):
        s = s.encode()
    return struct.pack("<Q", len(s)) + s


def w_value(t, v):
    if t in SCALAR:
        return struct.pack(SCALAR[t], v)
    if t == 8:
        return w_string(v)
    et, items = v
    return struct.pack("<IQ", et, len(items)) + b"".join(w_value(et, x) for x in items)


def read_gguf(path, limit=16 << 20):
    """(version, [(key, type, value)], [(name, dims, type, offset)], data_offset, alignment)."""
    with open(path, "rb") as f:
        b = f.read(limit)
    r = Reader(b)
    assert b[:4] == b"GGUF"
    r.pos = 4
    version = r.take("<I")
    nt, nkv = r.take("<Q"), r.take("<Q")
    kvs = []
    for _ in range(nkv):
        k = r.string().decode()
        t = r.take("<I")
        kvs.append((k, t, r.value(t)))
    tensors = []
    for _ in range(nt):
        name = r.string().decode()
        nd = r.take("<I")
        dims = [r.take("<Q") for _ in range(nd)]
        tensors.append((name, dims, r.take("<I"), r.take("<Q")))
    align = dict((k, v) for k, _, v in kvs).get("general.alignment", 32)
    data = (r.pos + align - 1) // align * align
    return version, kvs, tensors, data, align


def write_gguf(kvs, tensors, data=b"", version=3, align=32):
    out = b"GGUF" + struct.pack("<IQQ", version, len(tensors), len(kvs))
    for k, t, v in kvs:
        out += w_string(k) + struct.pack("<I", t) + w_value(t, v)
    for name, dims, ty, off in tensors:
        out += w_string(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims)
        out += struct.pack("<IQ", ty, off)
    out += b"\0" * (-len(out) % align)
    return out + data


def cut_vocab(kvs, keep):
    """The metadata with every array (the vocabulary: tokens, scores, types, merges) cut to
    its first `keep` entries."""
    out = []
    for k, t, v in kvs:
        if t == 9:
            v = (v[0], v[1][:keep])
        out.append((k, t, v))
    return out


# Block layouts: ggml id -> (elements, bytes) per block.
BLOCK = {0: (1, 4), 1: (1, 2), 30: (1, 2), 2: (32, 18), 3: (32, 20), 6: (32, 22), 8: (32, 34), 12: (256, 144), 13: (256, 176), 14: (256, 210)}


def tiny_model(ty, hidden=32, heads=2, kv_heads=1, head_dim=None, ff=32, vocab=40, layers=1, tokenizer=None, extra=()):
    """A complete, self-consistent GGUF: a tiny Llama with every matrix of type `ty` (norms F32;
    Q8_0 where a row is not whole blocks of `ty`, as llama.cpp falls back)."""
    kvs = [] if head_dim is None else [("llama.attention.key_length", 4, head_dim)]
    head_dim = head_dim or hidden // heads
    kvs += [
        ("general.architecture", 8, b"llama"),
        ("general.alignment", 4, 32),
        ("llama.context_length", 4, 256),
        ("llama.embedding_length", 4, hidden),
        ("llama.block_count", 4, layers),
        ("llama.feed_forward_length", 4, ff),
        ("llama.attention.head_count", 4, heads),
        ("llama.attention.head_count_kv", 4, kv_heads),
        ("llama.rope.freq_base", 6, 10000.0),
        ("llama.attention.layer_norm_rms_epsilon", 6, 1e-5),
        ("tokenizer.ggml.bos_token_id", 4, 1),
        ("tokenizer.ggml.eos_token_id", 4, 2),
    ] + list(extra)
    kvs += tokenizer or []
    shapes = [("token_embd.weight", [hidden, vocab], ty), ("output_norm.weight", [hidden], 0), ("output.weight", [hidden, vocab], ty)]
    for l in range(layers):
        shapes += [
            (f"blk.{l}.attn_norm.weight", [hidden], 0),
            (f"blk.{l}.attn_q.weight", [hidden, heads * head_dim], ty),
            (f"blk.{l}.attn_k.weight", [hidden, kv_heads * head_dim], ty),
            (f"blk.{l}.attn_v.weight", [hidden, kv_heads * head_dim], ty),
            (f"blk.{l}.attn_output.weight", [heads * head_dim, hidden], ty),
            (f"blk.{l}.ffn_norm.weight", [hidden], 0),
            (f"blk.{l}.ffn_gate.weight", [hidden, ff], ty),
            (f"blk.{l}.ffn_up.weight", [hidden, ff], ty),
            (f"blk.{l}.ffn_down.weight", [ff, hidden], ty),
        ]
    tensors, data = [], b""
    for i, (name, dims, t) in enumerate(shapes):
        n = 1
        for d in dims:
            n *= d
        if dims[0] % BLOCK[t][0]:
            t = 8
        e, nb = BLOCK[t]
        size = n // e * nb
        # Deterministic bytes; for F32 norms, real floats.
        blob = struct.pack(f"<{n}f", *[1.0 + 0.01 * j for j in range(n)]) if t == 0 else bytes((i * 31 + j * 7) % 251 for j in range(size))
        tensors.append((name, dims, t, len(data)))
        data += blob + b"\0" * (-len(blob) % 32)
    return write_gguf(kvs, tensors, data)


def llama_vocab(n=40):
    toks = [b"<unk>", b"<s>", b"</s>"] + [f"<0x{i:02X}>".encode() for i in range(16)]
    toks += ["\u2581a", "\u2581b", "ab", "\u2581ab", "<|user|>", "c", "\u2581", "a", "b"][: max(0, n - len(toks))]
    toks = [t if isinstance(t, bytes) else t.encode() for t in toks]
    while len(toks) < n:
        toks.append(f"x{len(toks)}".encode())
    types = [2, 3, 3] + [6] * 16 + [1] * (n - 19)
    return [
        ("tokenizer.ggml.model", 8, b"llama"),
        ("tokenizer.ggml.tokens", 9, (8, toks)),
        ("tokenizer.ggml.scores", 9, (6, [float(-i) for i in range(n)])),
        ("tokenizer.ggml.token_type", 9, (5, types)),
    ]


def gpt2_vocab(n=40):
    toks = [chr(c).encode() for c in range(ord("a"), ord("a") + 26)] + ["\u0120".encode(), b"ab", b"\xc4\xa0a", b"<|im_start|>", b"<|im_end|>"]
    while len(toks) < n:
        toks.append(f"t{len(toks)}".encode())
    types = [1] * n
    types[29], types[30] = 3, 3
    return [
        ("tokenizer.ggml.model", 8, b"gpt2"),
        ("tokenizer.ggml.pre", 8, b"smollm"),
        ("tokenizer.ggml.tokens", 9, (8, toks)),
        ("tokenizer.ggml.token_type", 9, (5, types)),
        ("tokenizer.ggml.merges", 9, (8, [b"a b", "\u0120 a".encode()])),
        ("tokenizer.chat_template", 8, b"{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"),
    ]


def gguf_seeds(fixtures, out, smollm2):
    seeds = {}
    models = os.path.join(fixtures, "models")
    for d in sorted(os.listdir(models)):
        for f in sorted(os.listdir(os.path.join(models, d))):
            if not f.endswith(".gguf"):
                continue
            path = os.path.join(models, d, f)
            version, kvs, tensors, _, align = read_gguf(path)
            # The header with a short vocabulary: tensors point past the input (a prefix).
            seeds[f"{d}-{f}-header"] = write_gguf(cut_vocab(kvs, 64), tensors, version=version, align=align)
            if f in ("model-Q4_K_M.gguf", "model-Q8_0.gguf"):
                with open(path, "rb") as fh:
                    seeds[f"{d}-{f}-prefix"] = fh.read(16 * 1024)
    if smollm2 and os.path.exists(smollm2):
        version, kvs, tensors, _, align = read_gguf(smollm2)
        seeds["smollm2-header"] = write_gguf(cut_vocab(kvs, 64), tensors, version=version, align=align)
        with open(smollm2, "rb") as fh:
            seeds["smollm2-prefix"] = fh.read(16 * 1024)
    seeds["tiny-F32"] = tiny_model(0, heads=1, tokenizer=llama_vocab())
    for ty, name in [(1, "F16"), (30, "BF16"), (8, "Q8_0"), (2, "Q4_0"), (3, "Q4_1"), (6, "Q5_0")]:
        seeds[f"tiny-{name}"] = tiny_model(ty, tokenizer=llama_vocab())
    seeds["tiny-gpt2-vocab"] = tiny_model(8, tokenizer=gpt2_vocab())
    seeds["tiny-yarn"] = tiny_model(8, heads=1, kv_heads=1, tokenizer=llama_vocab(), extra=[
        ("llama.rope.scaling.type", 8, b"yarn"), ("llama.rope.scaling.original_context_length", 4, 64), ("llama.rope.scaling.attn_factor", 6, 1.2)])
    seeds["tiny-linear-2layers"] = tiny_model(2, layers=2, tokenizer=llama_vocab(), extra=[("llama.rope.scaling.type", 8, b"linear"), ("llama.rope.scaling.factor", 6, 4.0)])
    for ty, name in [(12, "Q4_K"), (13, "Q5_K"), (14, "Q6_K")]:
        seeds[f"tiny-{name}"] = tiny_model(ty, hidden=256, heads=1, kv_heads=1, head_dim=32, ff=32, vocab=4)
    write(out, "gguf_header", seeds)


# ---- HF: config.json and safetensors -------------------------------------------------------


def safetensors(tensors, metadata=None):
    """tensors: [(name, dtype, shape, bytes)] -> a safetensors file."""
    header, data = {}, b""
    if metadata:
        header["__metadata__"] = metadata
    for name, dtype, shape, blob in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(blob)]}
        data += blob
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + data


def hf_seeds(fixtures, out):
    seeds = {}
    models = os.path.join(fixtures, "models")
    for d in sorted(os.listdir(models)):
        for f in ("config.json", "generation_config.json", "tokenizer_config.json"):
            p = os.path.join(models, d, f)
            if os.path.exists(p):
                with open(p, "rb") as fh:
                    seeds[f"{d}-{f}"] = fh.read()
        p = os.path.join(models, d, "model.safetensors")
        with open(p, "rb") as fh:
            n = struct.unpack("<Q", fh.read(8))[0]
            header = fh.read(n)
        if len(header) + 8 <= MAX:
            # The header alone: a file whose data is missing (the web reads only this much).
            seeds[f"{d}-safetensors-header"] = struct.pack("<Q", n) + header
        # The same names and dtypes, tiny shapes, real data: a file that opens.
        meta = json.loads(header)
        small = []
        for i, (name, t) in enumerate(sorted((k, v) for k, v in meta.items() if k != "__metadata__")):
            if i >= 12:
                break
            shape = [32] if len(t["shape"]) == 1 else [2, 32]
            size = {"BF16": 2, "F16": 2, "F32": 4}.get(t["dtype"], 4) * (shape[0] * (shape[1] if len(shape) > 1 else 1))
            small.append((name, t["dtype"], shape, bytes((i + j) % 256 for j in range(size))))
        seeds[f"{d}-safetensors-small"] = safetensors(small, meta.get("__metadata__"))
    ones = struct.pack("<64f", *[1.0] * 64)
    seeds["safetensors-dtypes"] = safetensors([
        ("model.norm.weight", "F32", [64], ones),
        ("lm_head.weight", "F16", [2, 32], b"\x00\x3c" * 64),
        ("model.embed_tokens.weight", "BF16", [2, 32], b"\x80\x3f" * 64),
        ("input_ids", "I32", [4], struct.pack("<4i", 1, 2, 3, 4)),
        ("empty", "F32", [0, 32], b""),
    ], {"format": "pt"})
    seeds["index.json"] = json.dumps({"metadata": {"total_size": 10}, "weight_map": {"a.weight": "model-00001-of-00002.safetensors", "b.weight": "model-00002-of-00002.safetensors"}}).encode()
    seeds["config-yarn.json"] = json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 32, "vocab_size": 100,
        "max_position_embeddings": 640, "rms_norm_eps": 3e-6, "dtype": "bfloat16", "eos_token_id": [2, 48], "bos_token_id": 1,
        "rope_parameters": {"rope_type": "yarn", "factor": 10.0, "original_max_position_embeddings": 64, "rope_theta": 200000.0,
                            "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 0.5, "truncate": False},
    }).encode()
    seeds["config-linear.json"] = json.dumps({
        "model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 1, "num_attention_heads": 2,
        "vocab_size": 100, "rope_scaling": {"type": "linear", "factor": 2.0}, "tie_word_embeddings": True, "hidden_act": "silu",
    }).encode()
    write(out, "hf_config", seeds)


# ---- SentencePiece tokenizer.model ---------------------------------------------------------


def varint(n):
    out = b""
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out += bytes([b | 0x80])
        else:
            return out + bytes([b])


def proto_fields(b):
    """Top-level (field number, wire type, raw field bytes including the key)."""
    pos, out = 0, []
    while pos < len(b):
        start = pos
        key, shift = 0, 0
        while True:
            c = b[pos]
            pos += 1
            key |= (c & 0x7F) << shift
            shift += 7
            if c < 0x80:
                break
        wt = key & 7
        if wt == 0:
            while b[pos] & 0x80:
                pos += 1
            pos += 1
        elif wt == 1:
            pos += 8
        elif wt == 5:
            pos += 4
        elif wt == 2:
            n, shift = 0, 0
            while True:
                c = b[pos]
                pos += 1
                n |= (c & 0x7F) << shift
                shift += 7
                if c < 0x80:
                    break
            pos += n
        else:
            raise ValueError(f"wire type {wt}")
        out.append((key >> 3, wt, b[start:pos]))
    return out


def bytes_field(num, payload):
    return varint(num << 3 | 2) + varint(len(payload)) + payload


def charsmap(rules):
    """A precompiled charsmap (darts double array + NUL-terminated replacement strings) for
    `rules` (text -> replacement). Each trie node gets its own base: its children's units
    sit at base ^ byte, its leaf value at base itself (bases packed as darts packs them)."""
    strings, value_of = b"", {}
    for src, dst in rules.items():
        value_of[src.encode()] = len(strings)
        strings += dst.encode() + b"\0"
    nodes, leaf = [{}], {}  # node -> {byte: child}; node -> value
    for key, v in value_of.items():
        n = 0
        for c in key:
            if c not in nodes[n]:
                nodes.append({})
                nodes[n][c] = len(nodes) - 1
            n = nodes[n][c]
        leaf[n] = v
    # The root's base is 0 (unit 0 holds its offset, 0), its children at their bytes.
    base, used = {0: 0}, {0} | set(nodes[0])
    for n in range(1, len(nodes)):
        b = 1
        while b in base.values() or (n in leaf and b in used) or any(b ^ c in used for c in nodes[n]):
            b += 1
        base[n] = b
        used |= {b} if n in leaf else set()
        used |= {b ^ c for c in nodes[n]}
    size = (max(list(used) + list(base.values())) // 256 + 1) * 256
    units = [0] * size
    for n, children in enumerate(nodes):
        for c, child in children.items():
            idx = base[n] ^ c
            units[idx] = ((idx ^ base[child]) << 10) | c | ((1 << 8) if child in leaf else 0)
        if n in leaf:
            units[base[n]] = (1 << 31) | leaf[n]
    trie = b"".join(struct.pack("<I", u) for u in units)
    return struct.pack("<I", len(trie)) + trie + strings


def spm_seeds(fixtures, out):
    seeds = {}
    rules = {"\u00e9": "e", "\ufb01": "fi", "\u00c5": "A", "\u00a0": " ", "x": "", "\u00df": "ss", "\u2581": "_", "ab": "c"}
    cm = charsmap(rules)
    for f in ("tokenizer-bpe.model", "tokenizer-unigram.model"):
        with open(os.path.join(fixtures, "tokenizers", f), "rb") as fh:
            b = fh.read()
        fields = proto_fields(b)
        pieces = [x for x in fields if x[0] == 1]
        rest = [x for x in fields if x[0] != 1]
        for keep in (40, 400):
            small = b"".join(x[2] for x in pieces[:keep]) + b"".join(x[2] for x in rest)
            seeds[f"{f}-{keep}"] = small
            if keep == 400:
                seeds[f"{f}-{keep}-text"] = small + b"\xff\xfeTX" + "Sveiki, pasaule! ab x\u00e9 \u00df\n<|user|> 42".encode()
        # With the charsmap: normalizer_spec (field 3) gets field 2 = precompiled_charsmap.
        spec = [x for x in rest if x[0] == 3]
        norm = b""
        if spec:
            raw = spec[0][2]
            # Skip the key and length of field 3 to get its payload.
            pos = 1
            while raw[pos] & 0x80:
                pos += 1
            norm = raw[pos + 1:]
            norm = b"".join(x[2] for x in proto_fields(norm) if x[0] != 2)
        norm = bytes_field(2, cm) + norm
        small = b"".join(x[2] for x in pieces[:200]) + b"".join(x[2] for x in rest if x[0] != 3) + bytes_field(3, norm)
        seeds[f"{f}-charsmap"] = small + b"\xff\xfeTX" + "\u00c5bx \ufb01ne \u00e9t\u00e9 stra\u00dfe ab".encode()
    write(out, "spm_model", seeds)


def write(out, target, seeds):
    d = os.path.join(out, target)
    os.makedirs(d, exist_ok=True)
    for name, b in seeds.items():
        with open(os.path.join(d, "seed-" + name.replace("/", "_")), "wb") as fh:
            fh.write(b[:MAX])


def main():
    fixtures, out = sys.argv[1], sys.argv[2]
    smollm2 = sys.argv[3] if len(sys.argv) > 3 else None
    gguf_seeds(fixtures, out, smollm2)
    hf_seeds(fixtures, out)
    spm_seeds(fixtures, out)


if __name__ == "__main__":
    main()
