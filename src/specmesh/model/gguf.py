"""GGUF files <-> specmesh checkpoints, with the `gguf` package (the format's library, from llama.cpp).

Reading (`read_gguf`): a Llama-architecture GGUF becomes what a HuggingFace folder gives the loader:
a ModelConfig from the `llama.*` metadata, the weights under HF names (dequantized to float32 by
gguf.quants, whatever the tensor type it can read: F32, F16, BF16, Q8_0, Q4_0, Q4_1, the K-quants ...;
q and k rows back from GGUF's interleaved rope pairs), and a tokenizer built from `tokenizer.ggml.*`
(byte-level BPE, split as llama.cpp splits for the file's pre-tokenizer) with its chat template.

Writing (`write_gguf`; loader.to_gguf for a checkpoint): bf16, f16, f32, Q8_0, Q4_0 or Q4_1 GGUF, for llama.cpp in the
bench and the tests.
"""
from __future__ import annotations

import functools
import json
import warnings
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np
import torch

from specmesh.model.model import ModelConfig
from specmesh.model.tokenizer import Tokenizer, byte_level_alphabet

MAGIC = b"GGUF"
ARCHITECTURES = ("llama",)

# HF Llama names -> GGUF's (blk.N. prefixed for the layers)
LAYER_NAMES = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
               "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
               "post_attention_layernorm": "ffn_norm", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
               "mlp.down_proj": "ffn_down"}
TOP_NAMES = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
             "lm_head.weight": "output.weight"}

# GGUF's llama.* hyperparameters (GGUFWriter.add_<key>) from ModelConfig's fields
HPARAMS = {"context_length": "max_position_embeddings", "embedding_length": "hidden_size",
           "block_count": "num_layers", "feed_forward_length": "intermediate_size", "head_count": "num_heads",
           "head_count_kv": "num_kv_heads", "key_length": "head_dim", "value_length": "head_dim",
           "rope_dimension_count": "head_dim", "rope_freq_base": "rope_theta", "layer_norm_rms_eps": "rms_norm_eps",
           "vocab_size": "vocab_size"}

# tokenizer.ggml.pre -> how llama.cpp splits text before BPE (llama-vocab.cpp), as tokenizers pre-tokenizers
GPT2 = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
DIGITS_THEN_GPT2 = {"type": "Sequence", "pretokenizers": [{"type": "Digits", "individual_digits": True}, GPT2]}
LLAMA3 = {"type": "Sequence", "pretokenizers": [
    {"type": "Split", "pattern": {"Regex": LLAMA3_SPLIT}, "behavior": "Isolated", "invert": False},
    GPT2 | {"use_regex": False}]}
PRE_TOKENIZERS = {"gpt-2": GPT2, "gpt2": GPT2, "default": GPT2,
                  "smollm": DIGITS_THEN_GPT2, "starcoder": DIGITS_THEN_GPT2, "refact": DIGITS_THEN_GPT2,
                  "codeshell": DIGITS_THEN_GPT2, "llama3": LLAMA3, "llama-v3": LLAMA3, "llama-bpe": LLAMA3,
                  "smaug-bpe": LLAMA3, "dbrx": LLAMA3}


def pre_name(tokenizer: Tokenizer) -> str:
    """The tokenizer.ggml.pre naming how this tokenizer splits text (its pre-tokenizer is one of ours), else
    GPT-2's rule."""
    pre = json.loads(tokenizer.inner.to_str()).get("pre_tokenizer")
    return next((name for name, spec in PRE_TOKENIZERS.items() if spec == pre), "gpt-2")


class GGUFError(ValueError):
    """A file that is not a GGUF specmesh can load (the message names the file and the problem)."""


def is_gguf(path: str | Path) -> bool:
    path = Path(path)
    if path.suffix.lower() == ".gguf":
        return True
    if not path.is_file():
        return False
    with open(path, "rb") as f:
        return f.read(4) == MAGIC


@dataclass
class GGUFCheckpoint:
    config: ModelConfig
    weights: dict[str, torch.Tensor]          # HF names, float32
    tokenizer: Tokenizer
    blocks: dict[str, "Blocks"]               # HF names: the quantized matrices' blocks as they are


@dataclass
class Blocks:
    """A Q8_0, Q4_0 or Q4_1 matrix as it is in the file: per block of 32 along a row, w = d q + m, with q as the
    kernels read it (int8: Q8_0's -127..127, the 4-bit formats' stored value - 8) and m Q4_1's minimum plus 8 d
    (None for the others). model/quant.py's (q, d, bits, m); kernels.Q8Linear multiplies them as they are."""
    q: torch.Tensor                           # int8 [N, K]
    d: torch.Tensor                           # float32 [N, K / 32]
    m: torch.Tensor | None                    # float32 [N, K / 32]
    bits: int

    @property
    def kind(self) -> tuple[int, bool]:
        return self.bits, self.m is not None

    def rows(self, fn) -> "Blocks":
        """The same rows rearranged by fn (a function of a [N, ...] tensor)."""
        return Blocks(fn(self.q), fn(self.d), None if self.m is None else fn(self.m), self.bits)


BLOCK_FORMATS = ("Q8_0", "Q4_0", "Q4_1")     # what the kernels multiply as it is (read_blocks, kernels.Q8Linear)


def layer_format(path: str | Path) -> str | None:
    """The one format of the file's layer matrices where it is one of BLOCK_FORMATS, else None."""
    kinds = {gguf.GGMLQuantizationType(t.kind).name for t in open_gguf(path).tensors
             if t.name.startswith("blk.") and len(t.shape) == 2}
    return kinds.pop() if len(kinds) == 1 and kinds <= set(BLOCK_FORMATS) else None


def read_blocks(t: Tensor) -> Blocks | None:
    """A 2-D Q8_0 / Q4_0 / Q4_1 tensor's blocks (ggml's layouts: an fp16 d, Q4_1's fp16 m, then 32 int8 or 16
    bytes whose low nibbles are weights 0-15 and high nibbles 16-31), else None."""
    Q = gguf.GGMLQuantizationType
    kind = Q(t.kind)
    if kind not in (Q.Q8_0, Q.Q4_0, Q.Q4_1) or len(t.shape) != 2:
        return None
    N, K = t.shape
    raw = np.asarray(t.data).reshape(N, K // 32, -1)
    d = raw[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float32)
    if kind == Q.Q8_0:
        return Blocks(torch.from_numpy(raw[..., 2:].copy().view(np.int8).reshape(N, K)), torch.from_numpy(d), None, 8)
    start = 4 if kind == Q.Q4_1 else 2
    nibbles = raw[..., start:start + 16]
    q = np.concatenate([nibbles & 0x0F, nibbles >> 4], -1).astype(np.int8) - 8
    m = raw[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float32) + 8 * d if kind == Q.Q4_1 else None
    return Blocks(torch.from_numpy(q.reshape(N, K)), torch.from_numpy(d), None if m is None else torch.from_numpy(m), 4)


# GGUF's metadata value types: numpy dtypes of the scalars, 8 string, 9 array
SCALARS = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "<u1", 10: "<u8", 11: "<i8",
           12: "<f8"}
STRING, ARRAY = 8, 9


@dataclass
class Tensor:
    name: str
    shape: tuple[int, ...]                    # numpy order: rows first
    kind: int                                 # a GGMLQuantizationType value
    data: np.ndarray                          # uint8 [rows, bytes per row], a view of the file


class GGUFFile:
    """A GGUF file's metadata (`fields`) and tensors, parsed from a memory map. gguf.GGUFReader makes a numpy
    view per array element (4 s for SmolLM2's 49k tokens and merges); this reads them in a fraction of that."""

    def __init__(self, path: Path):
        self.data, self.pos = np.memmap(path, mode="r"), len(MAGIC)
        if (version := self.read("<u4")) not in (2, 3):
            raise GGUFError(f"GGUF version {version} is not one this reader knows (2, 3)")
        n_tensors, n_fields = self.read("<u8"), self.read("<u8")
        self.fields = {}
        for _ in range(n_fields):
            key = self.string()
            self.fields[key] = self.value(self.read("<u4"))
        infos = [(self.string(), [self.read("<u8") for _ in range(self.read("<u4"))], self.read("<u4"),
                  self.read("<u8")) for _ in range(n_tensors)]
        align = self.fields.get("general.alignment", 32)
        start = -(-self.pos // align) * align
        self.tensors = [self.tensor(name, dims, kind, start + offset) for name, dims, kind, offset in infos]

    def read(self, dtype: str, count: int | None = None):
        size = np.dtype(dtype).itemsize * (count or 1)
        if self.pos + size > len(self.data):
            raise ValueError(f"the file ends at byte {len(self.data)}, inside its header")
        values = self.data[self.pos:self.pos + size].view(dtype)
        self.pos += size
        return values if count is not None else values[0].item()

    def string(self) -> str:
        n = self.read("<u8")
        return bytes(self.read("<u1", n)).decode("utf-8", "replace") if n else ""

    def value(self, kind: int):
        if kind == STRING:
            return self.string()
        if kind == ARRAY:
            item, n = self.read("<u4"), self.read("<u8")
            if item in SCALARS:
                return self.read(SCALARS[item], n).tolist() if n else []
            return [self.value(item) for _ in range(n)]
        if kind not in SCALARS:
            raise ValueError(f"unknown metadata type {kind} at byte {self.pos}")
        return self.read(SCALARS[kind])

    def tensor(self, name: str, dims: list[int], kind: int, offset: int) -> Tensor:
        try:
            block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(kind)]
        except (ValueError, KeyError):
            raise GGUFError(f"tensor {name} has unknown type {kind}") from None
        rows, row = int(np.prod(dims[1:])), dims[0]
        nbytes = rows * row // block * size
        if offset + nbytes > len(self.data):
            raise ValueError(f"tensor {name} needs bytes up to {offset + nbytes}, the file ends at {len(self.data)}")
        return Tensor(name, (*reversed(dims[1:]), row), kind, self.data[offset:offset + nbytes].reshape(rows, -1))


@functools.lru_cache(maxsize=4)
def _open(path: Path, stamp: tuple) -> GGUFFile:
    return GGUFFile(path)


def open_gguf(path: str | Path) -> GGUFFile:
    """The parsed file (cached: the tokenizer and the weights read it once)."""
    path = Path(path)
    if not path.is_file():
        raise GGUFError(f"GGUF file not found: {path}")
    with open(path, "rb") as f:
        head = f.read(4)
    if head != MAGIC:
        raise GGUFError(f"{path} is not a GGUF file (it starts with {head!r}, not {MAGIC!r})")
    stat = path.stat()
    try:
        return _open(path.resolve(), (stat.st_size, stat.st_mtime_ns))
    except GGUFError as e:
        raise GGUFError(f"{path}: {e}") from None
    except Exception as e:
        raise GGUFError(f"{path}: truncated or corrupt GGUF ({e})") from None


def read_config(path: str | Path) -> ModelConfig:
    """The model's hyperparameters from its `llama.*` metadata."""
    gguf_file = open_gguf(path)
    meta = gguf_file.fields
    arch = meta.get("general.architecture")
    if arch not in ARCHITECTURES:
        raise GGUFError(f"{path}: architecture {arch!r} is not supported; supported: {', '.join(ARCHITECTURES)}")
    scaling = meta.get(f"{arch}.rope.scaling.type", "none")
    if scaling not in ("none", "linear"):
        raise GGUFError(f"{path}: rope scaling {scaling!r} is not supported (none, linear)")

    def hp(key, default=None):
        value = meta.get(f"{arch}.{key}", default)
        if value is None:
            raise GGUFError(f"{path}: metadata {arch}.{key} is missing")
        return value

    heads, hidden = hp("attention.head_count"), hp("embedding_length")
    tokens = meta.get("tokenizer.ggml.tokens")
    names = {t.name for t in gguf_file.tensors}
    return ModelConfig(
        vocab_size=hp("vocab_size", len(tokens) if tokens else None), hidden_size=hidden,
        intermediate_size=hp("feed_forward_length"), num_layers=hp("block_count"), num_heads=heads,
        num_kv_heads=hp("attention.head_count_kv", heads), head_dim=hp("attention.key_length", hidden // heads),
        max_position_embeddings=hp("context_length", 2048), rms_norm_eps=hp("attention.layer_norm_rms_epsilon", 1e-5),
        rope_theta=hp("rope.freq_base", 10000.0),
        rope_scaling=None if scaling == "none" else {"rope_type": "linear", "factor": hp("rope.scaling.factor")},
        tie_word_embeddings="output.weight" not in names, model_type="llama",
        bos_token_id=meta.get("tokenizer.ggml.bos_token_id"), eos_token_id=end_ids(meta))


def end_ids(meta: dict) -> int | list[int] | None:
    """End of sequence, and end of turn where the file names another (Llama 3's <|eot_id|>)."""
    ids = [i for key in ("eos", "eot") if (i := meta.get(f"tokenizer.ggml.{key}_token_id")) is not None]
    ids = list(dict.fromkeys(ids))
    return ids[0] if len(ids) == 1 else ids or None


def read_gguf(path: str | Path, blocks: bool = False) -> GGUFCheckpoint:
    """`blocks`: the quantized matrices' blocks too (read_blocks), for a run that multiplies them as they are."""
    config = read_config(path)
    weights, kept = read_weights(path, config, blocks)
    return GGUFCheckpoint(config, weights, read_tokenizer(path), kept)


def read_weights(path: str | Path, cfg: ModelConfig, blocks: bool = False
                 ) -> tuple[dict[str, torch.Tensor], dict[str, Blocks]]:
    """The tensors by HF name in float32, and (`blocks`) the quantized matrices' blocks as they are."""
    hf_names = {gguf_name(n): n for n in hf_tensor_names(cfg)}
    weights, kept = {}, {}
    for t in open_gguf(path).tensors:
        name = hf_names.get(t.name)
        if name is None:
            continue                          # rope_freqs and the like: recomputed
        w, b = torch.from_numpy(dequantize(path, t)).view(t.shape), read_blocks(t) if blocks else None
        heads = cfg.num_heads if t.name.endswith("attn_q.weight") else \
            cfg.num_kv_heads if t.name.endswith("attn_k.weight") else None
        if heads:
            w, b = unpermute_rope(w, heads), b and b.rows(lambda x: unpermute_rope(x, heads))
        weights[name] = w
        if b is not None:
            kept[name] = b
    return weights, kept


def dequantize(path, t: Tensor) -> np.ndarray:
    kind = gguf.GGMLQuantizationType(t.kind)
    try:
        data = gguf.quants.dequantize(t.data, kind)
    except NotImplementedError:
        raise GGUFError(f"{path}: tensor {t.name} is {kind.name}, which gguf {gguf_version()} cannot dequantize; "
                        f"F32, F16, BF16, Q8_0, Q4_0, Q4_1 and the K-quants can be read") from None
    return np.array(data, dtype=np.float32, order="C")          # a copy: the map is read-only


def gguf_version() -> str:
    from importlib.metadata import version
    return version("gguf")


def read_tokenizer(path: str | Path) -> Tokenizer:
    """The byte-level BPE in `tokenizer.ggml.*` as a tokenizers Tokenizer: control tokens special, user-defined
    ones added whole (as llama.cpp matches them), the pre-tokenizer llama.cpp uses for `tokenizer.ggml.pre`."""
    meta = open_gguf(path).fields
    model = meta.get("tokenizer.ggml.model")
    if model != "gpt2":
        raise GGUFError(f"{path}: tokenizer {model!r} is not supported (byte-level BPE, 'gpt2', is)")
    tokens, types = meta.get("tokenizer.ggml.tokens"), meta.get("tokenizer.ggml.token_type")
    rule = meta.get("tokenizer.ggml.pre", "default")
    pre = PRE_TOKENIZERS.get(rule)
    if pre is None:
        warnings.warn(f"{path}: pre-tokenizer {rule!r} is not known here; splitting as GPT-2 does")
        pre = GPT2
    alphabet = set(byte_level_alphabet().values())
    added = [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False,
              "special": kind == gguf.TokenType.CONTROL}
             for i, (t, kind) in enumerate(zip(tokens, types))
             if kind == gguf.TokenType.USER_DEFINED or kind == gguf.TokenType.CONTROL and set(t) <= alphabet]
    spec = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added, "normalizer": None,
            "pre_tokenizer": pre, "post_processor": None,
            "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
            "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                      "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                      "vocab": {t: i for i, t in enumerate(tokens)},
                      "merges": [m.split(" ") for m in meta.get("tokenizer.ggml.merges", [])]}}
    from tokenizers import Tokenizer as HFTokenizer
    config = {"chat_template": meta.get("tokenizer.chat_template")}
    for key in ("bos", "eos", "eot"):
        i = meta.get(f"tokenizer.ggml.{key}_token_id")
        if i is not None and i < len(tokens):
            config[f"{key}_token"] = tokens[i]
    return Tokenizer(HFTokenizer.from_str(json.dumps(spec)), config)


# -- names and rope order ------------------------------------------------------------------------
def hf_tensor_names(cfg: ModelConfig) -> list[str]:
    layers = [f"model.layers.{i}.{inner}.weight" for i in range(cfg.num_layers) for inner in LAYER_NAMES]
    return [*TOP_NAMES, *layers]


def gguf_name(hf_name: str) -> str | None:
    if hf_name in TOP_NAMES:
        return TOP_NAMES[hf_name]
    parts = hf_name.split(".")
    if parts[:2] == ["model", "layers"]:
        inner = ".".join(parts[3:-1])
        if inner in LAYER_NAMES:
            return f"blk.{parts[2]}.{LAYER_NAMES[inner]}.{parts[-1]}"
    return None


def permute_rope(w: torch.Tensor, heads: int) -> torch.Tensor:
    """q or k projection [heads * hd, K] from HF's rotate-half order to GGUF's interleaved pairs (as
    llama.cpp's convert_hf_to_gguf.py does)."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def unpermute_rope(w: torch.Tensor, heads: int) -> torch.Tensor:
    """permute_rope's inverse."""
    return w.reshape(heads, w.shape[0] // heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


# -- writing -------------------------------------------------------------------------------------
def write_gguf(out: Path, cfg: ModelConfig, weights: dict[str, torch.Tensor], tokenizer: Tokenizer,
               ftype: str) -> Path:
    """A Llama-family model (HF-named weights) as a GGUF file of type ftype ('bf16', 'f16', 'f32', 'q8_0', 'q4_0' or 'q4_1'), with
    its tokenizer (and llama.cpp's name for how it splits text) and chat template. loader.to_gguf writes a
    checkpoint so."""
    writer = gguf.GGUFWriter(str(out), "llama")
    for key, name in HPARAMS.items():
        getattr(writer, f"add_{key}")(getattr(cfg, name))
    write_tokenizer(writer, cfg, json.loads(tokenizer.inner.to_str()), pre_name(tokenizer))
    if tokenizer.chat_template:
        writer.add_chat_template(tokenizer.chat_template)
    write_tensors(writer, cfg, weights, ftype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


def write_tokenizer(writer: gguf.GGUFWriter, cfg: ModelConfig, tok: dict, pre: str) -> None:
    """The byte-level BPE of a tokenizer.json as GGUF's gpt2 tokenizer, split by llama.cpp's rule `pre`."""
    vocab = tok["model"]["vocab"]
    tokens = sorted(vocab, key=vocab.get)
    special = {t["id"] for t in tok.get("added_tokens", []) if t.get("special")}
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(tokens)
    writer.add_token_types([gguf.TokenType.CONTROL if i in special else gguf.TokenType.NORMAL
                            for i in range(len(tokens))])
    writer.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]])
    writer.add_add_bos_token(False)                 # specmesh's tokenizer adds none
    if cfg.bos_token_id is not None:
        writer.add_bos_token_id(cfg.bos_token_id)
    ends = cfg.eos_ids
    if ends:
        writer.add_eos_token_id(ends[0])
    if len(ends) > 1:
        writer.add_eot_token_id(ends[1])


def write_tensors(writer: gguf.GGUFWriter, cfg: ModelConfig, weights: dict[str, torch.Tensor], ftype: str) -> None:
    """Norms in float32; matrices in bf16, f16, float32, Q8_0, Q4_0 or Q4_1 (the embedding table in bf16 then, as
    specmesh keeps it); q and k rows in GGUF's rope order."""
    if cfg.tie_word_embeddings and "lm_head.weight" not in weights:
        weights["lm_head.weight"] = weights["model.embed_tokens.weight"]     # llama.cpp then reads output.weight
    Q = gguf.GGMLQuantizationType
    qtype = {"bf16": Q.BF16, "f16": Q.F16, "f32": Q.F32, "q8_0": Q.Q8_0, "q4_0": Q.Q4_0, "q4_1": Q.Q4_1}[ftype]
    for hf_name, w in weights.items():
        name = gguf_name(hf_name)
        if name is None:
            continue
        w = w.float()
        if name.endswith("attn_q.weight"):
            w = permute_rope(w, cfg.num_heads)
        elif name.endswith("attn_k.weight"):
            w = permute_rope(w, cfg.num_kv_heads)
        if w.dim() == 1 or qtype == Q.F32:
            writer.add_tensor(name, w.numpy())
        elif qtype == Q.F16:
            writer.add_tensor(name, w.half().numpy())
        elif qtype in (Q.Q8_0, Q.Q4_0, Q.Q4_1) and name != "token_embd.weight":
            writer.add_tensor(name, gguf.quants.quantize(w.numpy(), qtype), raw_dtype=qtype)
        else:
            writer.add_tensor(name, w.to(torch.bfloat16).view(torch.uint16).numpy(), raw_dtype=Q.BF16)
