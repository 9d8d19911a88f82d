"""Models by name: the embedded pair, names resolved to paths, the draft made for a target, the served id."""
import pytest

from specmesh import catalog, embedded


def test_names_resolve_to_the_embedded_pair():
    assert catalog.resolve(None) == catalog.resolve("embedded") == catalog.resolve("specmesh-target") \
        == embedded.path("target")
    assert catalog.resolve("embedded", "draft") == catalog.resolve("specmesh-draft") == embedded.path("draft")
    assert catalog.draft_for(embedded.path("target")) == embedded.path("draft")


def test_a_path_stays_a_path_and_an_unknown_name_is_named(tmp_path):
    assert catalog.resolve(tmp_path / "model.gguf") == tmp_path / "model.gguf"
    assert catalog.draft_for(tmp_path) is None
    with pytest.raises(FileNotFoundError, match="no model named 'llama-70b' here.*known: specmesh-target"):
        catalog.resolve("llama-70b")


def test_served_name(tmp_path):
    assert catalog.served_name(None) == "specmesh-target"
    assert catalog.served_name("specmesh-draft") == "specmesh-draft"
    assert catalog.served_name(tmp_path / "Qwen2-0.5B.Q8_0.gguf") == "Qwen2-0.5B.Q8_0"
    assert catalog.served_name(tmp_path) == tmp_path.name


def test_a_drafts_own_options_are_sds_defaults_under_the_callers(tiny_checkpoint, tiny_draft_checkpoint, tmp_path):
    import json
    import shutil

    from specmesh import LLM, SamplingParams
    from specmesh.methods.speculative import depth_by_width
    draft = shutil.copytree(tiny_draft_checkpoint, tmp_path / "draft")
    (draft / catalog.PAIR_OPTIONS).write_text(json.dumps({"methods": {"sd": {"gamma": 6, "stop_below": 0.3}}}))
    llm = LLM(target=tiny_checkpoint, draft=draft, method="sd")
    assert llm.method.options["gamma"] == 6 and llm.method.options["stop_below"] == 0.3
    assert "gamma" not in llm.method.given                  # a default: the depth still narrows for wide batches
    assert [depth_by_width(w, 6) for w in (1, 2, 3, 4, 5)] == [6, 6, 3, 2, 0]
    ar = LLM(target=tiny_checkpoint, method="ar").generate("def f(x):", SamplingParams(max_new_tokens=12))
    assert llm.generate("def f(x):", SamplingParams(max_new_tokens=12)).tokens == ar.tokens
    mine = LLM(target=tiny_checkpoint, draft=draft, method="sd", gamma=2)
    assert mine.method.options["gamma"] == 2 and mine.method.options["stop_below"] == 0.3
    assert LLM(target=tiny_checkpoint, draft=tiny_draft_checkpoint, method="sd").method.options["gamma"] == 4
    (draft / catalog.PAIR_OPTIONS).write_text('{"sd": 6}')
    with pytest.raises(ValueError, match="options.json: not a draft's options file"):
        LLM(target=tiny_checkpoint, draft=draft, method="sd")
    (draft / catalog.PAIR_OPTIONS).write_text('{"methods": {"sd": {"gamma": "six"}}}')
    with pytest.raises(ValueError, match="sd: gamma must be a positive integer, got 'six'"):
        LLM(target=tiny_checkpoint, draft=draft, method="sd")
