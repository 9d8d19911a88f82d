"""GGUF files in: a GGUF written here from a small random Llama checkpoint loads as the same model, tokenizer
and chat template as the folder it came from; bad files give one-line errors (exit 2 from the CLI)."""
import json
import shutil
import subprocess
import sys

import gguf
import pytest
import torch
from torch import nn

from conftest import TEXT
from specmesh import kernels
from specmesh.model.gguf import GGUFError, permute_rope, read_gguf, split_then_bytes, unpermute_rope
from specmesh.model.loader import load_model, load_tokenizer, stamp, to_gguf

CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
          "'<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
# max |logit difference| against the folder's float32 model: F16 rounds each weight to 11 bits (relative
# 2^-11), Q8_0 to 1/127 of its block's largest; the tiny model's logits are O(10)
TOLERANCE = {"f32": 0.0, "f16": 0.05, "q8_0": 0.5}


@pytest.fixture(scope="module")
def chat_checkpoint(tiny_checkpoint, tmp_path_factory):
    path = tmp_path_factory.mktemp("chat")
    for f in tiny_checkpoint.iterdir():
        shutil.copy(f, path / f.name)
    (path / "tokenizer_config.json").write_text(json.dumps({"chat_template": CHATML, "eos_token": "<|endoftext|>"}))
    return path


@pytest.mark.parametrize("ftype", ["f32", "f16", "q8_0"])
def test_gguf_gives_the_folders_logits(chat_checkpoint, tmp_path, ftype):
    path = to_gguf(chat_checkpoint, tmp_path / "m.gguf", ftype)
    ids = torch.randint(0, 300, (1, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want = load_model(chat_checkpoint, torch.float32)(ids)
        got = load_model(path, torch.float32)(ids)
    assert got.shape == want.shape
    assert (got - want).abs().max().item() <= TOLERANCE[ftype]
    if ftype == "f32":
        assert torch.equal(got, want)


def test_gguf_config_tokenizer_and_chat_template(chat_checkpoint, tmp_path):
    path = to_gguf(chat_checkpoint, tmp_path / "m.gguf", "f32")
    checkpoint = read_gguf(path)
    folder = json.loads((chat_checkpoint / "config.json").read_text())
    assert checkpoint.config.num_kv_heads == folder["num_key_value_heads"]
    assert checkpoint.config.num_layers == folder["num_hidden_layers"]
    ours, theirs = load_tokenizer(path), load_tokenizer(chat_checkpoint)
    for text in (TEXT, "x = 12345 + 678\n\tprint('héllo wörld')  # 🙂", "<|endoftext|> after"):
        assert ours.encode(text) == theirs.encode(text)
        assert ours.decode(ours.encode(text)) == theirs.decode(theirs.encode(text))
    assert ours.chat_template == CHATML
    messages = [{"role": "user", "content": "hi"}]
    assert ours.render_chat(messages) == theirs.render_chat(messages) == \
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


# pre-tokenizers as the folders' tokenizer.json hold them (Qwen2.5 and Qwen3; Mistral's Tekken), by the name their
# GGUF files give them
FOLDER_PRE = {
    "qwen2": split_then_bytes(r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
                              r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+", trim_offsets=False),
    "tekken": split_then_bytes(r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
                               r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
                               r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")}


@pytest.mark.parametrize("name", FOLDER_PRE)
def test_a_tokenizers_split_is_named_in_its_file_and_read_back(name, chat_checkpoint, tmp_path):
    """A folder with Qwen's (Mistral's) pre-tokenizer becomes a file whose tokenizer.ggml.pre is "qwen2" ("tekken"),
    read back with the same rule (a digit a piece, ...): the same tokens as the folder's, not GPT-2's split."""
    from specmesh.model.gguf import open_gguf
    folder = tmp_path / name
    shutil.copytree(chat_checkpoint, folder)
    spec = json.loads((folder / "tokenizer.json").read_text())
    (folder / "tokenizer.json").write_text(json.dumps(spec | {"pre_tokenizer": FOLDER_PRE[name]}))
    path = to_gguf(folder, tmp_path / f"{name}.gguf", "f32")
    assert open_gguf(path).fields["tokenizer.ggml.pre"] == name
    ours, theirs = load_tokenizer(path), load_tokenizer(folder)
    for text in (TEXT, "x = 12345 + 678 (width)*2\n\tprint('héllo wörld') I'LL DON'T XMLHttpRequest a/b/c",
                 "<|endoftext|> after"):
        assert ours.encode(text) == theirs.encode(text)


def test_a_files_tokenizer_is_built_once_and_read_back_from_the_cache(chat_checkpoint, tmp_path, monkeypatch):
    """The tokenizer.json, config and tokens' bytes a GGUF file's metadata gives are kept under the file's identity
    and read back the same; a damaged entry is made again; a changed file gets its own."""
    from specmesh.model import gguf as ours
    monkeypatch.setenv("SPECMESH_CACHE_DIR", str(tmp_path / "cache"))
    path = to_gguf(chat_checkpoint, tmp_path / "m.gguf", "f32")
    built = ours.read_file_tokenizer(path)
    pieces = built.token_bytes
    entries = sorted(p.name.split(".", 1)[1] for p in (tmp_path / "cache" / "tokenizers").iterdir())
    assert entries == ["config.json", "json", "pieces"] and pieces is not None
    calls = []
    monkeypatch.setattr(ours, "tokenizer_spec", lambda p: calls.append(p) or pytest.fail("read the metadata again"))
    cached = ours.read_file_tokenizer(path)
    assert cached.token_bytes == pieces and cached.config == built.config and not calls
    for text in (TEXT, "<|endoftext|> after"):
        assert cached.encode(text) == built.encode(text)
    monkeypatch.undo()
    monkeypatch.setenv("SPECMESH_CACHE_DIR", str(tmp_path / "cache"))
    cached.pieces_file.write_bytes(b"specmesh-pieces-1\n" + b"\x05" * 9)        # cut short
    assert ours.read_file_tokenizer(path).token_bytes == pieces
    path.write_bytes(path.read_bytes())                  # another modification time: another entry
    ours.read_file_tokenizer(path)
    assert len(list((tmp_path / "cache" / "tokenizers").glob("*.config.json"))) == 2



def test_a_headers_string_arrays_are_walked_once_per_file(chat_checkpoint, tmp_path, monkeypatch):
    """A second read of a GGUF header jumps over its vocabulary's strings to their cached end and gives the same
    fields; a rewritten file is walked again."""
    from specmesh.model import gguf_file
    monkeypatch.setenv("SPECMESH_CACHE_DIR", str(tmp_path / "cache"))
    path = to_gguf(chat_checkpoint, tmp_path / "m.gguf", "f32")
    key = f"{path.resolve()}:{path.stat().st_size}:{path.stat().st_mtime_ns}"
    first = gguf_file.GGUFFile(path, key)
    walks = []
    real_walk = gguf_file.walk
    monkeypatch.setattr(gguf_file, "walk", lambda *a: walks.append(a) or real_walk(*a))
    second = gguf_file.GGUFFile(path, key)
    assert not walks                                     # the header's arrays were skipped over
    assert second.fields == first.fields and list(second.fields["tokenizer.ggml.tokens"])[:300] == \
        list(first.fields["tokenizer.ggml.tokens"])[:300]
    assert [(t.name, t.shape, t.kind) for t in second.tensors] == [(t.name, t.shape, t.kind) for t in first.tensors]
    walks.clear()
    gguf_file.GGUFFile(path, key + "-rewritten")
    assert walks
@pytest.mark.parametrize("messages, match", [
    ([], "messages must be a non-empty list"), ("hi", "messages must be a non-empty list"),
    ([{"content": "hi"}], r"messages\[0\] needs a string role and a string content"),
    ([{"role": "user", "content": "hi"}, {"role": "user", "content": 5}], r"messages\[1\] needs"),
])
def test_malformed_chat_messages_are_named(chat_checkpoint, messages, match):
    with pytest.raises(ValueError, match=match):            # not a template's jinja error
        load_tokenizer(chat_checkpoint).render_chat(messages)


def test_rope_order_round_trips():
    w = torch.randn(3 * 8, 5)
    assert torch.equal(unpermute_rope(permute_rope(w, 3), 3), w)


def write_gguf(path, arch="llama", tokenizer="gpt2"):
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(1)
    writer.add_tokenizer_model(tokenizer)
    writer.add_tensor("token_embd.weight", torch.zeros(4, 8).numpy())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_the_files_types_are_the_gguf_packages():
    """Reading a file takes ggml's types from a table of its own (the package's import is a tenth of a second of
    every start): each entry as the package has it, and the types it lacks looked up in the package."""
    from specmesh.model.gguf_file import TYPES, tensor_type
    for kind, (name, block, size) in TYPES.items():
        known = gguf.GGMLQuantizationType(kind)
        assert (name, block, size) == (known.name, *gguf.GGML_QUANT_SIZES[known])
    iq4 = gguf.GGMLQuantizationType.IQ4_XS
    assert tensor_type(iq4.value) == ("IQ4_XS", *gguf.GGML_QUANT_SIZES[iq4])
    with pytest.raises(GGUFError, match="unknown type 999"):
        tensor_type(999)
    from specmesh.model.gguf import FLOATS
    values = torch.randn(3, 64).numpy()
    raw = {"F32": values, "F16": values.astype("float16"), "BF16": torch.from_numpy(values).bfloat16().view(torch.int16)
           .numpy()}
    for name, convert in FLOATS.items():
        data = raw[name].view("uint8")
        assert (convert(data) == gguf.quants.dequantize(data, gguf.GGMLQuantizationType[name])).all(), name


@pytest.mark.parametrize("ftype", ["q8_0", "q4_0", "q4_1"])
def test_a_files_blocks_are_its_dequantized_values(chat_checkpoint, tmp_path, ftype):
    """read_blocks on every CPU (the kernels that multiply the blocks run only where AMX does not): the integers
    times each block's d, plus Q4_1's offset, are the values the file dequantizes to."""
    from specmesh.model.gguf import dequantize, open_gguf, read_blocks
    path = to_gguf(chat_checkpoint, tmp_path / f"{ftype}.gguf", ftype)
    matrices = [t for t in open_gguf(path).tensors if t.name.startswith("blk.") and len(t.shape) == 2]
    for t in matrices:
        b = read_blocks(t)
        N, K = t.shape
        values = b.q.reshape(N, K // 32, 32).float() * b.d[..., None] + (0 if b.m is None else b.m[..., None])
        assert torch.allclose(values.reshape(N, K), torch.from_numpy(dequantize(path, t)).view(N, K),
                              rtol=1e-6, atol=1e-6), t.name


def test_a_file_read_again_leaves_the_gguf_package_unimported(chat_checkpoint, tmp_path):
    """The first read builds the file's tokenizer (with the package's token types) and caches it; later ones, as
    every start of `generate` on the file, read it without the package."""
    path = to_gguf(chat_checkpoint, tmp_path / "m.gguf", "q8_0")
    code = (f"import sys; from specmesh.model.loader import load_model, load_tokenizer; load_model({str(path)!r}); "
            f"load_tokenizer({str(path)!r}).render_chat([{{'role': 'user', 'content': 'hi'}}]); "
            f"print('gguf' in sys.modules)")
    first, again = (subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
                    for _ in range(2))
    assert (first.strip(), again.strip()) == ("True", "False")


def test_bad_files_name_their_problem(chat_checkpoint, tmp_path):
    text = tmp_path / "notes.gguf"
    text.write_text("hello")
    whole = to_gguf(chat_checkpoint, tmp_path / "m.gguf", "f32").read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(whole[:len(whole) * 2 // 3])
    header_cut = tmp_path / "header.gguf"
    header_cut.write_bytes(whole[:200])
    cases = {text: "is not a GGUF file", cut: "truncated", header_cut: "truncated",
             write_gguf(tmp_path / "gpt2.gguf", arch="gpt2"): "architecture 'gpt2' is not supported",
             tmp_path / "absent.gguf": "GGUF file not found"}
    for path, problem in cases.items():
        with pytest.raises(GGUFError, match=problem):
            read_gguf(path)
    wordpiece = write_gguf(tmp_path / "bert.gguf", tokenizer="bert")
    with pytest.raises(GGUFError, match="tokenizer 'bert' is not supported"):
        load_tokenizer(wordpiece)
    r = subprocess.run([sys.executable, "-m", "specmesh.cli", "generate", "hi", "--target", str(cut)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    assert r.stderr.count("\n") == 1 and "cut.gguf: truncated" in r.stderr


def test_a_gguf_rewritten_in_16_bits_is_the_model_specmesh_runs_in_16_bits(chat_checkpoint, tmp_path, monkeypatch):
    """Where specmesh dequantizes a file's blocks, llama.cpp gets a bf16 copy of what it runs."""
    from specmesh.bench import llamacpp
    from specmesh.model import loader
    for module in (loader, llamacpp):                   # (on x86 the file's blocks run as they are)
        monkeypatch.setattr(module, "runs_blocks", lambda *a, **k: False)
        monkeypatch.setattr(module, "runs_file_blocks", lambda *a, **k: False)
    monkeypatch.setattr(llamacpp, "cache_dir", lambda: tmp_path)
    source = to_gguf(chat_checkpoint, tmp_path / "q8.gguf", "q8_0")
    copy = llamacpp.cached_gguf(source, "bf16")                        # what llama.cpp gets for a bf16 run
    ids = torch.randint(0, 300, (1, 16), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.equal(load_model(copy, torch.bfloat16)(ids), load_model(source, torch.bfloat16)(ids))
    assert load_tokenizer(copy).chat_template == CHATML


@pytest.mark.cpu("avx2", "f16c")
def test_a_16_bit_file_loads_matrix_by_matrix_as_the_model_dequantized_whole(chat_checkpoint, tmp_path, monkeypatch):
    """In a bf16 run on x86 a BF16 file's matrices are read into bf16 one at a time (loader.load_file_blocks): the
    model is the checkpoint it was written from, in bf16, logit for logit, as the whole file dequantized gives it."""
    from specmesh.model import loader
    source = to_gguf(chat_checkpoint, tmp_path / "bf16.gguf", "bf16")
    assert loader.runs_file_blocks(source, torch.bfloat16)
    ids = torch.randint(0, 300, (1, 16), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = load_model(chat_checkpoint, torch.bfloat16)(ids)
        assert torch.equal(load_model(source, torch.bfloat16)(ids), want)
        monkeypatch.setattr(loader, "runs_file_blocks", lambda *a, **k: False)
        assert torch.equal(load_model(source, torch.bfloat16)(ids), want)


@pytest.mark.parametrize("ftype", ["q8_0", "q4_0", "q4_1"])
def test_a_gguf_files_blocks_run_as_they_are(chat_checkpoint, tmp_path, ftype):
    """In a bf16 run where Q8Linear takes them (AVX512-VNNI without AMX: loader.runs_blocks), a Q8_0 / Q4_0 / Q4_1
    file's matrices are multiplied as they are (its logits within activation-quantization rounding of the
    dequantized float32 model), and llama.cpp gets that file; elsewhere they are not Q8Linear's, and llama.cpp gets
    the file where its matrices run from it (loader.runs_file_blocks: the layers' blocks, the bf16 table dense)."""
    from specmesh.bench import llamacpp
    from specmesh.model import loader
    source = to_gguf(chat_checkpoint, tmp_path / f"{ftype}.gguf", ftype)
    model = load_model(source, torch.bfloat16)
    kinds = {m.KIND for m in model.modules() if isinstance(m, kernels.Q8Linear)}
    if not loader.runs_blocks(source, torch.bfloat16):
        assert not kinds
        assert (llamacpp.cached_gguf(source, "bf16") == source) == loader.runs_file_blocks(source, torch.bfloat16)
        return
    # one kind: the tied head is the bf16 embedding table here
    assert len(kinds) == 1 and kinds <= {kind for kind, _ in kernels.Q8Linear.KINDS.values()}, kinds
    assert not any(isinstance(m, (nn.Linear, kernels.BF16Linear)) for m in model.layers.modules())
    ids = torch.randint(0, 300, (1, 24), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        got, want = model(ids).float(), load_model(source, torch.float32)(ids)
    assert (got - want).abs().max().item() <= 0.1 * want.abs().max().item()
    assert llamacpp.cached_gguf(source, "bf16") == source


def test_a_file_past_q8linears_bound_runs_packed_from_its_bytes(chat_checkpoint, tmp_path, monkeypatch):
    """Where Q8Linear would take a Q8_0 file (AVX512-VNNI without AMX, made so here), a file larger than
    Q8LINEAR_MOST_BYTES runs packed instead (runs_file_blocks): Q8Linear's load holds it dequantized first."""
    from specmesh.model import loader
    source = to_gguf(chat_checkpoint, tmp_path / "q8_0.gguf", "q8_0")
    monkeypatch.setattr(loader, "q8_lib", kernels.kernel_lib)
    monkeypatch.setattr(loader, "vnni_products", lambda lib: True)
    assert loader.runs_blocks(source, torch.bfloat16) and not loader.runs_file_blocks(source, torch.bfloat16)
    monkeypatch.setattr(loader, "Q8LINEAR_MOST_BYTES", source.stat().st_size - 1)
    assert not loader.runs_blocks(source, torch.bfloat16) and loader.runs_file_blocks(source, torch.bfloat16)


@pytest.mark.cpu(*kernels.Q8, "-amx_tile")   # a file's blocks on Q8Linear (loader.runs_blocks): VNNI, no AMX
@pytest.mark.parametrize("ftype", ["q8_0", "q4_1"])
def test_a_gguf_files_packed_matrices_are_cached_and_load_the_same_model(chat_checkpoint, tmp_path, monkeypatch,
                                                                           ftype):
    """The first load of a Q8_0 / Q4_1 file writes its matrices packed for Q8Linear under the file's identity
    (model/packed.py), the next one the other weights; later loads build the model from them without reading a
    block or a weight of the file, and compute the same logits bit for bit, one row and several; a damaged cache
    file is made again."""
    from specmesh.model import gguf as gguf_module, packed
    monkeypatch.setenv("SPECMESH_CACHE_DIR", str(tmp_path / "cache"))
    source = to_gguf(chat_checkpoint, tmp_path / f"{ftype}.gguf", ftype)
    ids = torch.randint(0, 300, (3, 17), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        first = load_model(source, torch.bfloat16)
        want, want_short = first(ids), first(ids[:1, :5])
        (cached,) = (tmp_path / "cache" / "packed").glob("*.safetensors")
        real, real_weights = gguf_module.read_blocks, gguf_module.read_weights
        monkeypatch.setattr(gguf_module, "read_blocks", lambda t: pytest.fail("a cached load read the blocks"))
        again = load_model(source, torch.bfloat16)
        assert torch.equal(again(ids), want) and torch.equal(again(ids[:1, :5]), want_short)
        assert {type(m) for m in again.layers.modules()} >= {kernels.Q8Linear}
        assert len(list((tmp_path / "cache" / "packed").glob("*.state.safetensors"))) == 1
        monkeypatch.setattr(gguf_module, "read_weights", lambda *a, **k: pytest.fail("a cached load read weights"))
        third = load_model(source, torch.bfloat16)
        assert torch.equal(third(ids), want) and torch.equal(third(ids[:1, :5]), want_short)
        cached.write_bytes(b"not a safetensors file")
        monkeypatch.setattr(gguf_module, "read_blocks", real)
        monkeypatch.setattr(gguf_module, "read_weights", real_weights)
        assert torch.equal(load_model(source, torch.bfloat16)(ids), want)       # repacked, and written again
        assert packed.read(stamp(source)) is not None


def test_generate_chat_sends_the_rendered_template(chat_checkpoint, tmp_path):
    from specmesh import LLM, SamplingParams
    path = to_gguf(chat_checkpoint, tmp_path / "m.gguf", "f32")
    r = subprocess.run([sys.executable, "-m", "specmesh.cli", "generate", "--target", str(path), "--method", "ar",
                        "--chat", "hi", "--system", "be brief", "--max-new-tokens", "6", "--json"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    llm = LLM(target=path, method="ar")
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    assert json.loads(r.stdout)["tokens"] == llm.chat(messages, SamplingParams(max_new_tokens=6)).tokens
    assert llm.tokenizer.render_chat(messages).startswith("<|im_start|>system\nbe brief<|im_end|>")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["from-its-blocks", "dequantized"])
def test_a_gguf_file_without_a_weight_the_model_reads_fails_in_one_line_naming_it(tiny_checkpoint, tmp_path, dtype):
    from specmesh.model.gguf import write_gguf
    from specmesh.model.loader import CheckpointError, read_config, read_weights
    weights = read_weights(tiny_checkpoint)
    del weights["model.layers.1.mlp.down_proj.weight"]
    path = write_gguf(tmp_path / "m.gguf", read_config(tiny_checkpoint), weights, load_tokenizer(tiny_checkpoint),
                      "q8_0")
    with pytest.raises(CheckpointError, match=r"m\.gguf: weight model\.layers\.1\.mlp\.down_proj\.weight is missing$"):
        load_model(path, dtype)
