"""The shipped model family, end to end: listing, parity with transformers, real draft, memory."""
import json
import subprocess
import sys

import pytest
import torch
import transformers
from conftest import run_measured

from specmesh import LLM, SamplingParams, embedded
from specmesh.bench.prompts import load_prompts


@pytest.fixture(scope="module")
def target_dir():
    try:
        return embedded.path("target")
    except FileNotFoundError as e:
        pytest.fail(f"the embedded models are missing ({e}); they are committed under models/")


@pytest.fixture(scope="module")
def prompts():
    return load_prompts(limit=2)


def test_models_lists_target_and_draft(target_dir):
    r = subprocess.run([sys.executable, "-m", "specmesh.cli", "models", "--json"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    rows = {row["name"]: row for row in json.loads(r.stdout)}
    target, draft = rows["specmesh-target"], rows["specmesh-draft"]
    assert (target["role"], target["draft"], draft["role"]) == ("target", "specmesh-draft", "draft")
    assert 20e6 <= target["parameters"] <= 30e6
    assert 3e6 <= draft["parameters"] <= 6e6
    assert all(set(row) == {"name", "role", "path", "parameters", "source", "draft"} for row in rows.values())
    table = subprocess.run([sys.executable, "-m", "specmesh.cli", "models"], capture_output=True, text=True).stdout
    assert "embedded               alias   specmesh-target" in table          # the name the README uses


def test_ar_greedy_equals_transformers_generate(target_dir, prompts):
    hf = transformers.AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()
    llm = LLM(method="ar", dtype="float32")
    for prompt in prompts:
        ids = llm.encode(prompt)
        with torch.no_grad():
            ref = hf.generate(torch.tensor([ids]), max_new_tokens=32, do_sample=False,
                              eos_token_id=hf.config.eos_token_id, pad_token_id=hf.config.eos_token_id)
        assert llm.generate(prompt, SamplingParams(max_new_tokens=32)).tokens == ref[0, len(ids):].tolist()


@pytest.mark.parametrize("method", ["sd", "tree", "selfdraft"])
def test_embedded_speculation_greedy_equals_ar_and_is_accepted(target_dir, prompts, method):
    ar, spec = LLM(method="ar"), LLM(method=method)
    accepted = drafted = 0
    for prompt in prompts:
        params = SamplingParams(max_new_tokens=40)
        out = spec.generate(prompt, params)
        assert out.tokens == ar.generate(prompt, params).tokens
        accepted += out.stats.accepted_tokens
        drafted += out.stats.drafted_tokens
        s = out.stats
        assert (s.generated_tokens - 1) / s.verifications > 1.5      # the first token comes from the prefill
    assert accepted > 0 and drafted > 0


def test_generate_with_target_and_draft_stays_under_1_5_gib(target_dir):
    rc, peak_mib = run_measured([sys.executable, "-m", "specmesh.cli", "generate", "def parse(text):", "--method", "sd",
                                 "--max-new-tokens", "16"])
    assert rc == 0
    assert peak_mib < 1536, f"peak RSS {peak_mib:.0f} MiB"
