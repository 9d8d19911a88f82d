"""A compact Llama-family decoder (Llama 2/3, Qwen2, Qwen3, Mistral, TinyLlama, Gemma 3).

RMSNorm, rotary embeddings (default, linear and llama3 scaling), grouped-query
attention, SwiGLU MLP, optional q/k/v bias, tied or untied embeddings. Projections
are fused (qkv, gate_up) for fewer kernel launches; the loader splits/joins them
to and from the HuggingFace layout. What the other architectures add, each a
ModelConfig field: q/k norms per head (Qwen3, Gemma 3), sliding-window layers with
their own rotary base (Mistral, Gemma 3), and Gemma's (1 + w) norms, norms after
the attention and the MLP, GELU gate, scaled embeddings, attention scale and logit
soft-capping. The plain Llama block (ModelConfig.plain_block) is what csrc/ runs.

`Transformer.forward` runs any contiguous range of layers: the embedding only on
layer 0, the final norm and the LM head only on the last layer. That is what
pipeline stages (PipeDec) and layer-parallel drafting (EasySpec) build on.
"""
from __future__ import annotations

import functools
import math
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import asdict, dataclass, replace

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from specmesh.model.cache import KVCache
from specmesh.model.execution import WHOLE, Batch, Execution, FastForward

ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "mistral": "MistralForCausalLM",
                 "qwen3": "Qwen3ForCausalLM", "gemma3_text": "Gemma3ForCausalLM"}
SLIDING, FULL = "sliding_attention", "full_attention"       # HF's layer_types
ACTIVATIONS = {"silu": F.silu, "gelu_pytorch_tanh": functools.partial(F.gelu, approximate="tanh")}   # the MLP's gate


class UnsupportedModelError(ValueError):
    pass


@dataclass
class ModelConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    max_position_embeddings: int = 2048
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    tie_word_embeddings: bool = False
    model_type: str = "llama"
    bos_token_id: int | None = None
    eos_token_id: int | list[int] | None = None
    qk_norm: bool = False                   # an RMSNorm over each q and k head [head_dim] before rotary (Qwen3, Gemma)
    norm_offset: bool = False               # RMSNorm scales by 1 + w, in float32 (Gemma)
    post_norms: bool = False                # norms of the attention's and the MLP's outputs too (Gemma)
    hidden_act: str = "silu"                # the MLP's gate: a key of ACTIVATIONS
    scale_embeddings: bool = False          # embeddings times sqrt(hidden_size), in their dtype (Gemma)
    query_pre_attn_scalar: float | None = None      # attention scores scaled by its -1/2 power; None: head_dim's
    sliding_window: int | None = None       # a sliding layer's token attends its last this many positions (itself too)
    layer_types: list[str] | None = None    # per layer SLIDING or FULL; None: every layer FULL
    rope_local_theta: float | None = None   # the sliding layers' rotary base, unscaled (Gemma 3); None: rope_theta's
    rope_freq_factors: list[float] | None = None    # inverse frequencies divided by these [head_dim/2] (GGUF's rope_freqs)
    final_logit_softcapping: float | None = None    # logits -> c tanh(logits / c)

    @classmethod
    def from_hf(cls, cfg: dict) -> "ModelConfig":
        """Read a HuggingFace `config.json` dict (transformers 4.x and 5.x spellings)."""
        model_type = cfg.get("model_type")
        if model_type not in ARCHITECTURES:
            raise UnsupportedModelError(
                f"unsupported model_type {model_type!r}; supported: {', '.join(sorted(ARCHITECTURES))}")
        archs = cfg.get("architectures") or [ARCHITECTURES[model_type]]
        if archs[0] not in ARCHITECTURES.values():
            raise UnsupportedModelError(
                f"unsupported architecture {archs[0]!r}; supported: {', '.join(sorted(ARCHITECTURES.values()))}")
        heads, hidden = cfg["num_attention_heads"], cfg["hidden_size"]
        rope_theta, scaling, local_theta = hf_rope(cfg)
        window, layer_types = hf_layer_types(cfg, model_type)
        attention_bias = cfg.get("attention_bias", False)
        act = cfg.get("hidden_activation") or cfg.get("hidden_act") or "silu"
        if act not in ACTIVATIONS:
            raise UnsupportedModelError(f"unsupported hidden activation {act!r}; supported: {', '.join(ACTIVATIONS)}")
        return cls(
            vocab_size=cfg["vocab_size"], hidden_size=hidden, intermediate_size=cfg["intermediate_size"],
            num_layers=cfg["num_hidden_layers"], num_heads=heads,
            num_kv_heads=cfg.get("num_key_value_heads") or heads,
            head_dim=cfg.get("head_dim") or hidden // heads,
            max_position_embeddings=cfg.get("max_position_embeddings", 2048),
            rms_norm_eps=cfg.get("rms_norm_eps", 1e-6), rope_theta=rope_theta, rope_scaling=scaling,
            qkv_bias=model_type == "qwen2" or attention_bias, o_bias=model_type != "qwen2" and attention_bias,
            mlp_bias=cfg.get("mlp_bias", False), tie_word_embeddings=cfg.get("tie_word_embeddings", False),
            model_type=model_type, bos_token_id=cfg.get("bos_token_id"), eos_token_id=cfg.get("eos_token_id"),
            qk_norm=model_type in ("qwen3", "gemma3_text"), hidden_act=act, sliding_window=window,
            layer_types=layer_types, rope_local_theta=local_theta, **hf_gemma(cfg, model_type))

    def to_hf(self) -> dict:
        """A `config.json` dict that transformers' AutoModelForCausalLM loads."""
        if self.rope_freq_factors is not None:
            raise UnsupportedModelError("per-dimension rotary factors (a GGUF file's rope_freqs) have no "
                                        "HuggingFace config form")
        cfg = {
            "architectures": [ARCHITECTURES[self.model_type]], "model_type": self.model_type,
            "vocab_size": self.vocab_size, "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size, "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads, "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim, "max_position_embeddings": self.max_position_embeddings,
            "rms_norm_eps": self.rms_norm_eps, "rope_theta": self.rope_theta, "rope_scaling": self.rope_scaling,
            "hidden_act": self.hidden_act, "tie_word_embeddings": self.tie_word_embeddings,
            "bos_token_id": self.bos_token_id, "eos_token_id": self.eos_token_id,
        }
        if self.model_type in ("llama", "qwen3"):
            cfg.update(attention_bias=self.o_bias)
        if self.model_type == "llama":
            cfg.update(mlp_bias=self.mlp_bias)
        if self.sliding_window is not None:
            cfg.update(sliding_window=self.sliding_window, layer_types=self.layer_types,
                       use_sliding_window=self.model_type in ("qwen2", "qwen3"))
        elif self.model_type != "llama":
            cfg.update(sliding_window=None)
        if self.model_type == "gemma3_text":
            cfg.update(hidden_activation=self.hidden_act, query_pre_attn_scalar=self.query_pre_attn_scalar,
                       rope_local_base_freq=self.rope_local_theta, final_logit_softcapping=self.final_logit_softcapping,
                       attn_logit_softcapping=None)
        return cfg

    def sliding(self, layer: int) -> bool:
        """Whether `layer` attends within the sliding window."""
        return self.sliding_window is not None and self.layer_types is not None and self.layer_types[layer] == SLIDING

    @property
    def has_sliding(self) -> bool:
        return any(self.sliding(i) for i in range(self.num_layers))

    @property
    def plain_block(self) -> bool:
        """Whether the model is the plain Llama block and ends that csrc/ runs whole (model/c_forward.py's CBlock and
        CForward): none of the q/k norms, Gemma's norms, GELU, embedding scale, attention scale, soft-capping, or
        sliding windows."""
        return not (self.qk_norm or self.norm_offset or self.post_norms or self.hidden_act != "silu"
                    or self.scale_embeddings or self.query_pre_attn_scalar is not None or self.has_sliding
                    or self.final_logit_softcapping is not None)

    @property
    def eos_ids(self) -> list[int]:
        eos = self.eos_token_id
        return [] if eos is None else [eos] if isinstance(eos, int) else list(eos)

    def asdict(self) -> dict:
        return asdict(self)


def hf_rope(cfg: dict) -> tuple[float, dict | None, float | None]:
    """(rope_theta, rope_scaling or None, the sliding layers' own base or None) of a HF config: transformers 4's
    rope_theta / rope_scaling / rope_local_base_freq, or 5's rope_parameters (for Gemma 3 one dict per layer type)."""
    rope = dict(cfg.get("rope_parameters") or {})  # transformers 5 keeps theta and scaling here
    local_theta = cfg.get("rope_local_base_freq")
    if FULL in rope:                                # ... by layer type
        local_theta = (rope.get(SLIDING) or {}).get("rope_theta", local_theta)
        rope = dict(rope[FULL])
    rope_theta = cfg.get("rope_theta", rope.get("rope_theta", 10000.0))
    scaling = cfg.get("rope_scaling") or rope
    if (scaling.get("rope_type") or scaling.get("type") or "default") == "default":
        scaling = None
    return rope_theta, scaling, local_theta


def hf_layer_types(cfg: dict, model_type: str) -> tuple[int | None, list[str] | None]:
    """(sliding_window, layer_types), or (None, None) where no layer slides: HF's layer_types where the config lists
    them, else as each model's config class derives them (Gemma 3: every sliding_window_pattern-th layer full;
    Qwen: layers from max_window_layers on slide, with use_sliding_window; Mistral: all)."""
    window, n = cfg.get("sliding_window"), cfg["num_hidden_layers"]
    if model_type == "llama" or model_type in ("qwen2", "qwen3") and not cfg.get("use_sliding_window"):
        window = None
    if window is None:
        return None, None
    types = cfg.get("layer_types")
    if types is None and model_type == "gemma3_text":
        pattern = cfg.get("sliding_window_pattern", 6)
        types = [SLIDING if (i + 1) % pattern else FULL for i in range(n)]
    elif types is None and model_type in ("qwen2", "qwen3"):
        types = [SLIDING if i >= cfg.get("max_window_layers", n) else FULL for i in range(n)]
    elif types is None:
        types = [SLIDING] * n
    return (window, list(types)) if SLIDING in types else (None, None)


def hf_gemma(cfg: dict, model_type: str) -> dict:
    """ModelConfig's Gemma 3 fields from its HF config; none for the other models."""
    if model_type != "gemma3_text":
        return {}
    if cfg.get("attn_logit_softcapping") is not None or cfg.get("use_bidirectional_attention"):
        raise UnsupportedModelError("Gemma 3 with attention soft-capping or bidirectional attention is not supported")
    return dict(norm_offset=True, post_norms=True, scale_embeddings=True,
                query_pre_attn_scalar=cfg.get("query_pre_attn_scalar", 256),
                final_logit_softcapping=cfg.get("final_logit_softcapping"))


def rope_inv_freq(cfg: ModelConfig, local: bool = False) -> torch.Tensor:
    """Rotary inverse frequencies [head_dim/2], with per-dimension factors (GGUF's), linear or llama3 scaling;
    `local`: the sliding layers' (Gemma 3: their own base, unscaled). On the CPU, also where the model is built on
    the meta device (arithmetic there imports torch._dynamo: 1.5 s of every start-up)."""
    dim = cfg.head_dim
    theta = cfg.rope_local_theta if local else cfg.rope_theta
    inv = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.int64, device="cpu").float() / dim))
    if local:
        return inv
    if cfg.rope_freq_factors is not None:       # llama.cpp's form of llama3 scaling: theta_i = base^(-2i/d) / f_i
        inv = inv / torch.tensor(cfg.rope_freq_factors, dtype=torch.float32, device="cpu")
    s = cfg.rope_scaling
    if s is None:
        return inv
    kind = s.get("rope_type") or s.get("type")
    if kind == "linear":
        return inv / s["factor"]
    if kind != "llama3":
        raise UnsupportedModelError(f"unsupported rope_scaling type {kind!r}; supported: linear, llama3")
    factor, low, high = s["factor"], s["low_freq_factor"], s["high_freq_factor"]
    old_ctx = s["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv
    scaled = torch.where(wavelen > old_ctx / low, inv / factor, inv)   # long waves: divide by factor
    smooth = (old_ctx / wavelen - low) / (high - low)                 # medium waves: interpolate
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= old_ctx / high) & (wavelen <= old_ctx / low)
    return torch.where(medium, smoothed, scaled)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Apply rotary embedding (HF's rotate-half convention). x [B,T,H,hd], cos/sin [B,T,1,hd]."""
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.weight * rms_normalized(x, self.eps)


class GemmaRMSNorm(nn.Module):
    """RMSNorm scaled by 1 + w, all in float32 and then cast (HF's Gemma3RMSNorm). Its weight is HF's w (a GGUF file
    stores 1 + w: model/gguf.py takes the 1 off)."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.zeros(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float()
        return (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps) * (1.0 + self.weight.float())).to(x.dtype)


def make_norm(cfg: ModelConfig, dim: int) -> nn.Module:
    return (GemmaRMSNorm if cfg.norm_offset else RMSNorm)(dim, cfg.rms_norm_eps)


def rms_normalized(x: torch.Tensor, eps: float) -> torch.Tensor:
    """x / rms(x) in x's dtype, before RMSNorm's weight. HF's op order (in float32, then cast back); on CPU faster
    than F.rms_norm for one row."""
    h = x.float()
    return (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


PREFILL_TOKENS = 64     # forwards of more tokens (prefills) may attend in a 16-bit dtype (Attention.prefill_dtype)
# On CUDA, PyTorch prefers cuDNN's attention where it can (Hopper), and cuDNN builds a new plan for every key
# length, that is at every decoding step: milliseconds of host time a call.
# The other backends plan nothing.
CUDA_ATTENTION = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
              prefill_dtype: torch.dtype | None = None, scale: float | None = None) -> torch.Tensor:
    """softmax(q k^T scale) v for q [B,H,T,hd] over k, v [B,Hkv,S,hd] -> [B,T,H*hd] in q's dtype; scale None:
    1 / sqrt(hd).
    mask [B,1,T,S] (True = attend), or None: causal among the new tokens (a first prefill,
    training), or one token seeing every key. Attends in the wider of q's and the cache's dtypes
    (Transformer.cache_dtype), or in prefill_dtype for more than PREFILL_TOKENS queries."""
    B, H, T, hd = q.shape
    dtype = prefill_dtype if prefill_dtype is not None and T > PREFILL_TOKENS else torch.promote_types(q.dtype, k.dtype)
    with sdpa_kernel(CUDA_ATTENTION) if q.is_cuda else nullcontext():
        out = F.scaled_dot_product_attention(q.to(dtype), k.to(dtype), v.to(dtype), attn_mask=mask,
                                             is_causal=mask is None and T > 1, enable_gqa=H != k.shape[1],
                                             scale=scale)
    return out.to(q.dtype).transpose(1, 2).reshape(B, T, H * hd)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__()
        self.layer = layer
        self.h, self.hkv, self.hd = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.qkv = nn.Linear(cfg.hidden_size, (self.h + 2 * self.hkv) * self.hd, bias=cfg.qkv_bias)
        self.o = nn.Linear(self.h * self.hd, cfg.hidden_size, bias=cfg.o_bias)
        self.prefill_dtype: torch.dtype | None = None  # the kernels: forwards of > PREFILL_TOKENS attend in it
        # Qwen3, Gemma 3: q and k heads each RMS-normalized [head_dim] before rotary (one weight for all heads)
        self.q_norm = make_norm(cfg, self.hd) if cfg.qk_norm else None
        self.k_norm = make_norm(cfg, self.hd) if cfg.qk_norm else None
        self.scale = None if cfg.query_pre_attn_scalar is None else cfg.query_pre_attn_scalar ** -0.5

    def forward(self, x, cos, sin, cache: KVCache | None, mask: torch.Tensor | None) -> torch.Tensor:
        B, T, _ = x.shape
        qkv = self.qkv(x).view(B, T, self.h + 2 * self.hkv, self.hd)
        qk = rotate(self.normed(qkv[:, :, :self.h + self.hkv]), cos, sin).transpose(1, 2)   # q and k heads at once
        q, k = qk[:, :self.h], qk[:, self.h:]                                   # [B,H,T,hd], [B,Hkv,T,hd]
        v = qkv[:, :, self.h + self.hkv:].transpose(1, 2)
        if cache is not None:
            k, v = cache.write(self.layer, k, v)                                 # [B,Hkv,S,hd]
        return self.o(attention(q, k, v, mask, self.prefill_dtype, self.scale))

    def normed(self, qk: torch.Tensor) -> torch.Tensor:
        """The q and k heads [B,T,H+Hkv,hd] through their norms, where the model has them."""
        if self.q_norm is None:
            return qk
        return torch.cat((self.q_norm(qk[:, :, :self.h]), self.k_norm(qk[:, :, self.h:])), dim=2)


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.gate_up = nn.Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=cfg.mlp_bias)
        self.down = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=cfg.mlp_bias)
        self.act = ACTIVATIONS[cfg.hidden_act]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up(x).chunk(2, dim=-1)
        return self.down(self.act(gate) * up)


def unchanged(x: torch.Tensor) -> torch.Tensor:
    return x


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__()
        self.attn_norm = make_norm(cfg, cfg.hidden_size)
        self.attn = Attention(cfg, layer)
        self.mlp_norm = make_norm(cfg, cfg.hidden_size)
        self.mlp = MLP(cfg)
        # Gemma: the attention's and the MLP's outputs normalized too, before they join the residual; else as they are
        self.attn_post_norm = make_norm(cfg, cfg.hidden_size) if cfg.post_norms else unchanged
        self.mlp_post_norm = make_norm(cfg, cfg.hidden_size) if cfg.post_norms else unchanged
        # a tensor-parallel shard's attention and MLP give this rank's part of their output: all_reduce sums
        # the parts over the ranks (Execution.all_reduce); one process: the output as it is
        self.all_reduce: Callable[[torch.Tensor], torch.Tensor] = unchanged

    def reduce_with(self, all_reduce: Callable[[torch.Tensor], torch.Tensor], c_reduce: int | None) -> None:
        """Its outputs summed over ranks by `all_reduce` (Transformer.run_on; the C blocks: `c_reduce`)."""
        self.all_reduce = all_reduce

    def forward(self, x, cos, sin, cache, mask):
        x = x + self.attn_post_norm(self.all_reduce(self.attn(self.attn_norm(x), cos, sin, cache, mask)))
        return x + self.mlp_post_norm(self.all_reduce(self.mlp(self.mlp_norm(x))))


def layer_parallel(blocks: list[nn.Module], h: torch.Tensor, cos, sin, cache: KVCache | None,
                   mask: torch.Tensor | None) -> torch.Tensor:
    """A group of consecutive blocks run as EasySpec's hyper-layer (Wu et al., NeurIPS 2025, Algorithm 2):
    every attention reads the group's input h (not its own layer's input), so the attentions are independent
    of each other (one device each, or computed together); the MLPs then run in order on the attention
    outputs added in order: h' = h_j + A_j(h), h_{j+1} = h' + MLP_j(h'). The keys and values written are
    "fuzzy" (not those of the exact forward). A one-block group is the block."""
    parts = [getattr(b, "block", b) for b in blocks]           # kernels wrap a Block (model/c_forward.py)
    together = len(parts) > 1 and all(isinstance(p.attn.qkv, nn.Linear) for p in parts) \
        and all(type(p.attn_norm) is RMSNorm and p.attn.q_norm is None and p.attn.scale is None for p in parts)
    outs = (group_attention(parts, h, cos, sin, cache, mask) if together    # not packed (kernels), plain attention
            else [p.attn(p.attn_norm(h), cos, sin, cache, mask) for p in parts])
    for p, a in zip(parts, outs):
        h = h + p.attn_post_norm(a)
        h = h + p.mlp_post_norm(p.mlp(p.mlp_norm(h)))
    return h


def group_attention(parts: list[Block], h: torch.Tensor, cos, sin, cache: KVCache | None,
                    mask: torch.Tensor | None) -> list[torch.Tensor]:
    """The g attentions of a layer-parallel group computed together, as g [B,T,D] outputs. They all read h, so
    they are one attention with g times the heads: one normalisation (each layer's norm weight folded into its
    projection), one product for every layer's q, k and v, rotary, cache write and attention once, the heads
    layer-major (query head l*H + j reads key head l*Hkv + j // (H/Hkv), its own layer's), and one batched
    product for the g output projections. Where exact drafting makes g of each launch, this makes one
    (EasySpec's one-device gain: a small draft on a GPU is bound by its launches)."""
    a0, g, (B, T, D) = parts[0].attn, len(parts), h.shape
    H, Hkv = g * a0.h, g * a0.hkv                               # the group's heads
    qkv_w, qkv_b, o_w, o_b = stacked_attention(parts)
    qkv = torch.mm(rms_normalized(h, parts[0].attn_norm.eps).view(B * T, D), qkv_w)
    qkv = (qkv if qkv_b is None else qkv + qkv_b).view(B, T, H + 2 * Hkv, a0.hd)   # every q, then every k, v
    qk = rotate(qkv[:, :, :H + Hkv], cos, sin).transpose(1, 2)
    q, k, v = qk[:, :H], qk[:, H:], qkv[:, :, H + Hkv:].transpose(1, 2)           # [B, heads, T, hd]
    if cache is not None:                               # each layer's entries; keys [B, Hkv, S, hd] again
        k, v = cache.write_group(range(a0.layer, a0.layer + g), k, v)
    out = attention(q, k, v, mask, a0.prefill_dtype).view(B * T, g, -1).transpose(0, 1)   # [g, B*T, H/g*hd]
    out = torch.bmm(out, o_w)                                                           # [g, B*T, D]
    return list((out if o_b is None else out + o_b).view(g, B, T, D))


def stacked_attention(parts: list[Block]) -> tuple[torch.Tensor | None, ...]:
    """The group's attention weights as group_attention multiplies them: qkv [D, g*N] (each layer's norm
    weight folded in, W diag(w), computed in float32; columns every layer's q, then every k, then every v)
    and its bias [g*N], o [g, H*hd, D] and its bias [g, 1, D] (None without biases); made once, and again when
    a weight changes (training) or is replaced (its storage or version counter differs)."""
    weights = [(p.attn_norm.weight, p.attn.qkv.weight, p.attn.qkv.bias, p.attn.o.weight, p.attn.o.bias)
               for p in parts]
    key = tuple((w.data_ptr(), w._version) for ws in weights for w in ws if w is not None)
    held = parts[0].__dict__.get("_stacked")
    if held is None or held[0] != key:
        a0 = parts[0].attn
        split = [a0.h * a0.hd, a0.hkv * a0.hd, a0.hkv * a0.hd]            # q, k, v rows of a layer's qkv
        by_kind = lambda ts: torch.cat([t for kind in zip(*(t.split(split) for t in ts)) for t in kind])
        norm, qkv_w, qkv_b, o_w, o_b = zip(*weights)
        with torch.no_grad():
            folded = [(w.float() * n.float()).to(w.dtype) for w, n in zip(qkv_w, norm)]     # [N, D] each
            held = key, (by_kind(folded).t().contiguous(), None if qkv_b[0] is None else by_kind(qkv_b),
                         torch.stack(o_w).transpose(1, 2).contiguous(),
                         None if o_b[0] is None else torch.stack(o_b)[:, None])
        parts[0].__dict__["_stacked"] = held
    return held[1]


def causal_window(T: int, window: int, device) -> torch.Tensor | None:
    """The mask [1,1,T,T] of a sliding layer's forward from position 0 (True = attend): token i sees j in
    (i - window, i]; None (plain causal) where T <= window."""
    if T <= window:
        return None
    i = torch.arange(T, device=device)
    offset = i[:, None] - i[None, :]
    return ((offset >= 0) & (offset < window))[None, None]


def one_kind(groups: list[range] | None, cfg: ModelConfig) -> list[range] | None:
    """Layer-parallel groups split where the layers' kind (sliding or global) changes: a group's attentions share
    one rotary and mask."""
    if groups is None or not cfg.has_sliding:
        return groups
    out = []
    for g in groups:
        start = g.start
        for i in range(g.start + 1, g.stop):
            if cfg.sliding(i) != cfg.sliding(i - 1):
                out.append(range(start, i))
                start = i
        out.append(range(start, g.stop))
    return out


class Transformer(nn.Module):
    quant: str | None = None            # the quantization its weights were loaded with (model/quant.py)

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.config = cfg
        weight = torch.empty(cfg.vocab_size, cfg.hidden_size)   # on the meta device when loading: no init there,
        if not weight.is_meta:                                  # which would import torch._dynamo (1.5 s)
            nn.init.normal_(weight)
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size, _weight=weight)
        self.layers = nn.ModuleList(Block(cfg, i) for i in range(cfg.num_layers))
        self.norm = make_norm(cfg, cfg.hidden_size)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.embed.weight
        self.register_buffer("inv_freq", rope_inv_freq(cfg), persistent=False)
        # the sliding layers' rotary where they have their own base (Gemma 3), else None: inv_freq's
        local = rope_inv_freq(cfg, local=True) if cfg.has_sliding and cfg.rope_local_theta is not None else None
        self.register_buffer("inv_freq_local", local, persistent=False)
        self.register_buffer("head_ids", None, persistent=False)     # restrict_head's tokens [K], or None
        self.execution = Execution()                # what runs it beside PyTorch: run_on

    def run_on(self, execution: Execution) -> None:
        """Run on `execution` from now on (the kernels: model/kernel_choice.py; a tensor-parallel group:
        runtime/tensor_parallel.py): the one way to change how this model runs."""
        self.execution = execution
        for layer in self.layers:
            layer.reduce_with(execution.all_reduce or unchanged, execution.c_reduce)

    @property
    def fast_forward(self) -> FastForward | None:
        return self.execution.fast

    @property
    def tp(self):
        """Rank 0 of a tensor-parallel split of this model (Execution.split), or None."""
        return self.execution.split

    def rotary(self, positions: torch.Tensor, dtype: torch.dtype, local: bool = False
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [B,T,1,hd] for integer positions [B,T] (computed in float32, as HF does); `local`: the sliding
        layers' rotary."""
        inv_freq = self.inv_freq_local if local and self.inv_freq_local is not None else self.inv_freq
        freqs = positions[..., None].float() * inv_freq
        emb = torch.cat((freqs, freqs), dim=-1)[:, :, None]
        return emb.cos().to(dtype), emb.sin().to(dtype)

    def forward(self, x: torch.Tensor, cache: KVCache | None = None, batch: Batch = WHOLE) -> torch.Tensor:
        """Run `batch.layers` (default: all) over new tokens (model/execution.py's Batch: the rest of what to run).

        x: token ids [B,T] when the range starts at layer 0, else hidden states [B,T,D].
        cache: without one, a plain causal forward from position 0 (training, tests).
          With one, the T new tokens go into its speculative slots after the committed
          prefix, at batch.depths below it, seeing what batch.tree_mask lets them see.
        Returns logits [B,T,V] (float32) when the range ends at the last layer, else hidden states.
        """
        if batch.groups is not None and all(len(g) == 1 for g in batch.groups):
            batch = replace(batch, groups=None)             # every layer alone: the exact forward
        layers, groups, last_only, head = batch.span(self.config.num_layers), batch.groups, batch.last_only, batch.head
        if self.fast_forward is not None and head is None:
            out = self.fast_forward(x, cache, batch)
            if out is not None:
                return out
        h = self.embedding(x) if layers.start == 0 else x
        B, T = h.shape[:2]
        if cache is None:
            positions = torch.arange(T, device=h.device).expand(B, T)
            mask = None
        else:
            positions, mask = cache.prepare(T, batch.depths, batch.tree_mask)
        inputs = self.attention_inputs(positions, h.dtype, cache, mask, batch.tree_mask)
        run_group = self.execution.layer_parallel or layer_parallel
        for group in one_kind(groups, self.config) or [range(i, i + 1) for i in layers]:
            cos, sin, m = inputs[self.config.sliding(group.start)]
            if len(group) == 1:
                h = self.layers[group.start](h, cos, sin, cache, m)
            else:
                h = run_group([self.layers[i] for i in group], h, cos, sin, cache, m)
        if cache is not None:
            cache.advance(T)
        if layers.stop < self.config.num_layers:
            return h
        if head is not None:
            h = self.norm(h[:, -int(last_only):] if last_only else h)
            return self.softcap(F.linear(h, self.lm_head.weight[head])).float()
        return self.logits(h, last_only)

    def embedding(self, x: torch.Tensor) -> torch.Tensor:
        """Token ids [B,T] -> [B,T,D]; Gemma's times sqrt(D), the factor rounded to their dtype (as HF does)."""
        h = self.embed(x)
        if not self.config.scale_embeddings:
            return h
        return h * torch.tensor(self.config.hidden_size ** 0.5).to(h.dtype)

    def attention_inputs(self, positions: torch.Tensor, dtype: torch.dtype, cache: KVCache | None,
                         mask: torch.Tensor | None, tree_mask: torch.Tensor | None) -> dict[bool, tuple]:
        """The layers' rotary cos, sin and attention mask, by whether they slide: False for the global layers (the
        forward's mask); True, where the model has sliding layers, for those (their rotary, the mask less the keys
        sliding_window or more positions back)."""
        inputs = {False: (*self.rotary(positions, dtype), mask)}
        if self.config.has_sliding:
            window = self.config.sliding_window
            local = causal_window(positions.shape[1], window, positions.device) if cache is None \
                else cache.window_mask(mask, tree_mask, window)
            inputs[True] = (*self.rotary(positions, dtype, local=True), local)
        return inputs

    def softcap(self, logits: torch.Tensor) -> torch.Tensor:
        """c tanh(logits / c) where the model soft-caps its logits (final_logit_softcapping c), in their dtype."""
        c = self.config.final_logit_softcapping
        return logits if c is None else torch.tanh(logits / c) * c

    def logits(self, h: torch.Tensor, last_only: bool | int = False) -> torch.Tensor:
        """Float32 logits [B, n, V] of the final hidden states h [B, T, D] (n: T, or forward's `last_only`). Where
        the last n > 1 positions are asked for, the last one goes through the head alone: a product's rounding can
        depend on its number of rows (BLAS blocks them), and the first token a request samples must come from the
        numbers every method computes (cosine's router reads the prompt's last 256 positions, the others one)."""
        if last_only:
            h = h[:, -int(last_only):]
            if h.shape[1] > 1:
                return torch.cat([self.logits(h[:, :-1]), self.logits(h[:, -1:])], dim=1)
        return self.expand(self.softcap(self.lm_head(self.norm(h))).float())

    def restrict_head(self, ids: torch.Tensor) -> None:
        """Compute logits for these tokens only (a draft's most frequent tokens: FR-Spec, Zhao et al. 2025);
        the others get -inf. A head of K of V rows costs K/V of the full head's, which for a small draft
        under a large vocabulary is most of its step."""
        ids = torch.as_tensor(ids, dtype=torch.long, device=self.device).sort().values
        head = nn.Linear(self.config.hidden_size, len(ids), bias=False, device=self.device, dtype=self.dtype)
        head.weight = nn.Parameter(self.lm_head.weight.detach()[ids].clone())
        self.lm_head, self.head_ids = head, ids

    def expand(self, logits: torch.Tensor) -> torch.Tensor:
        """Logits [..., K] of a restricted head -> [..., V], -inf outside it."""
        if self.head_ids is None:
            return logits
        full = logits.new_full((*logits.shape[:-1], self.config.vocab_size), float("-inf"))
        return full.index_copy_(full.dim() - 1, self.head_ids, logits)

    @property
    def device(self) -> torch.device:
        return self.embed.weight.device

    @property
    def cache_dtype(self) -> torch.dtype:
        """The KV cache's dtype: the kernels' choice (Execution.kv_dtype), else float32 for a bf16 model on CPU
        (PyTorch's attention), else the model's."""
        if self.execution.kv_dtype is not None:
            return self.execution.kv_dtype
        return torch.float32 if self.device.type == "cpu" and self.dtype == torch.bfloat16 else self.dtype

    @property
    def dtype(self) -> torch.dtype:
        return self.embed.weight.dtype

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())
