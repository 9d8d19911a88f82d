"""GGUF files <-> specmesh checkpoints, with the `gguf` package (the format's library, from llama.cpp).

Reading (`read_gguf`): a GGUF of the llama (Llama, Mistral), qwen2, qwen3 or gemma3 architecture becomes what a
HuggingFace folder gives the loader: a ModelConfig from the `<arch>.*` metadata, the weights under HF names
(dequantized to float32 by gguf.quants, whatever the tensor type it can read: F32, F16, BF16, Q8_0, Q4_0, Q4_1, the
K-quants ...; the llama architecture's q and k rows back from GGUF's interleaved rope pairs; Gemma's norms less the 1
llama.cpp's converter adds), and a tokenizer built from `tokenizer.ggml.*` (byte-level BPE, split as llama.cpp
splits for the file's pre-tokenizer, or SentencePiece's BPE with byte fallback) with its chat template.

Writing (`write_gguf`; loader.to_gguf for a checkpoint): bf16, f16, f32, Q8_0, Q4_0 or Q4_1 GGUF of those
architectures, for llama.cpp in the bench and the tests.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import math
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from specmesh.kernels.build import kernel_lib
from specmesh.kernels.grids import GRIDS, hand_grid
from specmesh.model.gguf_file import GGUFError, GGUFFile, Tensor, is_gguf, open_gguf, tensor_type  # noqa: F401
from specmesh.model.model import FULL, SLIDING, ModelConfig
from specmesh.model.tokenizer import Tokenizer, byte_level_alphabet
from specmesh.paths import write_whole

if TYPE_CHECKING:
    import gguf         # imported where it is used: reading a file needs the package only for types it rarely has

# a GGUF architecture -> the model_type it reads as (llama: Llama and Mistral alike), and back
ARCHITECTURES = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "gemma3": "gemma3_text"}
GGUF_ARCHITECTURES = {"llama": "llama", "mistral": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "gemma3_text": "gemma3"}

# Gemma's post_attention_layernorm follows the attention (GGUF's post_attention_norm), where Llama's of that name is
# the MLP's input norm (ffn_norm): a Gemma file's is read (and written) under this name, which no HF checkpoint
# has, and renamed (file_to_hf, hf_to_file)
POST_ATTENTION = "post_attention_norm"

# HF Llama names -> GGUF's (blk.N. prefixed for the layers)
LAYER_NAMES = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
               "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
               "post_attention_layernorm": "ffn_norm", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
               "mlp.down_proj": "ffn_down",
               # Qwen3, Gemma 3; Gemma's norms around the MLP
               "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
               "pre_feedforward_layernorm": "ffn_norm", "post_feedforward_layernorm": "post_ffw_norm",
               POST_ATTENTION: "post_attention_norm"}
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


def split_then_bytes(regex: str, **byte_level) -> dict:
    """A regex's pieces, each then as bytes (the split Llama 3's, Qwen's and Mistral's tokenizers make)."""
    return {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": regex}, "behavior": "Isolated", "invert": False},
        GPT2 | {"use_regex": False} | byte_level]}


LLAMA3 = split_then_bytes(LLAMA3_SPLIT)
QWEN2 = split_then_bytes(LLAMA3_SPLIT.replace(r"\p{N}{1,3}", r"\p{N}"), trim_offsets=False)  # a digit a piece
TEKKEN = split_then_bytes(r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"  # Mistral's:
                          r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"  # words by
                          r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")              # case
PRE_TOKENIZERS = {"gpt-2": GPT2, "gpt2": GPT2, "default": GPT2,
                  "smollm": DIGITS_THEN_GPT2, "starcoder": DIGITS_THEN_GPT2, "refact": DIGITS_THEN_GPT2,
                  "codeshell": DIGITS_THEN_GPT2, "llama3": LLAMA3, "llama-v3": LLAMA3, "llama-bpe": LLAMA3,
                  "smaug-bpe": LLAMA3, "dbrx": LLAMA3, "qwen2": QWEN2, "deepseek-r1-qwen": QWEN2, "tekken": TEKKEN}


def pre_name(tokenizer: Tokenizer) -> str:
    """The tokenizer.ggml.pre naming how this tokenizer splits text (its pre-tokenizer is one of ours), else
    GPT-2's rule."""
    pre = json.loads(tokenizer.inner.to_str()).get("pre_tokenizer")
    return next((name for name, spec in PRE_TOKENIZERS.items() if spec == pre), "gpt-2")




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
    kinds = {tensor_type(t.kind)[0] for t in open_gguf(path).tensors
             if t.name.startswith("blk.") and len(t.shape) == 2}
    return kinds.pop() if len(kinds) == 1 and kinds <= set(BLOCK_FORMATS) else None


def read_blocks(t: Tensor) -> Blocks | None:
    """A 2-D Q8_0 / Q4_0 / Q4_1 tensor's blocks (ggml's layouts: an fp16 d, Q4_1's fp16 m, then 32 int8 or 16
    bytes whose low nibbles are weights 0-15 and high nibbles 16-31), else None."""
    kind = tensor_type(t.kind)[0]
    if kind not in BLOCK_FORMATS or len(t.shape) != 2:
        return None
    N, K = t.shape
    raw = np.asarray(t.data).reshape(N, K // 32, -1)
    d = raw[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float32)
    if kind == "Q8_0":
        return Blocks(torch.from_numpy(raw[..., 2:].copy().view(np.int8).reshape(N, K)), torch.from_numpy(d), None, 8)
    start = 4 if kind == "Q4_1" else 2
    nibbles = raw[..., start:start + 16]
    q = np.concatenate([nibbles & 0x0F, nibbles >> 4], -1).astype(np.int8) - 8
    m = raw[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float32) + 8 * d if kind == "Q4_1" else None
    return Blocks(torch.from_numpy(q.reshape(N, K)), torch.from_numpy(d), None if m is None else torch.from_numpy(m), 4)




def read_config(path: str | Path) -> ModelConfig:
    """The model's hyperparameters from its `<arch>.*` metadata (and the rope_freqs tensor, where it has one)."""
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
    model_type = ARCHITECTURES[arch]
    cfg = ModelConfig(
        vocab_size=hp("vocab_size", len(tokens) if tokens else None), hidden_size=hidden,
        intermediate_size=hp("feed_forward_length"), num_layers=hp("block_count"), num_heads=heads,
        num_kv_heads=hp("attention.head_count_kv", heads), head_dim=hp("attention.key_length", hidden // heads),
        max_position_embeddings=hp("context_length", 2048), rms_norm_eps=hp("attention.layer_norm_rms_epsilon", 1e-5),
        rope_theta=hp("rope.freq_base", 10000.0),
        rope_scaling=None if scaling == "none" else {"rope_type": "linear", "factor": hp("rope.scaling.factor")},
        rope_freq_factors=rope_factors(path, gguf_file),
        tie_word_embeddings="output.weight" not in names, model_type=model_type,
        qkv_bias="blk.0.attn_q.bias" in names and model_type != "llama", qk_norm="blk.0.attn_q_norm.weight" in names,
        bos_token_id=meta.get("tokenizer.ggml.bos_token_id"), eos_token_id=end_ids(meta),
        **sliding_layers(meta, arch, hp("block_count")))
    if arch == "llama" and cfg.has_sliding:
        cfg = dataclasses.replace(cfg, model_type="mistral")
    return gemma3_config(cfg, meta) if arch == "gemma3" else cfg


def sliding_layers(meta: dict, arch: str, layers: int) -> dict:
    """ModelConfig's sliding_window and layer_types from `<arch>.attention.sliding_window` and
    `.sliding_window_pattern` (a period: every period-th layer global; or a bool a layer, True sliding); without a
    pattern every layer slides, a gemma3 file's every 6th is global (llama.cpp's rule). None without a window."""
    window = meta.get(f"{arch}.attention.sliding_window")
    if not window:
        return {}
    pattern = meta.get(f"{arch}.attention.sliding_window_pattern", 6 if arch == "gemma3" else None)
    slides = [True] * layers if pattern is None else [bool(p) for p in pattern] if isinstance(pattern, list) \
        else [(i + 1) % pattern != 0 for i in range(layers)]
    return {"sliding_window": window, "layer_types": [SLIDING if s else FULL for s in slides]}


def rope_factors(path, gguf_file: GGUFFile) -> list[float] | None:
    """The rope_freqs tensor [head_dim/2] (llama.cpp's converter writes Llama 3's rope scaling so: each
    frequency divided by its factor), or None."""
    t = next((t for t in gguf_file.tensors if t.name == "rope_freqs.weight"), None)
    return None if t is None else dequantize(path, t).reshape(-1).tolist()


def gemma3_config(cfg: ModelConfig, meta: dict) -> ModelConfig:
    """A gemma3 file's config: Gemma's norms, GELU, scaled embeddings and soft-capping; its sliding layers' rotary
    base rope.freq_base_swa (llama.cpp: 10000); the attention scale as llama.cpp sets it (27B, the 62-layer one:
    hidden_size / heads, else head_dim)."""
    return dataclasses.replace(
        cfg, norm_offset=True, post_norms=True, hidden_act="gelu_pytorch_tanh", scale_embeddings=True,
        query_pre_attn_scalar=gemma3_attention_scalar(cfg),
        rope_local_theta=meta.get("gemma3.rope.freq_base_swa", 10000.0) if cfg.has_sliding else None,
        final_logit_softcapping=meta.get("gemma3.final_logit_softcapping"))


def gemma3_attention_scalar(cfg: ModelConfig) -> int:
    return cfg.hidden_size // cfg.num_heads if cfg.num_layers == 62 else cfg.head_dim


def end_ids(meta: dict) -> int | list[int] | None:
    """End of sequence, and end of turn where the file names another (Llama 3's <|eot_id|>)."""
    ids = [i for key in ("eos", "eot") if (i := meta.get(f"tokenizer.ggml.{key}_token_id")) is not None]
    ids = list(dict.fromkeys(ids))
    return ids[0] if len(ids) == 1 else ids or None


def read_gguf(path: str | Path, blocks: bool = False) -> GGUFCheckpoint:
    """`blocks`: the quantized matrices' blocks too (read_blocks), for a run that multiplies them as they are."""
    config = read_config(path)
    weights, kept = read_weights(path, config, blocks)
    return GGUFCheckpoint(config, file_to_hf(config, weights), read_tokenizer(path), kept)


def file_to_hf(cfg: ModelConfig, weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """read_weights' tensors (in place) as a HF checkpoint has them: Gemma's post-attention norm under its HF name,
    and its norms' weights w where the file holds 1 + w."""
    if cfg.model_type != "gemma3_text":
        return weights
    for name in [n for n in weights if f".{POST_ATTENTION}." in n]:
        weights[name.replace(POST_ATTENTION, "post_attention_layernorm")] = weights.pop(name)
    for name in [n for n in weights if n.endswith("norm.weight")]:
        weights[name] = weights[name] - 1
    return weights


def hf_to_file(cfg: ModelConfig, weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """file_to_hf's inverse, on a copy of the dict."""
    if cfg.model_type != "gemma3_text":
        return weights
    out = {}
    for name, w in weights.items():
        out[name.replace("post_attention_layernorm", POST_ATTENTION)] = w + 1 if name.endswith("norm.weight") else w
    return out


def read_weights(path: str | Path, cfg: ModelConfig, blocks: bool = False, vectors_only: bool = False,
                 also: frozenset[str] = frozenset()) -> tuple[dict[str, torch.Tensor], dict[str, Blocks]]:
    """The tensors by HF name in float32, and (`blocks`) the quantized matrices' blocks as they are; `vectors_only`:
    the 1-D tensors alone (norms, biases: the matrices run from the file, matrices()) and the matrices named in
    `also`."""
    hf_names = {gguf_name(n): n for n in hf_tensor_names(cfg)}
    weights, kept = {}, {}
    for t in open_gguf(path).tensors:
        name = hf_names.get(t.name)
        if name is None or vectors_only and len(t.shape) > 1 and name not in also:
            continue                          # rope_freqs and the like: recomputed
        weights[name], b = dequantized(path, cfg, t), read_blocks(t) if blocks else None
        heads = rope_heads(cfg, t.name)
        if heads and b is not None:
            b = b.rows(lambda x: unpermute_rope(x, heads))
        if b is not None:
            kept[name] = b
    return weights, kept


def dequantized(path: str | Path, cfg: ModelConfig, t: Tensor, dtype: torch.dtype = torch.float32,
                out: torch.Tensor | None = None) -> torch.Tensor:
    """A tensor of the file in `dtype` (dequantize), its rows in the model's order (rope_rows: q and k back from
    GGUF's), written into `out` where given; a matrix a few rows at a time, so no float32 copy of the whole is made
    for a 16-bit one."""
    if len(t.shape) == 1:
        return torch.from_numpy(dequantize(path, t)).view(t.shape).to(dtype)
    rows = rope_rows(cfg, t.name, t.shape[0])
    out = torch.empty(t.shape, dtype=dtype) if out is None else out
    for r0 in range(0, t.shape[0], 256):
        r1 = min(r0 + 256, t.shape[0])
        chunk = dataclasses.replace(t, shape=(r1 - r0, t.shape[1]), data=t.data[r0:r1] if rows is None else
                                    t.data[rows[r0:r1]])
        out[r0:r1] = torch.from_numpy(dequantize(path, chunk))
    return out


def matrices(path: str | Path, cfg: ModelConfig) -> dict[str, Tensor]:
    """The file's 2-D tensors the model reads, by HF name: its matrices, as they are in the file."""
    hf_names = {gguf_name(n): n for n in hf_tensor_names(cfg)}
    return {hf_names[t.name]: t for t in open_gguf(path).tensors if t.name in hf_names and len(t.shape) == 2}


def rope_heads(cfg: ModelConfig, name: str) -> int | None:
    """The heads of a q or k projection whose rows the file holds in GGUF's interleaved rope pairs (llama.cpp's
    converter permutes them for the Llama architecture, permute_rope), else None."""
    if cfg.model_type not in ("llama", "mistral"):
        return None
    return cfg.num_heads if name.endswith("attn_q.weight") else \
        cfg.num_kv_heads if name.endswith("attn_k.weight") else None


def rope_rows(cfg: ModelConfig, name: str, rows: int) -> np.ndarray | None:
    """For a q or k projection held in GGUF's rope order: the file row each of the model's rows reads (int32
    [rows]); else None."""
    heads = rope_heads(cfg, name)
    if heads is None:
        return None
    return unpermute_rope(torch.arange(rows, dtype=torch.int32)[:, None], heads)[:, 0].numpy()


# the float types in float32, from a tensor's bytes [rows, bytes a row], as gguf.quants.dequantize gives them
FLOATS = {"F32": lambda raw: raw.view(np.float32).astype(np.float32),         # (a copy: the map is read-only)
          "F16": lambda raw: raw.view(np.float16).astype(np.float32),
          "BF16": lambda raw: (raw.view(np.uint16).astype(np.uint32) << 16).view(np.float32)}    # float32's top half
C_DEQUANTIZED = {2, 3, 6, 7, 8, 10, 11, 12, 13, 14, 20, 23} | GRIDS.keys()   # Q4_0 ... Q8_0, Q2_K ... Q6_K, IQ4_NL,
                                                                            # IQ4_XS: csrc/blocks.c; GRIDS: grids.c


def dequantize(path, t: Tensor) -> np.ndarray:
    """A tensor's values in float32, as the `gguf` package computes them (through csrc/blocks.c where it builds: the
    same bits, without numpy's temporaries)."""
    name = tensor_type(t.kind)[0]
    if name in FLOATS:
        return FLOATS[name](np.asarray(t.data))
    lib = kernel_lib() if t.kind in C_DEQUANTIZED else None
    if lib is not None:
        hand_grid(lib, t.kind)
        raw = np.ascontiguousarray(t.data)
        out = np.empty(t.shape, np.float32)
        if lib.gguf_dequantize(t.kind, raw.ctypes.data, out.size, out.ctypes.data) == 0:
            return out
    import gguf
    try:
        data = gguf.quants.dequantize(t.data, gguf.GGMLQuantizationType(t.kind))
    except NotImplementedError:
        raise GGUFError(f"{path}: tensor {t.name} is {name}, which gguf {gguf_version()} cannot dequantize; "
                        f"F32, F16, BF16, Q4_0 ... Q8_0, the K-quants and IQ4_NL, IQ4_XS can be read") from None
    return np.array(data, dtype=np.float32, order="C")          # a copy: the map is read-only


def gguf_version() -> str:
    from importlib.metadata import version
    return version("gguf")


def read_tokenizer(path: str | Path) -> Tokenizer:
    """The file's tokenizer (read_file_tokenizer), read once per file and modification (the CLI checks a prompt
    with it before the model loads it again)."""
    path = Path(path)
    stat = path.stat() if path.is_file() else None
    return _tokenizer(path.resolve(), stat and (stat.st_size, stat.st_mtime_ns))


@functools.lru_cache(maxsize=4)
def _tokenizer(path: Path, stamp: tuple | None) -> Tokenizer:
    return read_file_tokenizer(path)


TOKENIZER_BUILD = 3         # the cached tokenizer's version (bpe_spec, spm_spec): one of another is made again


def read_file_tokenizer(path: str | Path) -> Tokenizer:
    """The tokenizer in `tokenizer.ggml.*` as a tokenizers Tokenizer: a byte-level BPE (`gpt2`) or SentencePiece's
    BPE (`llama`: spm_spec), with the file's chat template, special tokens and whether prompts begin with BOS.
    Built once per file and kept in specmesh's cache by the file's identity (path, size, modification time), its
    tokens' bytes too (Tokenizer.token_bytes): reading a large vocabulary's metadata and building its merges
    (Gemma's 262k pieces, 515k merges) takes seconds."""
    from tokenizers import Tokenizer as HFTokenizer
    path = Path(path).resolve()
    stat = path.stat()
    from specmesh.paths import cache_dir
    key = hashlib.sha256(f"{TOKENIZER_BUILD}:{path}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()[:20]
    base = cache_dir() / "tokenizers" / key
    spec_file, config_file = base.with_suffix(".json"), base.with_suffix(".config.json")
    try:                                        # the config is written last: where it is, the spec is whole
        config = json.loads(config_file.read_text(encoding="utf-8"))
        inner = HFTokenizer.from_file(str(spec_file))
    except Exception:                           # none cached, or unreadable (tokenizers raises Exception)
        spec, config = tokenizer_spec(path)
        inner = HFTokenizer.from_str(spec)
        write_whole(spec_file, spec.encode())
        write_whole(config_file, json.dumps(config).encode())
    return Tokenizer(inner, config, pieces_file=base.with_suffix(".pieces"))


def tokenizer_spec(path: Path) -> tuple[str, dict]:
    """The file's tokenizer.json and tokenizer config (read_file_tokenizer)."""
    meta = open_gguf(path).fields
    model = meta.get("tokenizer.ggml.model")
    if model not in ("gpt2", "llama"):
        raise GGUFError(f"{path}: tokenizer {model!r} is not supported (byte-level BPE, 'gpt2', and SentencePiece's "
                        f"BPE, 'llama', are)")
    tokens = meta.get("tokenizer.ggml.tokens")
    if not tokens:
        raise GGUFError(f"{path}: the file has no tokenizer.ggml.tokens")
    spec = bpe_spec(path, meta) if model == "gpt2" else spm_spec(meta)
    # llama.cpp's default: a SentencePiece vocabulary's prompts begin with BOS, a byte-level one's not
    config = {"chat_template": meta.get("tokenizer.chat_template"),
              "add_bos_token": bool(meta.get("tokenizer.ggml.add_bos_token", model == "llama"))}
    for key in ("bos", "eos", "eot"):
        i = meta.get(f"tokenizer.ggml.{key}_token_id")
        if i is not None and i < len(tokens):
            config[f"{key}_token"] = tokens[i]
    return json.dumps(spec), config


def bpe_spec(path, meta: dict) -> dict:
    """The byte-level BPE's tokenizer.json: control tokens special, user-defined ones added whole (as llama.cpp
    matches them), the pre-tokenizer llama.cpp uses for `tokenizer.ggml.pre`."""
    import gguf
    tokens, types = meta.get("tokenizer.ggml.tokens"), meta.get("tokenizer.ggml.token_type")
    rule = meta.get("tokenizer.ggml.pre", "default")
    pre = PRE_TOKENIZERS.get(rule)
    if pre is None:
        warnings.warn(f"{path}: pre-tokenizer {rule!r} is not known here; splitting as GPT-2 does")
        pre = GPT2
    alphabet = set(byte_level_alphabet().values())
    added = [added_token(i, t, kind == gguf.TokenType.CONTROL) for i, (t, kind) in enumerate(zip(tokens, types))
             if kind == gguf.TokenType.USER_DEFINED or kind == gguf.TokenType.CONTROL and set(t) <= alphabet]
    return {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added, "normalizer": None,
            "pre_tokenizer": pre, "post_processor": None,
            "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
            "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                      "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                      "vocab": {t: i for i, t in enumerate(tokens)},
                      "merges": [m.split(" ") for m in meta.get("tokenizer.ggml.merges", [])]}}


def added_token(i: int, content: str, special: bool) -> dict:
    return {"id": i, "content": content, "single_word": False, "lstrip": False, "rstrip": False,
            "normalized": False, "special": special}


SPACE = "\u2581"          # SentencePiece's visible space
def spm_spec(meta: dict) -> dict:
    """SentencePiece's BPE (`tokenizer.ggml.model` llama: pieces, scores, types, byte-fallback pieces <0xXX>, no
    merges) as a tokenizers BPE with byte fallback, built as transformers builds it from a GGUF file (its
    gguf_tokenizer_mapping): spaces as U+2581 (with a leading one where add_space_prefix says, Llama's), merges
    derived from the pieces (spm_merges), control pieces special and user-defined ones matched whole. A gemma file
    spells its whitespace-run pieces with real spaces, where its merges need U+2581 (they are then reached by
    merging, not matched whole), and ranks its merges by position rather than score."""
    import gguf
    spelled, scores, types = (meta.get(f"tokenizer.ggml.{k}") for k in ("tokens", "scores", "token_type"))
    gemma = meta.get("general.architecture", "").startswith("gemma")
    tokens = [SPACE * len(t) if gemma and " " in t and not t.strip() else t for t in spelled]
    vocab = {t: i for i, t in enumerate(tokens)}
    ranks = {t: -i for i, t in enumerate(tokens)} if gemma else dict(zip(tokens, scores or [0.0] * len(tokens)))
    unk = meta.get("tokenizer.ggml.unknown_token_id")
    prefix = bool(meta.get("tokenizer.ggml.add_space_prefix", not gemma))
    decoders = [{"type": "Replace", "pattern": {"String": SPACE}, "content": " "}, {"type": "ByteFallback"},
                {"type": "Fuse"}] + ([{"type": "Strip", "content": " ", "start": 1, "stop": 0}] if prefix else [])
    control, user = [], []
    for i, (t, kind) in enumerate(zip(tokens, types or [])):
        if kind == gguf.TokenType.CONTROL:
            control.append(added_token(i, t, True))
        elif kind == gguf.TokenType.USER_DEFINED and t == spelled[i] and vocab.get(t) == i:   # respelled: merged to
            user.append(added_token(i, t, False))
    return {"version": "1.0", "truncation": None, "padding": None, "added_tokens": control + user,
            "normalizer": {"type": "Replace", "pattern": {"String": " "}, "content": SPACE} if gemma else None,
            "pre_tokenizer": {"type": "Split", "pattern": {"String": " "}, "behavior": "MergedWithPrevious",
                              "invert": False} if gemma else
            {"type": "Metaspace", "replacement": SPACE, "prepend_scheme": "first" if prefix else "never",
             "split": False},
            "post_processor": None, "decoder": {"type": "Sequence", "decoders": decoders},
            "model": {"type": "BPE", "dropout": None, "unk_token": None if unk is None else tokens[unk],
                      "continuing_subword_prefix": None, "end_of_word_suffix": None, "fuse_unk": True,
                      "byte_fallback": True, "ignore_merges": False, "vocab": vocab, "merges": spm_merges(vocab, ranks)}}


def spm_merges(vocab: dict[str, int], ranks: dict[str, float]) -> list[list[str]]:
    """BPE merges equivalent to SentencePiece's rule (merge the adjacent pair whose join is the best-ranked piece):
    every split of a piece into two pieces, best-ranked join first; a join's splits in vocabulary order, and among
    equal ranks the longer left part first (transformers' generate_merges)."""
    merges = []
    for piece, rank in ranks.items():
        local = [(piece[:k], piece[k:]) for k in range(1, len(piece)) if piece[:k] in vocab and piece[k:] in vocab]
        local.sort(key=lambda m: (vocab[m[0]], vocab[m[1]]))
        merges += [(rank, len(a), len(b), a, b) for a, b in local]
    merges.sort(key=lambda m: m[:3], reverse=True)
    return [[a, b] for _, _, _, a, b in merges]


# -- names and rope order ------------------------------------------------------------------------
def hf_tensor_names(cfg: ModelConfig) -> list[str]:
    """The tensors a model of this config reads from a GGUF file, by HF name (Gemma's post-attention norm under
    POST_ATTENTION: file_to_hf)."""
    layers = [f"model.layers.{i}.{inner}" for i in range(cfg.num_layers) for inner in layer_tensors(cfg)]
    return [*TOP_NAMES, *layers]


def layer_tensors(cfg: ModelConfig) -> list[str]:
    """A layer's tensors (HF names after model.layers.N.) of this config."""
    inner = ["input_layernorm", "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
             "post_attention_layernorm", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"]
    if cfg.qk_norm:
        inner += ["self_attn.q_norm", "self_attn.k_norm"]
    if cfg.post_norms:
        inner = [POST_ATTENTION if n == "post_attention_layernorm" else n for n in inner]
        inner += ["pre_feedforward_layernorm", "post_feedforward_layernorm"]
    names = [f"{n}.weight" for n in inner]
    if cfg.qkv_bias and cfg.model_type != "llama":     # the llama architecture's would be in GGUF's rope order
        names += [f"self_attn.{x}_proj.bias" for x in "qkv"]
    return names


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
    checkpoint so. The architecture is the config's (GGUF_ARCHITECTURES)."""
    import gguf
    if cfg.model_type not in GGUF_ARCHITECTURES:
        raise GGUFError(f"model_type {cfg.model_type!r} has no GGUF architecture here; supported: "
                        f"{', '.join(GGUF_ARCHITECTURES)}")
    writer = gguf.GGUFWriter(str(out), GGUF_ARCHITECTURES[cfg.model_type])
    for key, name in HPARAMS.items():
        getattr(writer, f"add_{key}")(getattr(cfg, name))
    write_architecture(writer, cfg)
    spec = json.loads(tokenizer.inner.to_str())
    if spec["model"].get("byte_fallback"):
        write_spm_tokenizer(writer, cfg, spec, tokenizer.bos_id is not None)
    else:
        write_tokenizer(writer, cfg, spec, pre_name(tokenizer))
    if tokenizer.chat_template:
        writer.add_chat_template(tokenizer.chat_template)
    write_tensors(writer, cfg, weights, ftype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


def write_architecture(writer: gguf.GGUFWriter, cfg: ModelConfig) -> None:
    """What read_config reads beyond HPARAMS: linear rope scaling (llama3's: write_tensors' rope_freqs), the
    sliding window and its layers (a bool a layer), and Gemma 3's sliding rotary base and logit soft-cap. An
    attention scale llama.cpp would not set is refused."""
    import gguf
    kind = cfg.rope_scaling and (cfg.rope_scaling.get("rope_type") or cfg.rope_scaling.get("type"))
    if kind == "linear":
        writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(cfg.rope_scaling["factor"])
    if cfg.has_sliding:
        writer.add_sliding_window(cfg.sliding_window)
        writer.add_sliding_window_pattern([cfg.sliding(i) for i in range(cfg.num_layers)])
    if cfg.model_type != "gemma3_text":
        return
    if cfg.query_pre_attn_scalar != gemma3_attention_scalar(cfg):
        raise GGUFError(f"a gemma3 GGUF file's attention scale is 1/sqrt({gemma3_attention_scalar(cfg)}) "
                        f"(llama.cpp's), not 1/sqrt({cfg.query_pre_attn_scalar})")
    if cfg.has_sliding:
        writer.add_rope_freq_base_swa(cfg.rope_local_theta or cfg.rope_theta)
    if cfg.final_logit_softcapping is not None:
        writer.add_final_logit_softcapping(cfg.final_logit_softcapping)


def write_tokenizer(writer: gguf.GGUFWriter, cfg: ModelConfig, tok: dict, pre: str) -> None:
    """The byte-level BPE of a tokenizer.json as GGUF's gpt2 tokenizer, split by llama.cpp's rule `pre`."""
    import gguf
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
    write_special_ids(writer, cfg)


def write_special_ids(writer: gguf.GGUFWriter, cfg: ModelConfig) -> None:
    """The config's BOS, and its end of sequence and of turn (read back by end_ids)."""
    if cfg.bos_token_id is not None:
        writer.add_bos_token_id(cfg.bos_token_id)
    ends = cfg.eos_ids
    if ends:
        writer.add_eos_token_id(ends[0])
    if len(ends) > 1:
        writer.add_eot_token_id(ends[1])


def write_spm_tokenizer(writer: gguf.GGUFWriter, cfg: ModelConfig, tok: dict, bos: bool) -> None:
    """A byte-fallback BPE's tokenizer.json (spm_spec's, or a folder's SentencePiece one) as GGUF's llama tokenizer:
    its pieces by id; control pieces (special added tokens), user-defined ones (other added tokens), byte pieces
    <0xXX>; scores falling with the id (the merges spm_spec derives again: their order is the pieces')."""
    import gguf
    vocab = tok["model"]["vocab"]
    pieces = sorted(vocab, key=vocab.get)
    added = {t["id"]: t["special"] for t in tok.get("added_tokens", [])}
    T = gguf.TokenType
    types = [T.CONTROL if added.get(i) else T.USER_DEFINED if i in added else
             T.BYTE if len(p) == 6 and p.startswith("<0x") and p.endswith(">") else T.NORMAL
             for i, p in enumerate(pieces)]
    scores = [0.0 if k == T.BYTE else -1000.0 if k != T.NORMAL else -float(i) for i, k in enumerate(types)]
    writer.add_tokenizer_model("llama")
    writer.add_token_list(pieces)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_add_bos_token(bos)
    writer.add_add_space_prefix((tok.get("pre_tokenizer") or {}).get("prepend_scheme", "never") != "never")
    unk = tok["model"].get("unk_token")
    if unk in vocab:
        writer.add_unk_token_id(vocab[unk])
    write_special_ids(writer, cfg)


def write_tensors(writer: gguf.GGUFWriter, cfg: ModelConfig, weights: dict[str, torch.Tensor], ftype: str) -> None:
    """Norms in float32; matrices in bf16, f16, float32, Q8_0, Q4_0 or Q4_1 (the embedding table in bf16 then, as
    specmesh keeps it); q and k rows in GGUF's rope order."""
    import gguf
    if cfg.tie_word_embeddings and "lm_head.weight" not in weights:
        weights["lm_head.weight"] = weights["model.embed_tokens.weight"]     # llama.cpp then reads output.weight
    weights = hf_to_file(cfg, weights)
    if cfg.rope_scaling is not None and cfg.rope_scaling.get("rope_type") == "llama3" or cfg.rope_freq_factors:
        writer.add_tensor("rope_freqs.weight", llama3_factors(cfg).numpy())
    rope_order = GGUF_ARCHITECTURES[cfg.model_type] == "llama"       # llama.cpp's llama rotates interleaved pairs
    Q = gguf.GGMLQuantizationType
    qtype = {"bf16": Q.BF16, "f16": Q.F16, "f32": Q.F32, "q8_0": Q.Q8_0, "q4_0": Q.Q4_0, "q4_1": Q.Q4_1}[ftype]
    for hf_name, w in weights.items():
        name = gguf_name(hf_name)
        if name is None:
            continue
        w = w.float()
        if rope_order and name.endswith("attn_q.weight"):
            w = permute_rope(w, cfg.num_heads)
        elif rope_order and name.endswith("attn_k.weight"):
            w = permute_rope(w, cfg.num_kv_heads)
        if w.dim() == 1 or qtype == Q.F32:
            writer.add_tensor(name, w.numpy())
        elif qtype == Q.F16:
            writer.add_tensor(name, w.half().numpy())
        elif qtype in (Q.Q8_0, Q.Q4_0, Q.Q4_1) and name != "token_embd.weight":
            writer.add_tensor(name, gguf.quants.quantize(w.numpy(), qtype), raw_dtype=qtype)
        else:
            writer.add_tensor(name, w.to(torch.bfloat16).view(torch.uint16).numpy(), raw_dtype=Q.BF16)


def llama3_factors(cfg: ModelConfig) -> torch.Tensor:
    """The rope_freqs tensor [head_dim/2] llama.cpp's converter writes for llama3 rope scaling (1 for short waves,
    the factor for long ones, between them 1 / ((1 - s) / factor + s)); a file's own where the config came from one."""
    if cfg.rope_freq_factors is not None:
        return torch.tensor(cfg.rope_freq_factors, dtype=torch.float32)
    s = cfg.rope_scaling
    factor, low, high, old = s["factor"], s["low_freq_factor"], s["high_freq_factor"], s["original_max_position_embeddings"]
    out = []
    for freq in (1.0 / cfg.rope_theta ** (torch.arange(0, cfg.head_dim, 2, dtype=torch.float32) / cfg.head_dim)).tolist():
        wavelen = 2 * math.pi / freq
        smooth = (old / wavelen - low) / (high - low)
        out.append(1.0 if wavelen < old / high else factor if wavelen > old / low else 1 / ((1 - smooth) / factor + smooth))
    return torch.tensor(out, dtype=torch.float32)
