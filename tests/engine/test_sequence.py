"""`ar` decoding: stopping rules, sampling, batching of n, streaming, bad inputs."""
import numpy as np
import pytest
import torch

from specmesh import LLM, SamplingParams


@pytest.fixture(scope="module")
def llm(tiny_checkpoint):
    return LLM(target=tiny_checkpoint)


def greedy(llm, prompt="def add(a, b):", **kw):
    return llm.generate(prompt, SamplingParams(**({"max_new_tokens": 24} | kw)))


def test_greedy_matches_a_plain_forward_loop(llm):
    out = greedy(llm)
    ids = llm.encode("def add(a, b):")
    model = llm.models.target
    with torch.no_grad():
        for _ in range(24):
            ids.append(int(model(torch.tensor([ids]))[0, -1].argmax()))
    assert out.tokens == ids[-24:]
    assert out.stats.target_forwards == 24 and out.stats.tokens_per_forward == 1.0


def test_max_new_tokens_is_exact(llm):
    for n in (1, 2, 7):
        out = greedy(llm, max_new_tokens=n)
        assert len(out.tokens) == n and out.samples[0].finish_reason == "length"


def test_eos_ends_generation_and_is_kept_in_tokens(llm):
    base = greedy(llm).tokens
    eos = base[5]
    first = base.index(eos)
    cfg = llm.models.target.config
    old = cfg.eos_token_id
    cfg.eos_token_id = eos
    try:
        out = greedy(llm)
    finally:
        cfg.eos_token_id = old
    assert out.tokens == base[:first + 1]
    assert out.samples[0].finish_reason == "eos"
    assert out.text == llm.tokenizer.decode(base[:first])


def test_stop_string_cuts_text_and_tokens(llm):
    full = greedy(llm, max_new_tokens=40)
    text = full.text
    stop = text[len(text) // 2: len(text) // 2 + 2]
    cut = text.find(stop)
    out = greedy(llm, max_new_tokens=40, stop=[stop, "\x00never"])
    assert out.text == text[:cut]
    assert out.samples[0].finish_reason == "stop"
    assert out.tokens == full.tokens[:len(out.tokens)]
    assert len(llm.tokenizer.decode(out.tokens)) >= cut > len(llm.tokenizer.decode(out.tokens[:-1]))


def test_streamed_pieces_add_up_to_the_text(llm):
    params = SamplingParams(max_new_tokens=30, stop=["zz-not-there"])
    pieces = list(llm.stream("class Point:", params))
    assert "".join(pieces) == llm.generate("class Point:", params).text


def test_seeded_sampling_is_reproducible_and_seeds_differ(llm):
    def run(seed):
        return llm.generate("def", SamplingParams(max_new_tokens=16, temperature=1.0, seed=seed)).tokens
    assert run(1) == run(1)
    assert run(1) != run(2)


def test_n_samples_are_batched_and_independent(llm):
    out = llm.generate("def", SamplingParams(max_new_tokens=12, temperature=1.0, seed=0, n=4))
    assert len(out.samples) == 4
    assert out.tokens == out.samples[0].tokens and out.text == out.samples[0].text
    assert len({tuple(s.tokens) for s in out.samples}) > 1
    # one prefill for the four, then each sample's 11 steps (decoded as one batch)
    assert out.stats.target_forwards == 1 + 4 * 11


def test_top_k_one_is_greedy(llm):
    sampled = llm.generate("def", SamplingParams(max_new_tokens=16, temperature=0.7, top_k=1, seed=5))
    assert sampled.tokens == greedy(llm, "def", max_new_tokens=16).tokens


@pytest.mark.parametrize("kw, match", [
    ({"max_new_tokens": 0}, "max_new_tokens"), ({"max_new_tokens": -3}, "max_new_tokens"),
    ({"temperature": -0.1}, "temperature"), ({"temperature": float("nan")}, "temperature"),
    ({"top_p": 0.0}, "top_p"), ({"top_p": 1.5}, "top_p"), ({"n": 0}, "n must be"),
])
def test_bad_sampling_params(kw, match):
    with pytest.raises(ValueError, match=match):
        SamplingParams(**kw)


def test_empty_and_too_long_prompts(llm):
    with pytest.raises(ValueError, match="empty"):
        llm.generate("", SamplingParams())
    with pytest.raises(ValueError, match="does not fit the context"):
        llm.generate([1] * llm.context, SamplingParams())


@pytest.mark.parametrize("prompt, error, match", [
    ([[10 ** 9]], ValueError, "token id 1000000000 is outside the vocabulary"),     # read past the embedding
    ([[-1]], ValueError, "token id -1 is outside"), ([[1.5]], ValueError, "token id 1.5 is outside"),
    (["def", 5], TypeError, "prompts mix text and token ids"),
    ([{"text": "def"}], TypeError, "a prompt is text or a list of token ids, got dict"),
])
def test_bad_token_ids_are_refused_before_the_model_runs(llm, prompt, error, match):
    with pytest.raises(error, match=match):
        llm.generate(prompt, SamplingParams(max_new_tokens=2))
    assert llm.generate([np.int64(5), np.int64(7)], SamplingParams(max_new_tokens=2)).tokens == \
        llm.generate([5, 7], SamplingParams(max_new_tokens=2)).tokens       # numpy ids are one prompt's ids


def test_api_misuse_names_the_problem(llm):
    with pytest.raises(TypeError, match="params must be a SamplingParams"):
        llm.generate("def", {"max_new_tokens": 2})
    with pytest.raises(TypeError, match="target must be a model name or a path, got int"):
        LLM(target=5)
    with pytest.raises(ValueError, match="ignore_eos must be true or false"):
        SamplingParams(ignore_eos="no")
    params = SamplingParams(max_new_tokens=3)
    assert [o.tokens for o in llm.generate(("def", "class"), params)] == \
        [o.tokens for o in llm.generate(["def", "class"], params)]          # a tuple of prompts is a batch


def test_devices_this_pytorch_cannot_run_are_named(monkeypatch):
    from specmesh.llm import resolve_device
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match=r"device 'cuda:1': this PyTorch \(.*\) sees no CUDA GPU"):
        resolve_device("cuda:1")                    # was PyTorch's assertion from deep in the load
    with pytest.raises(ValueError, match="unknown device 'tpu'; use cpu, cuda or cuda:N"):
        resolve_device("tpu")
    with pytest.raises(ValueError, match="device 'meta': not one this PyTorch runs here"):
        resolve_device("meta")
    assert resolve_device("cpu") == torch.device("cpu")


def test_generation_near_the_context_end_stops_at_the_context(llm):
    prompt = [5] * (llm.context - 3)
    out = llm.generate(prompt, SamplingParams(max_new_tokens=10))
    assert len(out.tokens) == 3 and out.samples[0].finish_reason == "length"


def test_option_bounds_follow_their_meaning():
    """λ is a weight (any number >= 0), T_max 0 means none, stop_below is a probability."""
    from specmesh import methods
    assert methods.get("cosine", {"lam": 2.5, "max_step_ms": 0}).options["lam"] == 2.5
    for name, options, message in [("cosine", {"lam": -1}, "lam must be a number >= 0"),
                                   ("cosine", {"max_step_ms": -1}, "max_step_ms must be a natural number"),
                                   ("sd", {"stop_below": 1.5}, "stop_below must be a probability")]:
        with pytest.raises(ValueError, match=message):
            methods.get(name, options)


def test_each_method_refuses_at_once_what_it_cannot_give():
    from specmesh.methods import METHODS
    from specmesh.lossless.sampling import InvalidParameter
    asks = [(SamplingParams(logprobs=2), "logprobs", "logprobs"), (SamplingParams(frequency_penalty=0.5), "penalties",
                                                                   "frequency_penalty")]
    for name, spec in METHODS.items():
        for params, able, field in asks:
            if getattr(spec, able):
                spec.check_params(params)
            else:
                with pytest.raises(InvalidParameter, match=f"{field}: {name} does not"):
                    spec.check_params(params)
    assert [n for n, s in METHODS.items() if not s.logprobs] == ["pearl", "pp", "pipedec", "stpp"]
    assert [n for n, s in METHODS.items() if not s.penalties] == ["pp", "pipedec", "stpp"]


def test_dtype_auto_is_bfloat16_where_the_cpu_multiplies_it_fast(monkeypatch, tiny_checkpoint):
    from specmesh.kernels.build import kernel_lib, native_bf16
    from specmesh.llm import default_dtype
    monkeypatch.delenv("SPECMESH_DTYPE")                 # the suite's float32
    fast = kernel_lib() is not None or native_bf16()
    assert default_dtype("cpu") == ("bfloat16" if fast else "float32") and default_dtype("cuda") == "float32"
    assert LLM(target=tiny_checkpoint, method="ar").dtype == (torch.bfloat16 if fast else torch.float32)
    monkeypatch.setenv("SPECMESH_DTYPE", "half")
    with pytest.raises(ValueError, match="SPECMESH_DTYPE must be one of float32, bfloat16, float16, got 'half'"):
        LLM(target=tiny_checkpoint, method="ar")


def test_misuses_of_the_python_api_get_clear_errors(tiny_checkpoint):
    import numpy as np
    for make, error, message in [(lambda: LLM(target=tiny_checkpoint, max_batch=True), ValueError, "max_batch must be"),
                                 (lambda: LLM(target=tiny_checkpoint).tune("my text"), TypeError,
                                  "prompts must be a non-empty list of texts, got 'my text'"),
                                 (lambda: LLM(target=tiny_checkpoint, method="ar").tune(), ValueError,
                                  "tune chooses auto's method; this LLM runs ar"),
                                 (lambda: LLM(target=tiny_checkpoint, max_len=0), ValueError, "max_len must be"),
                                 (lambda: LLM(target=tiny_checkpoint, max_kv_mb=-1), ValueError, "max_kv_mb must be"),
                                 (lambda: LLM(target=tiny_checkpoint, dtype=torch.int8), ValueError,
                                  "dtype torch.int8 is not one a model runs in")]:
        with pytest.raises(error, match=message):
            make()
    llm = LLM(target=tiny_checkpoint)
    with pytest.raises(TypeError, match="stream takes one prompt"):
        llm.stream(["a", "b"])
    with pytest.raises(ValueError, match="no prompts"):
        llm.generate([])
    numpy = SamplingParams(max_new_tokens=np.int64(3), temperature=np.float32(0.5), seed=np.int64(1))
    assert type(numpy.max_new_tokens) is int and len(llm.generate("x", numpy).tokens) == 3


def test_unknown_method(tiny_checkpoint):
    with pytest.raises(ValueError, match="unknown method 'nope'; available: auto, ar"):
        LLM(target=tiny_checkpoint, method="nope")


def test_mismatched_vocabularies(tiny_checkpoint, tmp_path):
    import shutil

    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    from specmesh.llm import VocabularyMismatchError
    other = tmp_path / "other"
    shutil.copytree(tiny_checkpoint, other)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel()
    tok.train_from_iterator(["something else entirely"] * 5, trainers.BpeTrainer(vocab_size=280, show_progress=False))
    tok.save(str(other / "tokenizer.json"))
    with pytest.raises(VocabularyMismatchError, match="different vocabularies"):
        LLM(target=tiny_checkpoint, draft=other)


@pytest.mark.parametrize("checkpoint", ["tiny_checkpoint", "embedded"])
def test_a_row_decodes_byte_level_tokens_as_the_tokenizer_does(checkpoint, request):
    """A sequence builds a byte-level tokenizer's text from each token's bytes (linear time): the same text as
    a full decode after every token, split multi-byte characters and stop strings included."""
    import random
    from pathlib import Path
    from specmesh.engine.sequence import Prompt, Sequence
    from specmesh.model.tokenizer import Tokenizer
    path = Path(__file__).parents[2] / "models" / "target" if checkpoint == "embedded" else request.getfixturevalue(checkpoint)
    tokenizer = Tokenizer.from_dir(path)
    assert tokenizer.token_bytes is not None
    rng = random.Random(1)
    accented = tokenizer.encode("héllo wörld — ünïcode ✓ 日本語")
    for trial in range(30):
        ids = [rng.randrange(tokenizer.vocab_size) for _ in range(rng.randrange(1, 60))] + accented
        params = SamplingParams(max_new_tokens=1000, stop=["ö"] if trial % 3 == 0 else [])
        row = Sequence(Prompt([1]), params, tokenizer, {0}, 1000, torch.Generator())
        for i, t in enumerate(ids):
            row.extend([t])
            if row.finish:
                break
            assert row.text == tokenizer.decode(row.tokens)
        if row.finish == "stop":
            assert "ö" not in row.text and row.text == tokenizer.decode(row.tokens)[:len(row.text)]


def test_other_tokenizers_decode_in_full(tmp_path):
    """A tokenizer that is not byte-level (here a word-level one) gets no token bytes: a sequence decodes in full."""
    from tokenizers import Tokenizer as HFTokenizer, decoders, models, pre_tokenizers
    from specmesh.model.tokenizer import Tokenizer
    inner = HFTokenizer(models.WordLevel({"[UNK]": 0, "a": 1, "b": 2}, unk_token="[UNK]"))
    inner.pre_tokenizer = pre_tokenizers.Whitespace()
    inner.decoder = decoders.WordPiece()
    inner.save(str(tmp_path / "tokenizer.json"))
    assert Tokenizer.from_dir(tmp_path).token_bytes is None
