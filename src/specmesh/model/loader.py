"""Checkpoints <-> our Transformer and Tokenizer.

A checkpoint is a HuggingFace folder (`config.json`, `model.safetensors` or shards listed in
`model.safetensors.index.json`, `tokenizer.json`) or a GGUF file (model/gguf.py reads it into the
same HF names). Our model fuses q/k/v and gate/up projections; this module joins them on load and
splits them on save.
"""
from __future__ import annotations

import ctypes
import json
import sys
import warnings
from pathlib import Path
from typing import Callable

import torch
from safetensors.torch import load_file, save_file

from torch import nn
from tqdm import tqdm

from specmesh.kernels import kernel_lib, q8_lib
from specmesh.kernels.build import vnni_products
from specmesh.kernels.grids import hand_grid
from specmesh.kernels.linears import GGUFEmbedding, GGUFLinear, let_go
from specmesh.model import gguf, packed, pages
from specmesh.model.kernel_choice import draft_quant, select_kernels
from specmesh.model.model import ModelConfig, Transformer, rope_inv_freq
from specmesh.model.quant import keep_blocks, quantize_model
from specmesh.model.shard import shard
from specmesh.model.tokenizer import Tokenizer
from specmesh.paths import cache_dir, cache_entry, cached_json, stamp

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class CheckpointError(FileNotFoundError):
    pass


def _hf_names(i: int, cfg: ModelConfig | None = None) -> dict[str, list[str]]:
    """Our parameter name -> the HF names it is concatenated from (dim 0), for layer i (of a model of `cfg`: its q/k
    norms; Gemma's four norms, whose post_attention_layernorm follows the attention)."""
    p = f"model.layers.{i}."
    post = cfg is not None and cfg.post_norms
    names = {
        "attn_norm.weight": [p + "input_layernorm.weight"],
        "mlp_norm.weight": [p + ("pre_feedforward_layernorm.weight" if post else "post_attention_layernorm.weight")],
        "attn.o.weight": [p + "self_attn.o_proj.weight"], "attn.o.bias": [p + "self_attn.o_proj.bias"],
        "mlp.down.weight": [p + "mlp.down_proj.weight"], "mlp.down.bias": [p + "mlp.down_proj.bias"],
        "mlp.gate_up.weight": [p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight"],
        "mlp.gate_up.bias": [p + "mlp.gate_proj.bias", p + "mlp.up_proj.bias"],
    }
    for kind in ("weight", "bias"):
        names[f"attn.qkv.{kind}"] = [p + f"self_attn.{x}_proj.{kind}" for x in "qkv"]
    if cfg is not None and cfg.qk_norm:
        names.update({f"attn.{x}_norm.weight": [p + f"self_attn.{x}_norm.weight"] for x in "qk"})
    if post:
        names.update({"attn_post_norm.weight": [p + "post_attention_layernorm.weight"],
                      "mlp_post_norm.weight": [p + "post_feedforward_layernorm.weight"]})
    return {f"layers.{i}.{k}": v for k, v in names.items()}


def name_map(cfg: ModelConfig) -> dict[str, list[str]]:
    names = {"embed.weight": ["model.embed_tokens.weight"], "norm.weight": ["model.norm.weight"]}
    if not cfg.tie_word_embeddings:
        names["lm_head.weight"] = ["lm_head.weight"]
    for i in range(cfg.num_layers):
        names.update(_hf_names(i, cfg))
    return names


def _require(path: Path, what: str) -> Path:
    if not path.exists():
        raise CheckpointError(f"{what} not found: {path}")
    return path


def _folder(path: Path) -> Path:
    """path, a checkpoint folder; else a clear error (a GGUF file is read elsewhere)."""
    if path.is_dir():
        return path
    if path.exists():
        raise CheckpointError(f"{path} is neither a checkpoint folder (config.json, model.safetensors, "
                              f"tokenizer.json) nor a GGUF file")
    raise CheckpointError(f"checkpoint directory not found: {path}")


def _json(file: Path) -> dict:
    try:
        return json.loads(file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{file} is not valid JSON: {e}") from None


def read_config(path: str | Path) -> ModelConfig:
    path = Path(path)
    if gguf.is_gguf(path):
        return gguf.read_config(path)
    file = _require(_folder(path) / "config.json", "config.json")
    try:
        return ModelConfig.from_hf(_json(file))
    except KeyError as e:
        raise CheckpointError(f"{file} has no {e.args[0]!r}: not a Llama-family config") from None


def _safetensors(file: Path, read: Callable[[int], object] | None = None) -> dict[str, torch.Tensor]:
    try:
        return pages.load(_require(file, "weight file"), huge=False, read=read)
    except (ValueError, KeyError, RuntimeError) as e:
        raise CheckpointError(f"{file} is not a readable safetensors file ({e}): truncated or damaged?") from None


def read_weights(path: Path) -> dict[str, torch.Tensor]:
    """A checkpoint folder's tensors by their names, read under the load's bar."""
    single, index = path / "model.safetensors", path / "model.safetensors.index.json"
    if single.exists():
        files = [single]
    elif index.exists():
        files = [path / name for name in sorted(set(_json(index)["weight_map"].values()))]
    else:
        raise CheckpointError(f"no model.safetensors or model.safetensors.index.json in {path}")
    weights = {}
    with loading_bar(path, sum(f.stat().st_size for f in files if f.exists())) as bar:
        for file in files:
            weights.update(_safetensors(file, bar.update))
    return weights


HEAD_TOKENS = "head_tokens.safetensors"     # in a draft's folder: "ids", the tokens its head computes


def load_model(path: str | Path, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu",
               pack: bool = True, draft: bool = False, quant: str | None = None,
               part: tuple[int, int] | None = None) -> Transformer:
    """Load a checkpoint for inference; `pack` puts this CPU's kernels in place (kernel_choice.select_kernels: the
    one place they are chosen, for `LLM` and the server alike); a bf16 `draft` is held in Q4_0 blocks on CPUs
    without AMX (kernel_choice.draft_quant), unless `quant` says otherwise. `quant="int8"` / `"int4"`: the
    linears quantized (model/quant.py); the model as loaded is the quantized one, `model.quant` says so. A GGUF
    file's quantized matrices run as they are where the kernels multiply them (runs_blocks), else dequantized. A
    `draft` whose folder has HEAD_TOKENS computes logits for those tokens only (Transformer.restrict_head). `part=(rank, world)`: only that
    tensor-parallel rank's shard (model/shard.py), cut before quantization and kernels."""
    path = Path(path)
    if pack and quant is None and part is None and runs_file_blocks(path, dtype, device):
        return load_file_blocks(path, draft)
    has_blocks = quant is None and part is None and runs_blocks(path, dtype, device)
    blocks = has_blocks and pack
    identity = stamp(path) if blocks else ""
    if blocks and (cached := packed.read(identity)) is not None:
        return load_packed(path, identity, cached, draft)
    if draft and quant is None and not has_blocks:  # as on every TP rank (they load unpacked)
        quant = draft_quant(dtype, device)      # a draft's guesses need not be exact: fewer bytes where that pays
    kept = {}
    if gguf.is_gguf(path) and not blocks:
        cfg = read_config(path)
        state = dequantized_state(path, cfg, dtype, whole=quant is None and part is None and dtype == torch.float32)
    elif gguf.is_gguf(path):                    # Q8Linear's first load: float32 weights to quantize, and the blocks
        checkpoint = gguf.read_gguf(path, blocks=True)
        cfg, kept = checkpoint.config, checkpoint.blocks
        state = joined_state(path, cfg, checkpoint.weights)
        del checkpoint
    else:
        cfg = read_config(path)
        state = joined_state(path, cfg, read_weights(path))
    with torch.device("meta"):
        model = Transformer(cfg)
    model.load_state_dict(state, strict=False, assign=True)
    del state                           # the model holds what it needs: what the file gave can go (below)
    if cfg.tie_word_embeddings:
        model.lm_head.weight = model.embed.weight
    missing = [n for n, p in model.named_parameters() if p.is_meta]
    if missing:
        raise CheckpointError(f"{path}: no weights for {missing[:3]}")
    model.inv_freq = rope_inv_freq(cfg)   # buffers are not in the checkpoint
    if draft and (path / HEAD_TOKENS).is_file():
        model.restrict_head(load_file(path / HEAD_TOKENS)["ids"])
    if part is not None:
        shard(model, *part)
    if quant is not None:
        quantize_model(model, quant)
    elif blocks:
        keep_blocks(model, name_map(cfg), kept)
    model = model.to(device=device, dtype=dtype).eval()
    model.quant = quant
    if pack:
        select_kernels(model, draft)
    if blocks:
        packed.write(identity, model)
    del kept
    release_freed_memory()
    return model


def joined_state(path: Path, cfg: ModelConfig, hf: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A checkpoint's weights by our names (name_map), parts joined, `hf` (tensors each in memory of its own)
    emptied as they are: a load's peak is the weights and one joined matrix more."""
    state = {}
    for ours, theirs in name_map(cfg).items():
        present = [hf.pop(n) for n in theirs if n in hf]
        if not present:
            if ours.endswith(".bias"):
                continue
            raise CheckpointError(f"{path}: weight {theirs[0]} is missing")
        state[ours] = present[0] if len(present) == 1 else torch.cat(present, dim=0)
    return state


def dequantized_state(path: Path, cfg: ModelConfig, dtype: torch.dtype, whole: bool) -> dict[str, torch.Tensor]:
    """A GGUF file's weights by our names in `dtype`, each matrix dequantized once into the place it keeps, its parts
    side by side (no joined copy), its file pages let go; norms and biases as file_to_hf reads them. `whole`: the
    model keeps every matrix as loaded (float32: select_kernels multiplies them in place; no shard, no quantized
    copy), so they share one mapping on huge pages (pages.arena); a model that replaced some would keep the
    mapping whole behind the rest."""
    names, found = name_map(cfg), gguf.matrices(path, cfg)
    vectors = file_vectors(path, cfg, found)
    state = {ours: torch.cat(parts) for ours, theirs in names.items()
             if (parts := [vectors[n] for n in theirs if n in vectors])}
    joined = {ours: [found[n] for n in theirs] for ours, theirs in names.items() if theirs[0] in found}
    shapes = {ours: (sum(t.shape[0] for t in parts), parts[0].shape[1]) for ours, parts in joined.items()}
    spans = {ours: pages.aligned(rows * cols * dtype.itemsize) for ours, (rows, cols) in shapes.items()}
    raw, at = pages.arena(sum(spans.values())) if whole else None, 0
    with loading_bar(path, sum(t.data.nbytes for parts in joined.values() for t in parts)) as bar:
        for ours, parts in joined.items():
            rows, cols = shapes[ours]
            out = torch.empty(rows, cols, dtype=dtype) if raw is None else \
                raw[at:at + rows * cols * dtype.itemsize].view(dtype).view(rows, cols)
            row = 0
            for t in parts:
                gguf.dequantized(path, cfg, t, dtype, out=out[row:row + t.shape[0]])
                let_go(t.data)
                row += t.shape[0]
                bar.update(t.data.nbytes)
            state[ours], at = out, at + spans[ours]
    return state


def file_vectors(path: Path, cfg: ModelConfig, found: dict) -> dict[str, torch.Tensor]:
    """A GGUF file's norms and biases by HF name (file_to_hf), once every weight the model reads but a bias is
    known to be in the file (`found`: its matrices, gguf.matrices)."""
    vectors = gguf.file_to_hf(cfg, gguf.read_weights(path, cfg, vectors_only=True)[0])
    missing = [n for ns in name_map(cfg).values() for n in ns
               if n not in found and n not in vectors and ".bias" not in n]
    if missing:
        raise CheckpointError(f"{path}: weight {missing[0]} is missing")
    return vectors


def load_packed(path: Path, identity: str, cached: dict, draft: bool = False) -> Transformer:
    """load_model's model of a GGUF file of Q8_0 / Q4_0 / Q4_1 layers from its matrices packed for Q8Linear
    (model/packed.py, cached at its first load) and the rest of its weights (cached at the first load from them)."""
    cfg, lib = read_config(path), q8_lib()
    state = packed.read_state(identity)
    if state is None:
        state = unpacked_state(path, cfg, cached)
        packed.write_state(identity, state)
    with torch.device("meta"):
        model = Transformer(cfg)

    def linear(full: str, child: nn.Linear) -> nn.Module | None:
        if full not in cached:
            return None
        return packed.linear(child.in_features, child.out_features, cached[full], state.pop(f"{full}.bias", None), lib)

    replace_linears(model, linear)
    return finished(model, path, state, draft, tie=cfg.tie_word_embeddings and "lm_head" not in cached)


def unpacked_state(path: Path, cfg: ModelConfig, cached: dict) -> dict[str, torch.Tensor]:
    """The weights of a GGUF file that the packed matrices do not hold, by our names: the embedding, norms,
    biases, and any matrix not packed (a head without blocks)."""
    names = name_map(cfg)
    unpacked = {ours for ours in names if ours.endswith(".weight") and ours.removesuffix(".weight") not in cached}
    also = frozenset(n for ours in unpacked for n in names[ours])
    hf = gguf.file_to_hf(cfg, gguf.read_weights(path, cfg, vectors_only=True, also=also)[0])
    return {ours: hf[theirs[0]] if len(theirs) == 1 else torch.cat([hf[n] for n in theirs])
            for ours, theirs in names.items() if theirs and all(n in hf for n in theirs)
            and (not ours.endswith(".bias") or ours.removesuffix(".bias") in cached)}


def replace_linears(model: Transformer, make) -> None:
    """Each nn.Linear of `model` for which make(its full name, it) gives a module, replaced by that module."""
    for module_name, module in list(model.named_modules()):
        for child_name, child in list(module.named_children()):
            full = f"{module_name}.{child_name}".lstrip(".")
            if isinstance(child, nn.Linear) and (made := make(full, child)) is not None:
                setattr(module, child_name, made)


def finished(model: Transformer, path: Path, state: dict, draft: bool, tie: bool = False) -> Transformer:
    """A model whose matrices run from a GGUF file's blocks (packed or as they are), once the rest of its
    weights (`state`) are in: bf16, this CPU's kernels, the load's freed memory returned."""
    model.load_state_dict(state, strict=False, assign=True)
    state.clear()                       # the model holds them: each dense one freed as its kernel's copy replaces it
    if tie:
        model.lm_head.weight = model.embed.weight
    meta = [n for n, p in model.named_parameters() if p.is_meta]
    if meta:
        raise CheckpointError(f"{path}: no weights for {meta[:3]}")
    model.inv_freq = rope_inv_freq(model.config)
    model = model.to(dtype=torch.bfloat16).eval()
    model.quant = None
    select_kernels(model, draft)
    release_freed_memory()
    return model


def release_freed_memory() -> None:
    """Return the heap pages a load freed to the OS: glibc keeps them otherwise, and a GGUF file's float32 copies
    (dequantized, joined, converted) had left SmolLM2 in bfloat16 at 1.75 GB resident for 0.3 GB of weights."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):       # not glibc: its allocator keeps what it keeps
        pass


Q8LINEAR_MOST_BYTES = 256 << 20    # a larger file runs packed: Q8Linear's first load holds the whole file in
                                   # float32 (4 bytes a weight, Q8_0's 1.06), each later one an int8 copy beside it


def runs_blocks(path: str | Path, dtype: torch.dtype, device: str | torch.device = "cpu") -> bool:
    """Whether a GGUF file's quantized matrices run as kernels.Q8Linear's blocks (quant.keep_blocks): its layers' are
    all of one format it multiplies (Q8_0, Q4_0, Q4_1), in a bfloat16 run on a CPU whose int8 products run on
    AVX512-VNNI without AMX, a file of at most Q8LINEAR_MOST_BYTES. With AMX, on AVX2 alone, or a larger file, it
    runs packed from its own bytes instead (runs_file_blocks: fewer bytes a token than Q8Linear's int8 copy, and
    there the faster products of the few rows of decoding and verification; docs/quantization.md); elsewhere the
    matrices are dequantized (and rounded to the run's dtype)."""
    lib = q8_lib()
    return dtype == torch.bfloat16 and torch.device(device).type == "cpu" and lib is not None \
        and vnni_products(lib) and gguf.is_gguf(path) and Path(path).stat().st_size <= Q8LINEAR_MOST_BYTES \
        and gguf.layer_format(path) is not None


def runs_file_blocks(path: str | Path, dtype: torch.dtype, device: str | torch.device = "cpu") -> bool:
    """Whether a GGUF file loads matrix by matrix (load_file_blocks): a bfloat16 run on an x86 CPU whose kernels
    build, of a file runs_blocks does not take for Q8Linear. Elsewhere (float32, other devices) a file is dequantized
    whole at load."""
    return dtype == torch.bfloat16 and torch.device(device).type == "cpu" and kernel_lib() is not None \
        and gguf.is_gguf(path) and not runs_blocks(path, dtype, device)


def load_file_blocks(path: Path, draft: bool = False) -> Transformer:
    """A GGUF file's model whose matrices and embedding stay in the file, memory-mapped, and run as they are
    (kernels.GGUFLinear: Q4_0 ... Q8_0, Q2_K ... Q6_K, IQ4_NL, IQ4_XS and the IQ1 ... IQ3 kinds; GGUFEmbedding):
    resident memory is the pages a forward reads, not a copy. A matrix of a type the kernels do not multiply (F16,
    BF16, TQ1_0, TQ2_0; a fused projection with one such part) is dequantized to bfloat16
    alone, a few rows at a time (warn_dense names the quantized kinds so run), and the table's rows are read from
    the file where csrc/ dequantizes its type. Norms and biases are read into float32; the rest of the model gets
    this CPU's kernels (select_kernels) as any bf16 model."""
    cfg, lib = read_config(path), kernel_lib()
    found = gguf.matrices(path, cfg)
    vectors = file_vectors(path, cfg, found)
    with torch.device("meta"):
        model = Transformer(cfg)
    names, tied = name_map(cfg), cfg.tie_word_embeddings

    for t in found.values():                    # the IQ kinds' grids, before the kernels are asked about them
        hand_grid(lib, t.kind)

    def multiplied(ours: str) -> bool:          # every part of a type the kernels multiply
        return all(lib.gguf_kernel(found[n].kind, found[n].shape[1]) for n in names[ours])

    def matrix(ours: str, products: bool = True) -> GGUFLinear:      # products: not a lookup table's alone
        theirs = names[ours]
        parts = [(found[n].data, found[n].kind, gguf.rope_rows(cfg, gguf.gguf_name(n), found[n].shape[0]))
                 for n in theirs]
        made = GGUFLinear(parts, found[theirs[0]].shape[1], bias(ours), lib, packed=products)
        bar.update(unread.pop(ours, 0))
        return made

    def dense(ours: str) -> torch.Tensor:       # bf16 [N, K]; the file's pages of it let go (as GGUFLinear's)
        parts = [gguf.dequantized(path, cfg, found[n], torch.bfloat16) for n in names[ours]]
        for n in names[ours]:
            let_go(found[n].data)
        bar.update(unread.pop(ours, 0))
        return torch.cat(parts)

    def bias(ours: str) -> torch.Tensor | None:
        theirs = names.get(ours.replace(".weight", ".bias"), [])
        return torch.cat([vectors[n] for n in theirs]) if theirs and all(n in vectors for n in theirs) else None

    state = {ours: torch.cat([vectors[n] for n in theirs]) for ours, theirs in names.items()
             if all(n in vectors for n in theirs) and not ours.endswith(".bias")}
    linears = [ours for ours, theirs in names.items() if ours != "embed.weight" and all(n in found for n in theirs)]
    from_blocks = {ours for ours in linears if multiplied(ours)}
    warn_dense([found[n] for ours in linears if ours not in from_blocks for n in names[ours]], path, lib)
    # the bar: each matrix's bytes once, as it is first read (a tied table is read twice: lookups and head)
    unread = {ours: sum(found[n].data.nbytes for n in names[ours]) for ours in [*linears, "embed.weight"]}
    bar = loading_bar(path, sum(unread.values()))
    for ours in (ours for ours in linears if ours not in from_blocks):
        state[ours] = dense(ours)
        if (b := bias(ours)) is not None:
            state[ours.replace(".weight", ".bias")] = b
    replace_linears(model, lambda full, _: matrix(f"{full}.weight") if f"{full}.weight" in from_blocks else None)
    looked_up = found[names["embed.weight"][0]].kind in gguf.C_DEQUANTIZED | {0, 1}     # (F32, F16 too)
    head_too = tied and multiplied("embed.weight")
    if looked_up:
        model.embed = GGUFEmbedding(matrix("embed.weight", products=head_too))
        if head_too:
            model.lm_head = model.embed.table
        elif tied:
            state["lm_head.weight"] = dense("embed.weight")
    else:
        state["embed.weight"] = dense("embed.weight")                  # (tied: the head too, by finished)
    bar.close()
    return finished(model, path, state, draft, tie=tied and not looked_up)


def warn_dense(tensors: list, path: Path, lib) -> None:
    """A warning naming the quantized kinds of a file's matrices that run dequantized to bf16 (4-10x their bytes),
    where there are any (an F16 or BF16 file's matrices run as bf16 as a matter of course)."""
    kinds = sorted({gguf.tensor_type(t.kind)[0] for t in tensors
                    if gguf.tensor_type(t.kind)[1] > 1 and not lib.gguf_kernel(t.kind, t.shape[1])})
    if kinds:
        warnings.warn(f"{path.name}: its {', '.join(kinds)} matrices run dequantized to bfloat16, 16 bits a weight "
                      f"(the kernels multiply Q4_0 ... Q8_0, the K-quants and the IQ kinds as they are)")


BAR_DELAY = 1.0            # seconds a load runs before its bar shows


def loading_bar(path: Path, nbytes: int) -> tqdm:
    """A bar on stderr over the bytes of a checkpoint's weights as they are read or laid out for the kernels: shown
    where that lasts past BAR_DELAY (an 8B model: seconds) and stderr is a terminal, gone once they are."""
    return tqdm(total=nbytes, desc=f"loading {path.name}", unit="B", unit_scale=True, delay=BAR_DELAY, disable=None,
                leave=False, file=sys.stderr)


def load_tokenizer(path: str | Path) -> Tokenizer:
    path = Path(path)
    if gguf.is_gguf(path):
        return gguf.read_tokenizer(path)
    file = _require(_folder(path) / "tokenizer.json", "tokenizer.json")
    try:
        return Tokenizer.from_dir(path)
    except Exception as e:              # the tokenizers library raises a bare Exception for a file it cannot parse
        raise CheckpointError(f"{file} (or tokenizer_config.json beside it) could not be read: {e}") from None


FINGERPRINTS = "fingerprints.json"      # in cache_dir()/tokenizers: a checkpoint's stamp -> its vocabulary's fingerprint


def vocabulary(path: str | Path) -> str:
    """The fingerprint of a checkpoint's vocabulary (Tokenizer.fingerprint), cached under the checkpoint's stamp:
    checking that a draft speaks the target's vocabulary reads neither tokenizer again."""
    file = cache_dir() / "tokenizers" / FINGERPRINTS
    known, key = cached_json(file), stamp(path)
    if key not in known:
        known[key] = load_tokenizer(path).fingerprint
        cache_entry(file, key, known[key])
    return known[key]


def save_model(model: Transformer, path: str | Path, dtype: torch.dtype = torch.bfloat16) -> None:
    """Write config.json + model.safetensors in HF layout (splitting fused projections)."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    cfg = model.config
    ours = {k.replace(".block.", "."): v for k, v in model.state_dict().items()}     # c_forward.CBlock wraps Block
    out = {}
    for name, theirs in name_map(cfg).items():
        if name not in ours:
            continue
        parts = ours[name].split(_split_sizes(cfg, name), dim=0) if len(theirs) > 1 else [ours[name]]
        for hf_name, part in zip(theirs, parts):
            out[hf_name] = part.detach().to("cpu", dtype).contiguous()
    hf_cfg = cfg.to_hf() | {"torch_dtype": str(dtype).removeprefix("torch.")}
    (path / "config.json").write_text(json.dumps(hf_cfg, indent=2) + "\n")
    save_file(out, path / "model.safetensors", metadata={"format": "pt"})


def _split_sizes(cfg: ModelConfig, name: str) -> list[int]:
    if ".qkv." in name:
        return [cfg.num_heads * cfg.head_dim] + [cfg.num_kv_heads * cfg.head_dim] * 2
    return [cfg.intermediate_size] * 2      # gate_up


def to_gguf(checkpoint: str | Path, out: str | Path, ftype: str) -> Path:
    """Write a checkpoint (a HuggingFace folder, or a GGUF file: a 4-bit one as 16-bit, say) as a GGUF file of
    type ftype ('bf16', 'f16', 'f32', 'q8_0', 'q4_0' or 'q4_1'), for llama.cpp."""
    checkpoint = Path(checkpoint)
    if gguf.is_gguf(checkpoint):
        source = gguf.read_gguf(checkpoint)
        return gguf.write_gguf(Path(out), source.config, source.weights, source.tokenizer, ftype)
    return gguf.write_gguf(Path(out), read_config(checkpoint), read_weights(checkpoint), load_tokenizer(checkpoint),
                           ftype)
