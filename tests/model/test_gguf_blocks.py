"""A GGUF file's quantized matrices as they are (csrc/blocks.c, kernels.GGUFLinear): each block type dequantizes as
the `gguf` package does, bit for bit; each product is within its type's tolerance of the float product and gives a
row the same bits alone or in a batch; a mixed K-quant file (Q4_K_M's kind of mix) runs from its memory-mapped
pages with no dequantized copy, close to its float32 model, every one-process method greedy-equal to `ar`, and
its bytes unchanged."""
import ctypes
import hashlib
import json
import sys

import gguf
import numpy as np
import pytest
import torch

from conftest import tiny_config
from specmesh import LLM, SamplingParams, kernels
from specmesh.kernels.build import Matrix
from specmesh.kernels.grids import hand_grid
from specmesh.kernels.linears import GGUFEmbedding, GGUFLinear
from specmesh.model.cache import KVCache
from specmesh.model.gguf import (GGUF_ARCHITECTURES, HPARAMS, gguf_name, hf_tensor_names, pre_name,
                                 write_architecture, write_tokenizer)
from specmesh.model.loader import load_model, load_tokenizer, runs_file_blocks
from specmesh.timing import weight_bytes

Q = gguf.GGMLQuantizationType
KINDS = [Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0, Q.Q2_K, Q.Q3_K, Q.Q4_K, Q.Q5_K, Q.Q6_K, Q.IQ4_NL, Q.IQ4_XS,
         Q.IQ3_XXS, Q.IQ3_S, Q.IQ2_XXS, Q.IQ1_S, Q.IQ2_XS, Q.IQ2_S, Q.IQ1_M]   # (the last seven packed as levels:
                                                                               # csrc/grids.c)
# where each block type keeps its fp16 scales (d, then dmin or m where it has one)
SCALES = {Q.Q4_0: (0,), Q.Q5_0: (0,), Q.Q8_0: (0,), Q.Q4_1: (0, 2), Q.Q5_1: (0, 2), Q.Q4_K: (0, 2), Q.Q5_K: (0, 2),
          Q.Q3_K: (108,), Q.Q6_K: (208,), Q.IQ4_NL: (0,), Q.IQ4_XS: (0,), Q.Q2_K: (80, 82), Q.IQ2_XXS: (0,),
          Q.IQ2_XS: (0,), Q.IQ2_S: (0,), Q.IQ3_XXS: (0,), Q.IQ3_S: (0,), Q.IQ1_S: (0,), Q.IQ1_M: (),
          Q.TQ2_0: (64,)}     # (IQ1_M's d: the top nibbles of its 4 scale words, set apart)

pytestmark = [pytest.mark.skipif(kernels.kernel_lib() is None, reason="needs csrc/ built (x86 with AVX2 and gcc)"),
              pytest.mark.filterwarnings("ignore:.*run dequantized to bfloat16")]     # (the mixed file's TQ2_0:
                                                                                        # asserted once, below)


def random_blocks(kind: Q, rows: int, K: int, rng: np.random.Generator, scale: float = 0.02) -> np.ndarray:
    """uint8 [rows, bytes per row] of random blocks of `kind` whose fp16 scales are of a sane size: random bytes
    elsewhere are valid weights of every type (as llama-quantize's would be, with other statistics)."""
    size, nbytes = gguf.GGML_QUANT_SIZES[kind]
    n = rows * K // size
    raw = rng.integers(0, 256, size=(n, nbytes), dtype=np.uint8)
    for at in SCALES[kind]:
        d = rng.uniform(0.3, 1.0, n) * scale * rng.choice([-1, 1], n) if at == 0 else rng.uniform(0, scale, n)
        raw[:, at:at + 2] = d.astype(np.float16).view(np.uint8).reshape(n, 2)
    if kind == Q.IQ1_M:                                 # d's nibble i: the top nibble of scale word i (byte 49 + 2i)
        d = (rng.uniform(0.3, 1.0, n) * scale).astype(np.float16).view(np.uint16)
        for i in range(4):
            raw[:, 49 + 2 * i] = (raw[:, 49 + 2 * i] & 0x0F) | ((d >> (4 * i)) & 0x0F) << 4
    return raw.reshape(rows, -1)


def matrix_of(raw: np.ndarray, kind: Q, K: int) -> GGUFLinear:
    return GGUFLinear([(raw, int(kind), None)], K, None, kernels.kernel_lib())


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.name)
def test_each_block_type_dequantizes_as_gguf_does(kind):
    raw = random_blocks(kind, 3, 512, np.random.default_rng(0))
    want = gguf.quants.dequantize(raw, kind).astype(np.float32)
    got = np.empty((3, 512), np.float32)
    hand_grid(kernels.kernel_lib(), int(kind))          # (the IQ kinds of grids: their grid first)
    assert kernels.kernel_lib().gguf_dequantize(int(kind), raw.ctypes.data, got.size, got.ctypes.data) == 0
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    table = GGUFEmbedding(matrix_of(raw, kind, 512))
    assert torch.equal(table(torch.tensor([[2, 0]])), torch.from_numpy(want[[2, 0]])[None])


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.name)
def test_each_product_is_near_the_float_one_and_a_row_alike_alone_and_in_a_batch(kind):
    rng = np.random.default_rng(1)
    N, K = 43, 768                          # the packed K-quants' last group of 8 rows part empty
    raw = random_blocks(kind, N, K, rng)
    linear = matrix_of(raw, kind, K)
    x = torch.randn(32, K, generator=torch.Generator().manual_seed(2))
    y = linear(x)
    want = x.double() @ torch.from_numpy(gguf.quants.dequantize(raw, kind).astype(np.float32)).double().T
    # 8-bit activations per block: about 1/254 of a block's largest input per weight, a fraction of that summed
    assert ((y - want).abs().max() / want.abs().max()).item() < 0.02
    for rows in (1, 2, 5, 8, 9, 32):
        batch = linear(x[:rows])
        for i in range(rows):
            assert torch.equal(linear(x[i:i + 1])[0], batch[i])


@pytest.mark.cpu(*kernels.Q8)
@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.name)
def test_the_avx2_and_avx512_block_products_agree_bit_for_bit(kind):
    """csrc/blocks512.c sums each lane's products as csrc/blocks.c does and shares its float part: a file's model
    computes the same on a CPU with AVX-512 as on one with AVX2 only (an odd count of 32-blocks included)."""
    lib = kernels.kernel_lib()
    K = 800 if gguf.GGML_QUANT_SIZES[kind][0] == 32 else 1024
    linear = matrix_of(random_blocks(kind, 24, K, np.random.default_rng(4)), kind, K)
    x = torch.randn(19, K, generator=torch.Generator().manual_seed(5)) * torch.logspace(-2, 2, K)
    try:
        lib.use_tiles(0)
        lib.use_vnni(1)
        wide = [linear(x[:rows]) for rows in (1, 8, 19)]
        lib.use_vnni(0)
        narrow = [linear(x[:rows]) for rows in (1, 8, 19)]
    finally:
        lib.use_vnni(int(kernels.build.vnni_products(lib)))
        lib.use_tiles(int(kernels.build.tile_products(lib)))
    for a, b in zip(wide, narrow):
        assert torch.equal(a, b)


@pytest.mark.cpu(*kernels.build.AMX_INT8)
@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.name)
def test_the_tile_products_give_the_vector_kernels_bits(kind):
    """csrc/blocks_amx.c (several rows of activations on AMX's int8 tiles) computes a packed type's exact integers
    and float step as blocks512.c does: the same bits for the widths it takes (from 9 rows, Q2_K's and Q3_K's from 12,
    the 32-blocks' from 40; a last tile of fewer than 16), for a part whose last slab of 16 rows is one group or a
    part of one, and among parts of other types (an odd count of 32-blocks: a last tile product of fewer than four)."""
    lib = kernels.kernel_lib()
    assert kernels.build.tile_products(lib), "the CPU has AMX int8 tiles but csrc/blocks_amx.c is not in use"
    rng = np.random.default_rng(7)
    K, WIDTHS = 800 if gguf.GGML_QUANT_SIZES[kind][0] == 32 else 768, (9, 12, 16, 17, 32, 40, 57)
    for N in (40, 43):
        raw = random_blocks(kind, N, K, rng)
        other = random_blocks(Q.Q8_0, 16, K, rng)
        linears = [matrix_of(raw, kind, K),
                   GGUFLinear([(other, int(Q.Q8_0), None), (raw, int(kind), None)], K, None, lib)]
        x = torch.randn(57, K, generator=torch.Generator().manual_seed(8)) * torch.logspace(-2, 2, K)
        for linear in linears:
            try:
                tiles = [linear(x[:rows]) for rows in WIDTHS]
                lib.use_tiles(0)
                vectors = [linear(x[:rows]) for rows in WIDTHS]
            finally:
                lib.use_tiles(1)
            for a, b in zip(tiles, vectors):
                assert torch.equal(a, b)


# every packed type's weights in a buffer that ends where a page no process may read begins
GUARDED = """
import ctypes, mmap, sys
import numpy as np, torch, gguf
sys.path[:0] = [sys.argv[1], sys.argv[1] + "/.."]         # this file, and its conftest
from test_gguf_blocks import random_blocks, matrix_of, KINDS
from specmesh import kernels
from specmesh.kernels import linears

def guarded(nbytes):
    page = mmap.PAGESIZE
    span = -(-nbytes // page) * page
    buf = mmap.mmap(-1, span + page, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    start = ctypes.addressof(ctypes.c_char.from_buffer(buf))
    assert ctypes.CDLL(None).mprotect(ctypes.c_void_p(start + span), page, 0) == 0    # PROT_NONE
    return np.frombuffer(buf, np.uint8, count=nbytes, offset=span - nbytes)

linears.anonymous = guarded
rng = np.random.default_rng(9)
for kind in KINDS:
    K = 512
    for N in (40, 48):                      # a last slab of 16 rows with one group, and with two
        linear = matrix_of(random_blocks(kind, N, K, rng), kind, K)
        for rows in (1, 8, 40):             # one row, several, the AMX tiles' widths
            assert torch.isfinite(linear(torch.randn(rows, K))).all()
print("read no byte past the end")
"""


def test_no_kernel_reads_past_a_packed_matrix_s_last_byte():
    """Each type's products of 1, 8 and 40 rows (the vector kernels and AMX's tiles where this CPU has them) on
    packed weights that end at a page no process may read: a read past the last group-block ends the process (a
    first Q2_K tile path read Q3_K's hmask there, past the end of Q2_K's smaller group-blocks)."""
    import subprocess
    import sys
    from pathlib import Path
    done = subprocess.run([sys.executable, "-X", "faulthandler", "-c", GUARDED, str(Path(__file__).parent)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "read no byte past the end" in done.stdout, (done.returncode, done.stderr[-2000:])


def test_a_matrix_of_parts_reads_each_of_its_own_type_through_its_row_map():
    rng = np.random.default_rng(3)
    K = 512
    a, b = random_blocks(Q.Q4_K, 8, K, rng), random_blocks(Q.Q6_K, 4, K, rng)
    order = np.array([3, 1, 0, 2], dtype=np.int32)
    fused = GGUFLinear([(a, int(Q.Q4_K), None), (b, int(Q.Q6_K), order)], K, torch.arange(12.0), kernels.kernel_lib())
    x = torch.randn(3, K)
    want = torch.cat([matrix_of(a, Q.Q4_K, K)(x), matrix_of(b, Q.Q6_K, K)(x)[:, order]], 1) + torch.arange(12.0)
    assert torch.equal(fused(x), want)
    with pytest.raises(ValueError, match="parts"):
        GGUFLinear([(a, int(Q.Q4_K), None)] * (Matrix.MAX_PARTS + 1), K, None, kernels.kernel_lib())
    table = GGUFLinear([(a, int(Q.Q4_K), None)], K, None, kernels.kernel_lib(), packed=False)    # lookups alone
    with pytest.raises(RuntimeError, match="lookup table"):
        table(x)


# -- a whole file ---------------------------------------------------------------------------------------------
def q4_k_m_kind(name: str, layer: int) -> Q:
    """A Q4_K_M-like mix: Q6_K for the head and embedding, v and down, Q4_K elsewhere; layer 1 mixes in the
    32-blocks and Q5_K, as llama-quantize does for rows that are not whole 256-blocks or for some layers; layer 0's q
    and k are IQ4_NL and IQ4_XS, its gate IQ2_XXS, its up IQ2_S, its attention output IQ1_S and its down TQ2_0, a type
    the kernels do not multiply (dequantized at load); layer 2's q and k IQ3_S and IQ3_XXS (as an IQ3_M file's), its gate
    Q3_K, its up Q2_K, its v IQ1_M, its down Q4_K and its attention output IQ2_XS."""
    own = {0: {"attn_q.weight": Q.IQ4_NL, "attn_k.weight": Q.IQ4_XS, "ffn_gate.weight": Q.IQ2_XXS,
               "attn_output.weight": Q.IQ1_S, "ffn_up.weight": Q.IQ2_S, "ffn_down.weight": Q.TQ2_0},
           1: {"attn_q.weight": Q.Q5_0, "attn_output.weight": Q.Q8_0, "ffn_up.weight": Q.Q5_K, "attn_k.weight": Q.Q4_1,
               "ffn_gate.weight": Q.Q4_0},
           2: {"attn_q.weight": Q.IQ3_S, "attn_k.weight": Q.IQ3_XXS, "ffn_gate.weight": Q.Q3_K,
               "ffn_up.weight": Q.Q2_K, "attn_output.weight": Q.IQ2_XS, "attn_v.weight": Q.IQ1_M,
               "ffn_down.weight": Q.Q4_K}}
    if kind := own.get(layer, {}).get(name.split(".", 2)[-1]):
        return kind
    if name in ("token_embd.weight", "output.weight") or name.endswith(("attn_v.weight", "ffn_down.weight")):
        return Q.Q6_K
    return Q.Q4_K


# what each architecture adds to the tiny Llama config: Qwen3's q/k norms; Gemma 3's norms, GELU gate, scaled
# embeddings and sliding layers (a window of 8 positions, shorter than the prompts)
ARCHITECTURES = {"llama": {}, "qwen3": dict(model_type="qwen3", qk_norm=True, tie_word_embeddings=True),
                 "gemma3": dict(model_type="gemma3_text", qk_norm=True, norm_offset=True, post_norms=True,
                                hidden_act="gelu_pytorch_tanh", scale_embeddings=True, query_pre_attn_scalar=64,
                                sliding_window=8, layer_types=["sliding_attention", "sliding_attention", "full_attention"],
                                rope_theta=1e6, rope_local_theta=1e4, tie_word_embeddings=True)}


@pytest.fixture(scope="module", params=list(ARCHITECTURES))
def kquant_file(request, tiny_checkpoint, tmp_path_factory):
    """A GGUF of random K-quant blocks (hidden 256, MLP 512: whole 256-blocks) of each architecture, the tiny
    tokenizer."""
    tokenizer = load_tokenizer(tiny_checkpoint)
    cfg = tiny_config(vocab_size=tokenizer.vocab_size, hidden_size=256, intermediate_size=512, num_heads=4,
                      num_kv_heads=2, head_dim=64, num_layers=3, eos_token_id=0, **ARCHITECTURES[request.param])
    path = tmp_path_factory.mktemp("kquant") / "m.gguf"
    writer = gguf.GGUFWriter(str(path), GGUF_ARCHITECTURES[cfg.model_type])
    for key, name in HPARAMS.items():
        getattr(writer, f"add_{key}")(getattr(cfg, name))
    write_architecture(writer, cfg)
    write_tokenizer(writer, cfg, json.loads(tokenizer.inner.to_str()), pre_name(tokenizer))
    rng = np.random.default_rng(4)
    shapes = {"embed_tokens": (cfg.vocab_size, 256), "lm_head": (cfg.vocab_size, 256), "q_proj": (256, 256),
              "k_proj": (128, 256), "v_proj": (128, 256), "o_proj": (256, 256), "gate_proj": (512, 256),
              "up_proj": (512, 256), "down_proj": (256, 512)}
    for hf in hf_tensor_names(cfg):
        name = gguf_name(hf)
        if "norm" in hf:
            writer.add_tensor(name, rng.uniform(0.8, 1.2, 64 if "q_norm" in hf or "k_norm" in hf else 256
                                                ).astype(np.float32))
            continue
        if hf == "lm_head.weight" and cfg.tie_word_embeddings:
            continue
        rows, K = next(s for key, s in shapes.items() if key in hf)
        layer = int(name.split(".")[1]) if name.startswith("blk.") else -1
        kind = q4_k_m_kind(name, layer)
        # q and k small: attention far from one-hot, where bf16's roundings would pick the key
        scale = 0.05 if "lm_head" in hf else 0.001 if "q_proj" in hf or "k_proj" in hf else 0.02
        writer.add_tensor(name, random_blocks(kind, rows, K, rng, scale), raw_dtype=kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_a_k_quant_file_runs_from_its_pages_close_to_its_float32_model(kquant_file):
    assert runs_file_blocks(kquant_file, torch.bfloat16)
    assert not runs_file_blocks(kquant_file, torch.float32)            # float32: the file's dequantized weights
    with pytest.warns(UserWarning, match=r"m.gguf: its TQ2_0 matrices run dequantized to bfloat16"):
        blocks = load_model(kquant_file, torch.bfloat16)
    exact = load_model(kquant_file, torch.float32)
    linears = [m for m in blocks.modules() if isinstance(m, GGUFLinear)]
    tied = blocks.config.tie_word_embeddings
    assert len(linears) == 3 * 4 + 2 - tied - 1 and isinstance(blocks.embed, GGUFEmbedding)    # but TQ2_0's
    dense, = [b.block.mlp.down for b in blocks.layers if not isinstance(b.block.mlp.down, GGUFLinear)]
    assert dense.weight.dtype == torch.bfloat16, dense
    assert {type(b).__name__ for b in blocks.layers} == {"CBlock"}      # the whole forward in C, kinds mixed
    assert {p.type for m in linears for p in m.matrix.part[:m.matrix.n]} == {int(k) for k in KINDS if k != Q.Q5_1}
    reads = sum(m.nbytes for m in linears if m is not blocks.embed.table or tied)   # a lookup reads one row
    assert weight_bytes(blocks) == reads + weight_bytes(dense)
    copied = sum(t.numel() * t.element_size() for t in [*blocks.parameters(), *blocks.buffers()])
    assert copied < 64 * 1024                               # norms and rotary: no weights copied (TQ2_0's: no parameter)
    # but the matrices, re-laid in 8-row groups of their own bytes (K-quants + 3%; Q2_K's and Q3_K's scales a byte
    # each; IQ4's scales as floats; the grid kinds as 4-bit levels and 4 bytes of scale a 32-block: 160 bytes a 256)
    extras = {Q.Q4_K: 1.03, Q.Q5_K: 1.03, Q.Q6_K: 1.03, Q.Q3_K: 114 / 110, Q.Q2_K: 100 / 84, Q.IQ4_NL: 20 / 18,
              Q.IQ4_XS: 160 / 136, Q.IQ3_S: 160 / 110, Q.IQ3_XXS: 160 / 98, Q.IQ2_XXS: 160 / 66, Q.IQ1_S: 160 / 50,
              Q.IQ2_XS: 160 / 74, Q.IQ2_S: 160 / 82, Q.IQ1_M: 160 / 56}
    for m in linears:
        for part, packed in zip(m.matrix.part, m.packed):
            assert (packed is not None) == (m is not blocks.embed.table or tied)
            extra = extras.get(part.type, 1.0)
            assert packed is None or packed.nbytes <= extra * -(-part.rows // 8) * 8 * part.stride
    ids = torch.randint(0, 300, (1, 40), generator=torch.Generator().manual_seed(5))
    cfg = blocks.config
    cache = KVCache(cfg.num_layers, 1, 64, cfg.num_kv_heads, cfg.head_dim, blocks.cache_dtype, "cpu")
    with torch.no_grad():
        want = exact(ids)[0, -1]
        got = blocks(ids, cache)[0, -1]                                 # a prefill through the C forward
        step = blocks(torch.tensor([[7]]), cache)[0, -1]                # then one token
    assert torch.isfinite(got).all() and torch.isfinite(step).all()
    assert ((got - want).abs().max() / want.abs().max()).item() < 0.05
    assert want[got.argmax()] >= want.max() - 0.02 * want.abs().max()   # float32's top token, or one within a near-tie


def test_a_float32_load_is_the_files_dequantized_weights_each_written_once_where_it_stays(kquant_file):
    """Each matrix, a joined one (q, k, v; gate, up) too, holds the gguf package's dequantization of its parts
    exactly, written straight into one mapping (on huge pages where the system gives them): no joined copy."""
    from specmesh.model import pages
    from specmesh.model.gguf import matrices, rope_heads, unpermute_rope
    from specmesh.model.loader import name_map
    model = load_model(kquant_file, torch.float32, pack=False)
    cfg, weights = model.config, dict(model.named_parameters())
    found, joined = matrices(kquant_file, cfg), 0
    for ours, theirs in name_map(cfg).items():
        if theirs[0] not in found:
            continue
        parts = []
        for t in (found[n] for n in theirs):
            w = torch.from_numpy(gguf.quants.dequantize(t.data, gguf.GGMLQuantizationType(t.kind)).copy())
            heads = rope_heads(cfg, t.name)
            parts.append(w if heads is None else unpermute_rope(w, heads))
        assert torch.equal(weights[ours], torch.cat(parts)), ours
        joined += len(parts) > 1
    assert joined == 2 * cfg.num_layers
    if pages.huge_pages():
        spans = {next(i for i, (start, end) in pages.LIVE.items() if start <= p.data_ptr() < end)
                 for p in weights.values() if p.dim() == 2}
        assert len(spans) == 1


def test_a_long_load_shows_a_bar_on_a_terminal_only(kquant_file, tiny_checkpoint, monkeypatch):
    """A bar naming the file on stderr where stderr is a terminal (here from the first matrix on), which counts
    every matrix's bytes once; nothing where not (a log, a pipe). A float32 load's dequantization and a folder's
    reading show one too."""
    import io
    from specmesh.model import loader

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True
    bars, made = [], loader.loading_bar
    monkeypatch.setattr(loader, "loading_bar", lambda *a: bars.append(made(*a)) or bars[-1])
    monkeypatch.setattr(loader, "BAR_DELAY", 0.0)
    for path, stream, shown, dtype in ((kquant_file, Terminal(), True, torch.bfloat16),
                                       (kquant_file, io.StringIO(), False, torch.bfloat16),
                                       (kquant_file, Terminal(), True, torch.float32),
                                       (tiny_checkpoint, Terminal(), True, torch.float32)):
        monkeypatch.setattr(sys, "stderr", stream)
        load_model(path, dtype)
        assert (f"loading {path.name}" in stream.getvalue()) == shown, stream.getvalue()
        assert not shown or bars[-1].n == bars[-1].total > 0
    monkeypatch.setattr(kernels.kernel_lib(), "gguf_kernel", lambda kind, K: 0)     # every matrix dequantized, and
    monkeypatch.setattr(sys, "stderr", Terminal())      # a tied table read twice: for its lookups and as the head
    load_model(kquant_file, torch.bfloat16)
    assert [(bar.n, bar.total) for bar in bars[::4]] == [(bars[0].total, bars[0].total)] * 2 and bars[0].total


@pytest.mark.parametrize("method", ["ar", "sd", "tree", "easyspec", "selfdraft"])
def test_every_one_process_method_gives_ars_tokens_on_a_k_quant_file(kquant_file, method):
    digest = hashlib.sha256(kquant_file.read_bytes()).hexdigest()
    prompts = ["def add(a, b):\n", "class Point:\n    def", "for i in range(10):"]
    params = SamplingParams(max_new_tokens=24)
    with LLM(target=str(kquant_file), draft=str(kquant_file), method="ar", dtype="bfloat16") as ar:
        want = [o.tokens for o in ar.generate(prompts, params)]
    with LLM(target=str(kquant_file), draft=str(kquant_file), method=method, dtype="bfloat16") as llm:
        assert [o.tokens for o in llm.generate(prompts, params)] == want
        assert [llm.generate(p, params).tokens for p in prompts] == want      # alone as in the batch
    assert hashlib.sha256(kquant_file.read_bytes()).hexdigest() == digest       # the file's bytes unchanged


def test_the_c_forward_is_the_models_own_forward(kquant_file):
    """csrc/'s whole forward (a prefill in layer calls, then steps of one and of four tokens in one call) against the
    model's PyTorch forward, both float32, past Gemma's sliding window."""
    ref, fast = load_model(kquant_file, torch.float32, pack=False), load_model(kquant_file, torch.float32)
    assert type(fast.layers[0]).__name__ == "CBlock" and type(ref.layers[0]).__name__ == "Block"
    cfg = ref.config
    caches = [KVCache(cfg.num_layers, 1, 64, cfg.num_kv_heads, cfg.head_dim, m.cache_dtype, "cpu") for m in (ref, fast)]
    ids = torch.randint(0, 300, (1, 40), generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        for chunk in (ids[:, :20], ids[:, 20:21], ids[:, 21:22], ids[:, 22:26], ids[:, 26:27]):
            want, got = (m(chunk, c) for m, c in zip((ref, fast), caches))
            assert (got - want).abs().max().item() < 1e-3 * want.abs().max().item()
            for c in caches:
                c.commit_all()
