"""A whole forward in C: the norm and block wrappers csrc/ reads its weights from, and CForward, the model's
fast_forward for forwards with a cache on CPU."""
from __future__ import annotations

import ctypes

import numpy as np
import torch
from torch import nn

from specmesh.kernels.build import LayerWeights, ModelEnds, amx_lib
from specmesh.kernels.linears import SMALL_ROWS, AMXLinear, DPLinear, F32Linear, FMALinear, GGUFLinear, Q8Linear, _ptr
from specmesh.model.execution import Batch, FastForward
from specmesh.model.model import PREFILL_TOKENS, GemmaRMSNorm, ModelConfig, attention


class CRMSNorm(nn.Module):
    """model.RMSNorm on float32 activations through the C kernel."""

    def __init__(self, norm: nn.Module, kernel: ctypes.CDLL):
        super().__init__()
        self.weight, self.eps, self.kernel = norm.weight, float(norm.eps), kernel

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        y = torch.empty_like(x)
        self.kernel.rms_norm(x.data_ptr(), x.numel() // x.shape[-1], x.shape[-1], self.weight.data_ptr(), self.eps,
                             y.data_ptr())
        return y


class CBlock(nn.Module):
    """model.Block with its weights described for csrc/avx2.c (LayerWeights): CForward runs small
    forwards through every layer in one C call; other shapes (prefill, training) go through the
    block itself. The C attention runs row by row, so a sequence's result does not depend on the
    others in the batch. Besides the Llama block: q/k norms (Qwen3, Gemma 3), Gemma's (1 + w) norms and post-norms,
    a GELU gate, sliding layers (`local`: CForward hands them their rotary tables and window mask)."""

    def __init__(self, block: nn.Module, cfg: ModelConfig | None = None):
        super().__init__()
        act, local = (cfg.hidden_act, cfg.sliding(block.attn.layer)) if cfg is not None else ("silu", False)
        self.block = block
        attn, mlp = block.attn, block.mlp
        linears = (attn.qkv, attn.o, mlp.gate_up, mlp.down)
        self.norms = [c_norm_weight(n) for n in (block.attn_norm, block.mlp_norm, attn.q_norm, attn.k_norm,
                                                 block.attn_post_norm, block.mlp_post_norm)]   # held: C reads them
        attn_norm, mlp_norm, *extra = map(_ptr, self.norms)
        self.weights = LayerWeights(
            attn.o.out_features, attn.h, attn.hkv, attn.hd, mlp.down.in_features,
            (ctypes.c_int * 4)(*(lin.KIND for lin in linears)),
            getattr(mlp.gate_up, "glu", False), block.attn_norm.eps,
            attn_norm, mlp_norm, *(weights_address(lin) for lin in linears),
            *(_ptr(getattr(lin, "scale", None)) for lin in linears), *(_ptr(lin.bias32) for lin in linears),
            None, *extra, LayerWeights.ACTIVATIONS[act], local)

    def reduce_with(self, all_reduce, c_reduce: int | None) -> None:
        """Block.reduce_with, and the C block's sum over ranks (`c_reduce`, a C callback's address, or none)."""
        self.block.reduce_with(all_reduce, c_reduce)
        self.weights.reduce = c_reduce

    def forward(self, x, cos, sin, cache, mask):
        return self.block(x, cos, sin, cache, mask)


def c_norm_weight(norm: nn.Module | None) -> torch.Tensor | None:
    """The weight csrc/ multiplies a norm's normalized input by: RMSNorm's w, Gemma's 1 + w (in float32, as its
    forward computes it); None where the block has no such norm (model.unchanged)."""
    if not isinstance(norm, nn.Module) or not hasattr(norm, "weight"):
        return None
    w = norm.weight.detach().float()
    return (1.0 + w).contiguous() if isinstance(norm, GemmaRMSNorm) else w.contiguous()


def weights_address(module: nn.Module) -> int:
    """Where csrc/avx2.c reads a linear's (or an embedding's) weights: a GGUF file's Matrix, else the weight tensor."""
    return module.address if hasattr(module, "address") else module.weight.data_ptr()


class CForward(FastForward):
    """model.fast_forward (Execution.fast) for a model whose blocks are CBlocks: forwards with a cache on CPU.
    Up to SMALL_ROWS new tokens go through one C call (model_forward): embedding, rotary angles,
    the layers of the range, final norm and head. A small model's decode step was half Python
    around the kernels (docs/kernels.md). Where the linears run on the tile unit or the dot product
    (fast for any number of rows), longer forwards (prefills) run each layer's products, norms,
    rotary and cache writes in C too, with amx_attention or PyTorch's flash attention between
    them. Other forwards return None: the model's own path
    (PyTorch's products are the faster ones for many rows of bf16 or float32 weights without AMX)."""

    def __init__(self, model: nn.Module, kernel: ctypes.CDLL):
        self.model, self.kernel = model, kernel
        head, norm, cfg = model.lm_head, model.norm, model.config
        self.norm = c_norm_weight(norm)
        local = getattr(model, "inv_freq_local", None)
        scale = float(torch.tensor(cfg.hidden_size ** 0.5)) if cfg.scale_embeddings else 0.0   # as model.embedding
        self.ends = ModelEnds(cfg.hidden_size, head.out_features, cfg.head_dim, head.KIND,
                              getattr(model.embed, "KIND", F32Linear.KIND), norm.eps, weights_address(model.embed),
                              model.inv_freq.data_ptr(), self.norm.data_ptr(), weights_address(head),
                              _ptr(getattr(head, "scale", None)), _ptr(head.bias32), _ptr(local), scale)
        self.layers = [ctypes.pointer(b.weights) for b in model.layers]
        kinds = {kind for b in model.layers for kind in b.weights.kind}
        self.amx = amx_lib() if AMXLinear.KIND in kinds else None
        # prefills in C where the linears are fast for many rows (tiles, dot products)
        self.long = kinds <= {AMXLinear.KIND, DPLinear.KIND, FMALinear.KIND, GGUFLinear.KIND,
                              *(kind for kind, _ in Q8Linear.KINDS.values())}
        # prefills (no tree) attend on the tile unit too, for head dim 64 and a bf16 cache
        self.tile_attention = self.amx is not None and model.config.head_dim == 64 \
            and model.cache_dtype == torch.bfloat16
        # elsewhere the C attention a decoding step uses (AVX2's, or AVX-512's for head dims 64 and 128): rows skip
        # the keys after them, faster than PyTorch's for prompts of up to ~700 tokens, and row by row (docs/kernels.md)
        self.c_attention = self.amx is None

    def __call__(self, x: torch.Tensor, cache, batch: Batch):
        depths, tree_mask, last_only, groups, lens = (batch.depths, batch.tree_mask, batch.last_only, batch.groups,
                                                      batch.lens)
        layers = batch.span(self.model.config.num_layers)
        B, T = x.shape[:2]
        if cache is None or x.device.type != "cpu":
            return None
        if groups and self.model.config.has_sliding:
            return None                         # layer-parallel groups of sliding layers: the model's own path
        if B * T > SMALL_ROWS:
            return self._long(x, cache, depths, tree_mask, layers, last_only, lens) if self.long and not groups else None
        positions = cache.slots(T, depths)                                        # [B, T] int64
        mask = None if tree_mask is None else cache.mask(T, tree_mask).contiguous()   # [B, 1, T, kv_len]
        window = self._window(cache, mask, tree_mask)
        n, first, L = len(layers), cache.first_layer, self.model.config.num_layers
        weights = (ctypes.POINTER(LayerWeights) * n)(*self.layers[layers.start:layers.stop])
        kc = (ctypes.c_void_p * n)(*(cache.k[i - first].data_ptr() for i in layers))   # each [B, Hkv, max_len, hd]
        vc = (ctypes.c_void_p * n)(*(cache.v[i - first].data_ptr() for i in layers))
        h = self._hidden(x, layers)
        sizes = None if groups is None else torch.tensor([len(g) for g in groups], dtype=torch.int32)   # layer_parallel
        tail = 0 if layers.stop < L else min(int(last_only), T) if last_only else T
        logits = torch.empty(B, tail, self.ends.V)
        real = None if lens is None or sum(lens) == B * T else np.asarray(lens, dtype=np.int32)   # pads skipped
        self.kernel.model_forward(ctypes.byref(self.ends), weights, n, _ptr(x.contiguous() if layers.start == 0 else None),
                                  h.data_ptr(), B, T, positions.ctypes.data, kc, vc, cache.k[0].dtype == torch.bfloat16,
                                  cache.k[0].stride(0), cache.max_len, self._starts(cache).ctypes.data, _ptr(mask),
                                  cache.kv_len, tail, logits.data_ptr(), _ptr(sizes), 0 if sizes is None else len(sizes),
                                  None if real is None else real.ctypes.data, _ptr(window))
        cache.advance(T)
        return self.model.expand(logits) if tail else h

    def _window(self, cache, mask: torch.Tensor | None, tree_mask) -> torch.Tensor | None:
        """The sliding layers' mask [B, 1, T, kv_len] where their window hides keys this forward (KVCache.window_mask),
        else None: they see what the others see."""
        cfg = self.model.config
        if not cfg.has_sliding:
            return None
        window = cache.window_mask(mask, tree_mask, cfg.sliding_window)
        return None if window is mask else window.contiguous()

    def _long(self, x: torch.Tensor, cache, depths, tree_mask, layers: range, last_only: bool | int,
              lens: list[int] | None = None):
        B, T = x.shape[:2]
        cfg, first = self.model.config, cache.first_layer
        # a batch of trees of several sizes: the layers' products over the real tokens only (idx of the B*T)
        idx = None if lens is None or sum(lens) == B * T or last_only and layers.stop == cfg.num_layers \
            else np.concatenate([b * T + np.arange(n, dtype=np.int32) for b, n in enumerate(lens)])
        H, Q, hd = cfg.num_heads, (cfg.num_heads + 2 * cfg.num_kv_heads) * cfg.head_dim, cfg.head_dim
        tiles = self.tile_attention and T > PREFILL_TOKENS and tree_mask is None and cache.k[0].dtype == torch.bfloat16 \
            and not cfg.has_sliding
        if tiles or self.c_attention:     # C attention: causal by each row's first new slot; a mask for a tree only
            positions = torch.from_numpy(cache.slots(T, depths))
            mask = None if tiles or tree_mask is None else cache.mask(T, tree_mask).contiguous()   # [B, 1, T, kv_len]
        else:
            positions, mask = cache.prepare(T, depths, tree_mask)                # [B, T]; [B, 1, T, kv_len] or None
        tables = {False: self._rotary(self.ends.inv_freq, positions, hd)}          # by whether a layer slides
        tables[True] = self._rotary(self.ends.inv_freq_local, positions, hd) if self.ends.inv_freq_local else tables[False]
        masks = {False: mask, True: self._window(cache, mask, tree_mask) if cfg.has_sliding else None}
        masks[True] = mask if masks[True] is None else masks[True]
        h = self.model.embedding(x).contiguous() if layers.start == 0 else self._hidden(x, layers)   # [B, T, D]
        if idx is not None:
            h = h.view(B * T, -1)[torch.from_numpy(idx)].contiguous()                   # [Mv, D]
        Mv = B * T if idx is None else len(idx)
        qkv = torch.empty(B, T, Q)
        starts = self._starts(cache)
        for i in layers:
            kc, vc = cache.k[i - first], cache.v[i - first]                       # [B, Hkv, max_len, hd]
            (cos, sin), mask = tables[cfg.sliding(i)], masks[cfg.sliding(i)]
            self.kernel.block_qkv(self.layers[i], h.data_ptr(), None if idx is None else idx.ctypes.data, Mv, B, T,
                                  cos.data_ptr(), sin.data_ptr(), kc.data_ptr(), vc.data_ptr(),
                                  kc.dtype == torch.bfloat16, kc.stride(0), cache.max_len, starts.ctypes.data,
                                  qkv.data_ptr())
            if tiles:
                out = torch.empty(B, T, H * hd)
                for b, start in enumerate(cache.starts):
                    self.amx.amx_attention(qkv[b].data_ptr(), Q, kc[b].data_ptr(), vc[b].data_ptr(), cache.max_len,
                                           start, T, H, cfg.num_kv_heads, out[b].data_ptr())
            elif self.c_attention:
                out = self._attend(qkv, kc, vc, cache, mask)
            else:
                q = qkv[..., :H * hd].view(B, T, H, hd).transpose(1, 2)
                out = attention(q, kc[:, :, :cache.kv_len], vc[:, :, :cache.kv_len], mask,
                                self.model.layers[i].block.attn.prefill_dtype).contiguous()     # [B, T, H*hd]
            if idx is not None:
                out = out.view(B * T, -1)[torch.from_numpy(idx)].contiguous()        # [Mv, H*hd]
            self.kernel.block_out(self.layers[i], h.data_ptr(), Mv, out.data_ptr())
        cache.advance(T)
        if idx is not None:                                 # back to [B, T, ...], the pads' rows zeros
            return self._unpack(self.model.logits(h[None], False)[0] if layers.stop == cfg.num_layers else h, idx, B, T)
        if layers.stop < cfg.num_layers:
            return h
        return self.model.logits(h, last_only)

    def _rotary(self, inv_freq: int, positions: torch.Tensor, hd: int) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [B*T, hd] of the positions for the frequencies at address inv_freq (csrc's rotary_tables)."""
        cos, sin = torch.empty(positions.numel(), hd), torch.empty(positions.numel(), hd)
        self.kernel.rotary_tables(inv_freq, positions.contiguous().data_ptr(), positions.numel(), hd, cos.data_ptr(),
                                  sin.data_ptr())
        return cos, sin

    @staticmethod
    def _unpack(rows: torch.Tensor, idx: np.ndarray, B: int, T: int) -> torch.Tensor:
        """rows [Mv, W] of the real tokens idx -> [B, T, W], zeros at the pads."""
        out = rows.new_zeros(B * T, rows.shape[-1])
        out[torch.from_numpy(idx)] = rows
        return out.view(B, T, -1)

    def _attend(self, qkv: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor, cache, mask) -> torch.Tensor:
        """Each row's attention [B, T, H*hd] through csrc/avx2.c's attend, as model_forward's attention (the same
        kernel, AVX2's or AVX-512's: a token attends alike in both): the queries qkv [B, T, Q] over the cache kc/vc
        [B, Hkv, max_len, hd] up to the row's new tokens; token t sees the keys up to its own slot, or where mask
        [B, 1, T, kv_len] says."""
        B, T, Q = qkv.shape
        cfg = self.model.config
        H, hd = cfg.num_heads, cfg.head_dim
        out = torch.empty(B, T, H * hd)
        for b, start in enumerate(cache.starts):
            self.kernel.attend(qkv[b].data_ptr(), Q, kc[b].data_ptr(), vc[b].data_ptr(), kc.dtype == torch.bfloat16,
                               cache.max_len, start, start + T, _ptr(None if mask is None else mask[b]), cache.kv_len,
                               T, H, cfg.num_kv_heads, hd, out[b].data_ptr())
        return out

    def _hidden(self, x: torch.Tensor, layers: range) -> torch.Tensor:
        """The residual stream [B, T, D] the C code updates in place: empty where it embeds x itself,
        else a float32 copy of the hidden states x."""
        if layers.start == 0:
            return torch.empty(*x.shape[:2], self.ends.D)
        return x.float().clone(memory_format=torch.contiguous_format)

    @staticmethod
    def _starts(cache) -> np.ndarray:
        return np.asarray(cache.starts, dtype=np.int32)        # each row's first new slot
