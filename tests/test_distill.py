"""`specmesh train --teacher`: instructions split by subject, and the recipe end to end on a tiny teacher (the
teacher writing its own instructions: tests/model/test_smollm2.py)."""
import json

import torch

from specmesh import LLM, SamplingParams
from specmesh.model.loader import load_model
from specmesh.training.distill import DistillConfig, run
from specmesh.training.instructions import instructions


def test_heldout_instructions_ask_about_other_subjects():
    train, heldout = instructions(10**6, "train"), instructions(10**6, "heldout")
    assert len(train) > 400 and len(heldout) > 100 and not set(train) & set(heldout)
    assert instructions(10, "train", seed=3) == instructions(10, "train", seed=3) != instructions(10, "train")
    assert not any("palindrome" in t for t in heldout) or not any("palindrome" in t for t in train)


def test_a_draft_distilled_from_a_tiny_teacher(tiny_checkpoint, tmp_path):
    cfg = DistillConfig(teacher=str(tiny_checkpoint), out=str(tmp_path / "draft"), work=str(tmp_path / "work"),
                        instructions=4, heldout_instructions=2, answer_tokens=8, code_chars=30_000, steps=3,
                        batch=2, window=32, head_tokens=100, code_continuations=3, continuation_tokens=8)
    metrics = run(cfg)
    assert (tmp_path / "work" / "code-self.npy").stat().st_size > 0
    draft = load_model(tmp_path / "draft", torch.float32)
    assert draft.config.vocab_size == load_model(tiny_checkpoint).config.vocab_size
    assert draft.config.hidden_size == 256 and draft.lm_head.weight is draft.embed.weight
    saved = json.loads((tmp_path / "draft" / "metrics.json").read_text())
    assert set(saved) == {"chat", "code", "recipe"} and saved["code"]["tokens"] > 0
    assert saved["code"]["head_tokens"] == 100 and 0 <= saved["code"]["head_greedy_agreement"] <= 1
    assert load_model(tmp_path / "draft", torch.float32, draft=True).lm_head.out_features == 100
    assert 0 <= metrics["chat"]["greedy_agreement"] <= 1
    llm = LLM(target=tiny_checkpoint, draft=tmp_path / "draft", method="sd")       # usable as a draft
    ar = LLM(target=tiny_checkpoint, method="ar")
    params = SamplingParams(max_new_tokens=12)
    assert llm.generate("def f(x):", params).tokens == ar.generate("def f(x):", params).tokens


def test_distilling_goes_on_from_an_existing_draft(tiny_checkpoint, tmp_path):
    common = dict(teacher=str(tiny_checkpoint), instructions=2, heldout_instructions=1, answer_tokens=4,
                  code_chars=20_000, batch=2, window=16, head_tokens=100, code_continuations=2,
                  continuation_tokens=4)
    run(DistillConfig(out=str(tmp_path / "a"), work=str(tmp_path / "wa"), steps=2, **common))
    run(DistillConfig(out=str(tmp_path / "b"), work=str(tmp_path / "wb"), steps=1, lr=1e-9,
                      init=str(tmp_path / "a"), **common))
    a, b = (load_model(tmp_path / d, torch.float32) for d in "ab")
    assert torch.allclose(a.embed.weight, b.embed.weight, atol=1e-2)       # a step at lr 1e-9 from a
    assert json.loads((tmp_path / "b" / "metrics.json").read_text())["recipe"]["init"] == str(tmp_path / "a")
