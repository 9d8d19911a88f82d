"""bench/shapes.py: tiny shapes written in F16 and read back with gguf.GGUFReader (metadata, tensor names, shapes and
types, the padded tokenizer), SmolLM2's tokenizer padded, and (slow: it needs llama.cpp's tools) llama-quantize."""
import dataclasses
import os
from pathlib import Path

import gguf
import numpy as np
import pytest

from specmesh.bench import shapes
from specmesh.model.loader import to_gguf

TINY = shapes.Shape("tiny", "llama", hidden=256, layers=2, heads=4, kv_heads=2, intermediate=512, vocab=512,
                    context=2048, rope_theta=500000.0, rms_eps=1e-5, tied=True, head_dim=64,
                    rope_llama3=(32.0, 1.0, 4.0, 8192))


@pytest.fixture(scope="module")
def small_tokenizer(tiny_checkpoint, tmp_path_factory):
    """A GGUF file whose tokenizer (300 tokens) the tiny shapes carry: GGUFReader reads SmolLM2's 49k in seconds."""
    return to_gguf(tiny_checkpoint, tmp_path_factory.mktemp("tok") / "tok.gguf", "f32")


def read_back(shape, tmp_path):
    return gguf.GGUFReader(shapes.write_f16(shape, tmp_path / f"{shape.name}.gguf", progress=False))


def meta(reader, key):
    return reader.fields[key].contents()


def test_a_llama_shape_reads_back(small_tokenizer, tmp_path):
    shape = dataclasses.replace(TINY, tokenizer=str(small_tokenizer))
    reader = read_back(shape, tmp_path)
    assert meta(reader, "general.architecture") == "llama"
    assert meta(reader, "general.file_type") == gguf.LlamaFileType.MOSTLY_F16
    want = {"block_count": 2, "embedding_length": 256, "feed_forward_length": 512, "attention.head_count": 4,
            "attention.head_count_kv": 2, "attention.key_length": 64, "vocab_size": 512, "rope.dimension_count": 64,
            "context_length": 2048, "rope.freq_base": 500000.0}
    assert {k: meta(reader, f"llama.{k}") for k in want} == want
    got = {t.name: (tuple(int(d) for d in t.shape), t.tensor_type) for t in reader.tensors}
    F16, F32 = gguf.GGMLQuantizationType.F16, gguf.GGMLQuantizationType.F32
    assert got["token_embd.weight"] == ((256, 512), F16)           # GGUF's dims: the row length first
    assert got["blk.1.attn_k.weight"] == ((256, 128), F16)
    assert got["blk.0.ffn_down.weight"] == ((512, 256), F16)
    assert got["blk.0.attn_norm.weight"] == ((256,), F32)
    assert "output.weight" not in got and len(got) == 1 + 1 + 9 * 2 + 1      # rope factors, embedding, layers, norm
    tensors = {t.name: t.data for t in reader.tensors}
    rope = tensors["rope_freqs.weight"]
    assert rope.shape == (32,) and rope[0] == 1.0 and rope[-1] == 32.0 and np.all(np.diff(rope) >= 0)
    w = tensors["blk.0.attn_q.weight"].astype(np.float32)
    assert np.isfinite(w).all() and abs(w.std() - shapes.STD) < 0.001
    assert np.all(tensors["output_norm.weight"] == 1.0)
    source = gguf.GGUFReader(small_tokenizer)
    n = len(meta(source, "tokenizer.ggml.tokens"))
    tokens, types = meta(reader, "tokenizer.ggml.tokens"), meta(reader, "tokenizer.ggml.token_type")
    assert len(tokens) == len(types) == 512
    assert tokens[:n] == meta(source, "tokenizer.ggml.tokens")
    assert types[:n] == meta(source, "tokenizer.ggml.token_type")
    assert tokens[n] == f"[PAD{n}]" and set(types[n:]) == {gguf.TokenType.UNUSED}
    assert meta(reader, "tokenizer.ggml.merges") == meta(source, "tokenizer.ggml.merges")


@pytest.mark.parametrize("arch", ["qwen3", "gemma3"])
def test_qwen3_and_gemma3_tensors_and_keys(arch, small_tokenizer, tmp_path):
    shape = dataclasses.replace(TINY, name=arch, arch=arch, rope_llama3=None, tied=arch == "gemma3",
                                sliding_window=512 if arch == "gemma3" else None,
                                rope_theta_swa=10000.0 if arch == "gemma3" else None, tokenizer=str(small_tokenizer))
    reader = read_back(shape, tmp_path)
    names = {t.name for t in reader.tensors}
    assert {"blk.0.attn_q_norm.weight", "blk.1.attn_k_norm.weight"} <= names and "rope_freqs.weight" not in names
    assert f"{arch}.vocab_size" not in reader.fields         # the converter writes it for llama only
    if arch == "qwen3":
        assert "output.weight" in names and "blk.0.post_attention_norm.weight" not in names
    else:
        assert {"blk.1.post_attention_norm.weight", "blk.1.post_ffw_norm.weight"} <= names
        assert "output.weight" not in names
        assert meta(reader, "gemma3.attention.sliding_window") == 512
        assert meta(reader, "gemma3.rope.freq_base_swa") == 10000.0
        norm = next(t.data for t in reader.tensors if t.name == "blk.0.attn_q_norm.weight")
        assert np.all(norm == 1.0)                  # stored w + 1, as the converter does, with w = 0


def test_smollm2_tokenizer_padded():
    """The Llama and Qwen shapes' tokenizer: SmolLM2's BPE and pre-tokenizer, its vocabulary padded as the converter
    pads (the file's own metadata: reading it twice would take seconds)."""
    from specmesh import catalog
    from specmesh.model.gguf import open_gguf
    source = shapes.tokenizer_source(shapes.SHAPES["Llama-3.2-1B"])
    assert source == catalog.known()["smollm2-135m-instruct"].path
    fields, want = shapes.tokenizer_fields(source, 49152 + 64), open_gguf(source).fields
    assert fields["tokenizer.ggml.pre"] == want["tokenizer.ggml.pre"] == "smollm"
    assert fields["tokenizer.ggml.tokens"][:49152] == want["tokenizer.ggml.tokens"]
    assert fields["tokenizer.ggml.tokens"][-1] == "[PAD49215]" and len(fields["tokenizer.ggml.tokens"]) == 49216
    assert fields["tokenizer.ggml.token_type"][49152:] == [gguf.TokenType.UNUSED] * 64
    assert fields["tokenizer.ggml.merges"] == want["tokenizer.ggml.merges"]
    assert fields["tokenizer.chat_template"] == want["tokenizer.chat_template"]
    with pytest.raises(shapes.ShapeError, match="more than"):
        shapes.tokenizer_fields(source, 1000)


def test_the_uniform_importance_matrix_in_llama_imatrix_legacy_layout(tmp_path):
    """What llama-quantize reads for the IQ1/IQ2 types: each matrix's name and a value per column, all equal."""
    shape = shapes.SHAPES["Llama-3.2-1B"]
    raw = shapes.uniform_imatrix(shape, tmp_path / "m.imatrix").read_bytes()
    matrices = [(name, dims[1]) for name, dims in shapes.tensors(shape) if len(dims) == 2]
    n, at, read = int(np.frombuffer(raw, np.int32, 1)[0]), 4, []
    for _ in range(n):
        length = int(np.frombuffer(raw, np.int32, 1, at)[0])
        name = raw[at + 4:at + 4 + length].decode()
        calls, columns = np.frombuffer(raw, np.int32, 2, at + 4 + length)
        values = np.frombuffer(raw, np.float32, columns, at + 12 + length)
        assert calls == 1 and np.all(values == 1.0)
        read.append((name, int(columns)))
        at += 12 + length + 4 * int(columns)
    assert at == len(raw) and read == matrices and ("blk.15.ffn_down.weight", 8192) in read


def test_files_never_go_into_the_repository():
    with pytest.raises(shapes.ShapeError, match="inside the repository"):
        shapes.out_dir(shapes.REPO / "build")


def test_the_published_shapes():
    counts = {name: shapes.parameters(s) for name, s in shapes.SHAPES.items()}
    assert round(counts["Llama-3.2-1B"] / 1e9, 2) == 1.24 and round(counts["Llama-3.1-8B"] / 1e9, 2) == 8.03
    assert round(counts["Qwen3-8B"] / 1e9, 2) == 8.19 and round(counts["Gemma-3-1B"] / 1e9, 2) == 1.0


@pytest.mark.slow
def test_quantized_by_llama_quantize(small_tokenizer, tmp_path, monkeypatch):
    """llama-quantize makes Q4_K_M (Q4_K with Q6_K where llama.cpp's rule says), Q8_0 and IQ2_XS (with the uniform
    importance matrix), the F16 and the importance matrix go, and llama.cpp runs the files."""
    if not os.environ.get("SPECMESH_LLAMACPP_BIN"):         # the suite's cache is a temporary one: the machine's
        monkeypatch.setenv("SPECMESH_LLAMACPP_BIN", str(Path(os.environ["SPECMESH_KERNEL_DIR"]) / "llama.cpp" / "bin"))
    try:
        shapes.tool("llama-quantize")
    except shapes.ShapeError as e:
        pytest.fail(str(e))
    shape = dataclasses.replace(TINY, tokenizer=str(small_tokenizer))
    q4, q8, iq2 = shapes.make(shape, ["Q4_K_M", "Q8_0", "IQ2_XS"], tmp_path, progress=False)
    assert {p.name for p in tmp_path.iterdir()} == {q4.name, q8.name, iq2.name}
    types = shapes.describe(q4)["tensor_types"]
    assert {"Q4_K", "Q6_K", "F32"} <= set(types) and "F16" not in types, types
    assert set(shapes.describe(q8)["tensor_types"]) == {"Q8_0", "F32"}
    assert "IQ2_XS" in shapes.describe(iq2)["tensor_types"]
    for path in (q4, q8, iq2):
        assert shapes.check(path, threads=2)["decode_tok_s"] > 0
