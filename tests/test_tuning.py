"""`--method auto`: the choice on scripted costs, the cache, and the real thing on tiny models."""
import json

import pytest

from specmesh import LLM, SamplingParams, tuning
from specmesh.tuning import Costs, Trial

FLAT = Costs({1: 2.0, 32: 2.0}, {1: 0.2, 8: 0.2})           # any width costs one forward (AMX-like)
STEEP = Costs({1: 2.0, 2: 3.0, 8: 9.0, 32: 33.0}, {1: 0.2, 8: 1.0})   # every token costs (no AMX, old kernels)


def ar_trial(ms_per_token=2.0):
    return Trial("ar", {}, tokens=100, steps=100, target_tokens=100, draft_forwards=0, draft_width=1,
                 ms=100 * ms_per_token)


def cand(method, options, ms, how="measured"):
    return tuning.Candidate(method, options, ms, f"..., {how}")


def favouring(*gammas):
    """tuning.predict, with sd's predictions (not measurements) at these γ fastest by far."""
    real = tuning.predict

    def predict(costs, trials):
        out = real(costs, trials)
        for c in out:
            if c.method == "sd" and c.options.get("gamma") in gammas and c.reason.endswith("predicted"):
                c.ms_per_token = 1e-3
        return sorted(out, key=lambda c: c.ms_per_token)
    return predict


def sd_trial(tau=3.0, gamma=6, step_ms=4.0):
    return Trial("sd", {"gamma": gamma}, tokens=int(30 * tau), steps=30, target_tokens=30 * (gamma + 1),
                 draft_forwards=30 * gamma, draft_width=1, ms=30 * step_ms)


def test_a_calibrated_candidate_predicts_what_it_measured():
    [ar] = tuning.predict(FLAT, [ar_trial(2.5)])
    assert ar.ms_per_token == pytest.approx(2.5)            # 2 ms forward + 0.5 ms overhead per step
    sd = next(c for c in tuning.predict(FLAT, [sd_trial(3.0, 6, 4.4)]) if c.options["gamma"] == 6)
    assert sd.ms_per_token == pytest.approx(4.4 / 3.0) and "measured" in sd.reason


def test_a_run_faster_than_the_timed_forwards_counts_as_it_ran():
    """The forwards timed in a slow spell (2 ms) and ar run at 1 ms a token: ar is 1 ms, not the 2 ms of its
    forward; sd's other γ are predicted at the speed its own run had (half the costs' here)."""
    [ar] = tuning.predict(FLAT, [ar_trial(1.0)])
    assert ar.ms_per_token == pytest.approx(1.0) and "measured" in ar.reason
    slow, fast = (tuning.predict(FLAT, [sd_trial(3.0, 6, ms)]) for ms in (3.2, 1.6))  # 3.2 ms: the costs' own step
    for a, b in zip(slow, fast):
        assert (a.options, b.ms_per_token) == (b.options, pytest.approx(a.ms_per_token / 2))


def test_sd_gamma_is_extrapolated_from_the_fitted_acceptance():
    alpha = tuning.fitted_alpha(3.0, 6)
    assert (1 - alpha ** 7) / (1 - alpha) == pytest.approx(3.0)
    # flat target: 6 drafts of 0.2 ms + 2 ms forward = 3.2 ms; overhead 0.8 ms
    cands = {c.options["gamma"]: c for c in tuning.predict(FLAT, [sd_trial(3.0, 6, 4.0)])}
    g = 4
    tau = (1 - alpha ** (g + 1)) / (1 - alpha)
    assert cands[g].ms_per_token == pytest.approx((2.0 + g * 0.2 + 0.8) / tau) and "predicted" in cands[g].reason
    assert sorted(cands) == list(range(1, tuning.MAX_SD_GAMMA + 1))


@pytest.mark.parametrize("costs, tau, best", [
    (FLAT, 5.5, range(6, 9)),       # width is free, acceptance high: long chains
    (FLAT, 1.6, range(1, 4)),       # acceptance low: short ones
    (STEEP, 5.5, range(2, 6)),      # every verified token costs a share of a forward: shorter than on FLAT
])
def test_auto_picks_gamma_from_costs_and_acceptance(costs, tau, best):
    step = tuning.by_width(costs.target_ms)(7) + 6 * 0.2 + 0.5
    choice = tuning.pick(tuning.predict(costs, [ar_trial(2.0), sd_trial(tau, 6, step)]))
    assert choice.method in ("sd", "ar")
    if choice.method == "sd":
        assert choice.options["gamma"] in best


@pytest.mark.parametrize("ar_ms, selfdraft_ms, tree_ms, expected", [
    (2.0, 1.0, 1.5, "selfdraft"),
    (2.0, 1.98, 1.99, "ar"),        # within the 3% margin: plain decoding is kept
    (2.0, 3.0, 1.2, "tree"),
])
def test_auto_picks_the_fastest_family(ar_ms, selfdraft_ms, tree_ms, expected):
    trials = [ar_trial(ar_ms),
              Trial("selfdraft", {"branches": 1}, 100, 50, 300, 0, 1, 100 * selfdraft_ms),
              Trial("tree", {"gamma": 5, "tree_width": 3}, 100, 25, 400, 125, 3, 100 * tree_ms)]
    assert tuning.pick(tuning.predict(FLAT, trials)).method == expected


def test_choice_is_cached_per_key_and_measured_again_on_request(tiny_checkpoint, tiny_draft_checkpoint, tmp_path,
                                                               monkeypatch):
    monkeypatch.setenv("SPECMESH_CACHE_DIR", str(tmp_path))
    calls = []
    real = tuning.measure_choice
    monkeypatch.setattr(tuning, "measure_choice", lambda *a, **k: calls.append(1) or real(*a, **k))
    first = LLM(target=tiny_checkpoint, draft=tiny_draft_checkpoint).tune()
    again = LLM(target=tiny_checkpoint, draft=tiny_draft_checkpoint)         # the cached choice, without tune()
    assert len(calls) == 1 and again.choice == first and again.tune() == first and len(calls) == 1
    LLM(target=tiny_checkpoint, draft=tiny_draft_checkpoint, dtype="bfloat16").tune()       # another key
    LLM(target=tiny_checkpoint, draft=tiny_draft_checkpoint).tune(remeasure=True)
    assert len(calls) == 3
    monkeypatch.setenv("SPECMESH_KERNELS", "no-lend")                 # kernels switched: another key, not calibrated
    assert LLM(target=tiny_checkpoint, draft=tiny_draft_checkpoint).choice.default_for
    monkeypatch.delenv("SPECMESH_KERNELS")
    monkeypatch.setattr(tuning, "kernel_version", lambda: "changed")                # other C kernels: measured again
    assert LLM(target=tiny_checkpoint, draft=tiny_draft_checkpoint).choice.default_for     # not calibrated: default
    assert len(calls) == 3
    stored = json.loads((tmp_path / "tune.json").read_text())
    assert len(stored) == 2 and all(e["method"] in ("ar", "sd", "tree") for e in stored.values())


def test_auto_without_a_calibration_runs_the_default_and_generates_nothing_in_the_constructor(
        tiny_checkpoint, tiny_draft_checkpoint, tmp_path, monkeypatch):
    """LLM(method="auto") with nothing cached takes its kind of machine's default (tuning.DEFAULTS) and runs no
    step while it is built; the first request says it is a default; tune() then measures and replaces it."""
    from specmesh.engine.engine import Engine
    monkeypatch.setenv("SPECMESH_CACHE_DIR", str(tmp_path))
    step = Engine.step
    monkeypatch.setattr(Engine, "step", lambda self: pytest.fail("the constructor ran a step"))
    llm = LLM(target=tiny_checkpoint, draft=tiny_draft_checkpoint)
    kind = tuning.cpu_kind(llm.device)
    expected = next((m for m in tuning.DEFAULTS[kind] if m == "sd"), "ar")
    assert llm.choice.default_for.startswith(kind) and llm.method.name == expected and not llm.choice.candidates
    assert "the default on" in llm.choice.summary() and not (tmp_path / "tune.json").exists()
    monkeypatch.setattr(Engine, "step", step)
    ar = LLM(target=tiny_checkpoint, method="ar")
    params = SamplingParams(max_new_tokens=12)
    assert llm.generate("def f(x):", params).tokens == ar.generate("def f(x):", params).tokens
    assert llm.tune().candidates and not llm.choice.default_for and (tmp_path / "tune.json").exists()


def test_the_default_follows_the_kind_of_machine(tiny_checkpoint, tiny_draft_checkpoint, monkeypatch):
    llm = LLM(target=tiny_checkpoint, draft=tiny_draft_checkpoint, method="ar")
    for units, kind in (("avx2+avx512f+amx_tile", "amx"), ("avx2+avx512f", "avx512"), ("avx2", "avx2"), ("", "cpu")):
        monkeypatch.setattr(tuning, "vector_units", lambda: units)
        assert tuning.cpu_kind(llm.device) == kind
        choice = tuning.default_choice(llm, tiny_draft_checkpoint)
        assert choice.method == next(iter(tuning.DEFAULTS[kind]), "ar") and choice.default_for.startswith(kind)
    assert tuning.default_choice(llm, None).method == "ar"          # no draft, no n-gram table: nothing else runs


def test_auto_is_lossless_and_uses_what_it_chose(tiny_checkpoint, tiny_draft_checkpoint, unscreened):
    llm = LLM(target=tiny_checkpoint, draft=tiny_draft_checkpoint)
    llm.tune()
    assert llm.method.name == llm.choice.method and {c.method for c in llm.choice.candidates} == {"ar", "sd", "tree"}
    assert llm.choice.summary().startswith(f"auto: {llm.choice.method}")
    ar = LLM(target=tiny_checkpoint, method="ar")
    params = SamplingParams(max_new_tokens=20)
    for prompt in ["def f(x):", "class A:\n"]:
        assert llm.generate(prompt, params).tokens == ar.generate(prompt, params).tokens


def test_auto_without_a_draft_or_ngram_table_is_ar_unmeasured(tiny_checkpoint, monkeypatch):
    monkeypatch.setattr(tuning, "measure_choice", lambda *a, **k: pytest.fail("nothing to choose from: no measurement"))
    llm = LLM(target=tiny_checkpoint)
    assert llm.method.name == "ar" and llm.choice.candidates == [] and llm.tune().method == "ar"


def test_given_options_override_the_choice(tiny_checkpoint, tiny_draft_checkpoint):
    llm = LLM(target=tiny_checkpoint, draft=tiny_draft_checkpoint, gamma=2, tree_width=2)
    llm.tune()
    if llm.method.name in ("sd", "tree"):
        assert llm.method.options["gamma"] == 2


@pytest.fixture(scope="module")
def chat_checkpoint(tiny_checkpoint, tmp_path_factory):
    """The tiny model with a ChatML-like template whose first token is its own ('<|endoftext|>')."""
    import shutil
    path = shutil.copytree(tiny_checkpoint, tmp_path_factory.mktemp("chat") / "m")
    template = "{% for m in messages %}<|endoftext|>{{ m['role'] }}\n{{ m['content'] }}\n{% endfor %}" \
               "{% if add_generation_prompt %}<|endoftext|>assistant\n{% endif %}"
    (path / "tokenizer_config.json").write_text(json.dumps({"chat_template": template}))
    return path


def test_auto_chooses_for_chat_and_for_text_prompts_apart(chat_checkpoint, tiny_draft_checkpoint, tmp_path,
                                                          monkeypatch):
    monkeypatch.setenv("SPECMESH_CACHE_DIR", str(tmp_path))
    llm = LLM(target=chat_checkpoint, draft=tiny_draft_checkpoint, method="ar")
    chat = llm.encode(llm.tokenizer.render_chat([{"role": "user", "content": "def f(x):"}]))
    assert tuning.prompt_kind(llm.tokenizer, chat) == "chat"
    assert tuning.prompt_kind(llm.tokenizer, llm.encode("def f(x):")) == "text"
    # scripted: tree for chat, sd for text; the engine of a prompt runs its kind's method
    kinds = {"chat": tuning.Choice("tree", {"gamma": 2}), "text": tuning.Choice("sd", {"gamma": 3})}
    monkeypatch.setattr(tuning, "measure_choice", lambda *a, **k: tuning.Choice("sd", {"gamma": 3}, kinds=kinds))
    auto = LLM(target=chat_checkpoint, draft=tiny_draft_checkpoint)
    auto.tune()
    assert auto.method_for([chat]).name == "tree" and auto.method_for([chat]).options["gamma"] == 2
    assert auto.method_for([llm.encode("x = 1")]).name == "sd"
    assert auto.method_for([chat, llm.encode("x = 1")]) is auto.method           # mixed: the overall choice
    ar = LLM(target=chat_checkpoint, method="ar")
    params = SamplingParams(max_new_tokens=12)
    assert auto.generate(chat, params).tokens == ar.generate(chat, params).tokens
    # the cache keeps the kinds
    again = tuning.Choice.from_json({k: v for k, v in auto.choice.to_json().items() if k != "reason"})
    assert again.kinds["chat"].method == "tree" and again.kinds["text"].options == {"gamma": 3}


def test_calibration_on_both_kinds_chooses_for_each(chat_checkpoint, tiny_draft_checkpoint, tmp_path, monkeypatch,
                                                   unscreened):
    monkeypatch.setenv("SPECMESH_CACHE_DIR", str(tmp_path))
    plain = LLM(target=chat_checkpoint, method="ar")
    chat = plain.tokenizer.render_chat([{"role": "user", "content": "class A:"}])
    llm = LLM(target=chat_checkpoint, draft=tiny_draft_checkpoint)
    llm.tune([chat, "def f(x):\n"])
    assert set(llm.choice.kinds) == {"chat", "text"}
    for c in llm.choice.kinds.values():
        assert c.candidates and c.method in ("ar", "sd", "tree")
    assert "chat prompts: " in llm.choice.summary() and "text prompts: " in llm.choice.summary()


def test_the_drafts_own_sd_options_are_one_more_candidate(tiny_checkpoint, tiny_draft_checkpoint, tmp_path):
    import shutil
    from specmesh import catalog
    draft = tmp_path / "draft"
    shutil.copytree(tiny_draft_checkpoint, draft)
    llm = LLM(target=tiny_checkpoint, draft=draft, method="sd")
    plain = tuning.families(llm, draft)
    (draft / catalog.PAIR_OPTIONS).write_text(json.dumps({"methods": {"sd": {"gamma": 3, "lookup": 2}}}))
    assert tuning.families(llm, draft) == plain[:4] + [("sd", {"gamma": 3, "stop_below": 0.0, "lookup": 2})] + plain[4:]
    (draft / catalog.PAIR_OPTIONS).write_text(json.dumps({"methods": {"sd": {"gamma": 6, "lookup": 2}}}))
    assert tuning.families(llm, draft) == plain                 # already a candidate
    tree = {"lookup": 2, "min_prob": 0.1}                       # the full tree, and the draft's own
    (draft / catalog.PAIR_OPTIONS).write_text(json.dumps({"methods": {"tree": tree}}))
    assert tuning.families(llm, draft) == plain[:5] + [("tree", tree)] + plain[5:]
    trial = tuning.trial("tree", tree, [])
    assert trial.options == tree                                # the choice carries them (no pair options in auto)


@pytest.fixture
def unscreened(monkeypatch):
    """Every family runs every calibration prompt (no DROP): the tiny models' sub-millisecond steps are noise."""
    monkeypatch.setattr(tuning, "DROP", float("inf"))


def test_a_family_far_slower_than_the_fastest_is_dropped_early(tiny_checkpoint, tiny_draft_checkpoint, monkeypatch):
    """Calibration stops a run past DROP x the fastest run's time on the first prompt, and runs a family that was
    DROP x slower on the first prompts no more: it stays a candidate, marked dropped, never chosen."""
    monkeypatch.setattr(tuning, "DROP", 1e-9)              # every family but ar is too slow
    llm = LLM(target=tiny_checkpoint, draft=tiny_draft_checkpoint)
    choice = llm.tune(["def f(x):\n", "class A:\n"])
    assert choice.method == "ar"
    dropped = [c for c in choice.candidates if c.reason.endswith("dropped")]
    assert {c.method for c in dropped} == {"sd", "tree"} and all(c.ms_per_token > 0 for c in dropped)


def test_a_winner_extrapolated_to_another_gamma_is_measured_before_it_is_chosen(tiny_checkpoint, tiny_draft_checkpoint,
                                                                                 monkeypatch, unscreened):
    """An sd γ predicted from γ = 6's acceptance that would win is run itself; the choice rests on what it measured
    (predict drops the prediction for a γ measured)."""
    monkeypatch.setattr(tuning, "predict", favouring(2))   # as if γ = 2 were predicted fastest by far
    llm = LLM(target=tiny_checkpoint, draft=tiny_draft_checkpoint)
    llm.tune(["def f(x):\n"])
    gamma_2 = [c for c in llm.choice.candidates if c.method == "sd" and c.options["gamma"] == 2
               and not c.options["lookup"] and not c.options["stop_below"]]
    assert len(gamma_2) == 1 and gamma_2[0].reason.endswith("measured")
    assert llm.choice.won().reason.endswith("measured")


def test_an_extrapolation_crowned_by_a_measurement_is_measured_in_turn(tiny_checkpoint, tiny_draft_checkpoint,
                                                                       monkeypatch, unscreened):
    """γ = 2 and 3 predicted fastest by far: the first measured leaves the other the predicted winner, which is
    measured too (one round of measuring left it chosen unmeasured, or ar chosen beside a faster prediction)."""
    monkeypatch.setattr(tuning, "predict", favouring(2, 3))
    llm = LLM(target=tiny_checkpoint, draft=tiny_draft_checkpoint)
    llm.tune(["def f(x):\n"])
    plain = [c for c in llm.choice.candidates if c.method == "sd" and c.options["gamma"] in (2, 3)
             and not c.options["lookup"] and not c.options["stop_below"]]
    assert len(plain) == 2 and all(c.reason.endswith("measured") for c in plain)
    assert llm.choice.won().reason.endswith("measured")


@pytest.mark.parametrize("target_ms, expected", [(0.5, (5, 2)), (2.0, (4, 1)), (5.5, (2, 1)), (23.0, (2, 1))])
def test_calibration_covers_more_prompts_before_a_second_round(target_ms, expected, monkeypatch):
    """9 families, 5 calibration prompts, a 12 s budget: a fast pair runs every prompt twice; at 2 ms a forward
    four prompts once rather than two twice; SmolLM2 in bf16 (5.5 ms) or float32 (23 ms) the first two, once."""
    monkeypatch.delenv("SPECMESH_TUNE_BUDGET_S")                      # the default budget, not the suite's
    assert tuning.plan(Costs({1: target_ms}, {1: 0.1}), families=9, prompts=5) == expected


def test_the_pairs_own_options_win_unless_clearly_beaten():
    """options.json was measured on held-out prompt sets: a few calibration prompts must beat it by PAIR_MARGIN;
    predictions count only where `measured` is not asked."""
    own = {"gamma": 6, "stop_below": 0.3, "lookup": 2}
    near = [cand("sd", {"gamma": 3}, 4.3, "predicted"), cand("sd", {"gamma": 2}, 4.4), cand("sd", own, 4.6),
            cand("ar", {}, 6.0)]
    assert tuning.pick(near).options == {"gamma": 3}
    assert tuning.pick(near, measured=True).options == {"gamma": 2}
    assert tuning.pick(near, pair=own).options == own                       # within 10% of the fastest
    far = [cand("sd", {"gamma": 2}, 4.0), cand("sd", own, 4.6), cand("ar", {}, 6.0)]
    assert tuning.pick(far, pair=own).options == {"gamma": 2}


def test_a_kinds_own_choice_must_clearly_beat_the_overall_one():
    """A kind's winner on its few calibration prompts replaces the overall choice for that kind only where it is
    PAIR_MARGIN faster there; the kind's measurements stay."""
    sd = {"gamma": 6, "lookup": 2}
    overall = tuning.Choice("sd", sd, [cand("sd", sd, 4.3), cand("ar", {}, 6.0)])
    close = tuning.Choice("ar", {}, [cand("sd", sd, 7.69), cand("ar", {}, 7.75)])      # ar chosen: sd not 3% faster
    kept = tuning.for_kind(close, overall)
    assert (kept.method, kept.options, kept.won().ms_per_token) == ("sd", sd, 7.69) and kept.candidates == close.candidates
    clear = tuning.Choice("ar", {}, [cand("sd", sd, 9.0), cand("ar", {}, 7.75)])
    assert tuning.for_kind(clear, overall) is clear
    other = tuning.Choice("tree", {"gamma": 5}, [cand("tree", {"gamma": 5}, 3.0), cand("ar", {}, 6.0)])
    assert tuning.for_kind(other, overall) is other                  # the overall choice was not a candidate here


def test_the_reason_says_why_a_faster_runner_up_lost():
    """The summary names the runner-up with its options, and the rule that kept the choice where the runner-up
    measured faster (a predicted one is only said to be predicted)."""
    from specmesh.tuning import Candidate, Choice
    own, faster = {"gamma": 4, "lookup": 2}, {"gamma": 6, "stop_below": 0.3}
    kept = Choice("sd", own, [Candidate("sd", faster, 2.50, "measured"), Candidate("sd", own, 2.56, "measured")])
    assert kept.summary().endswith("next sd (gamma=6, stop_below=0.3) 2.50 ms/token (the draft's own options stay "
                                   "unless another is 10% faster)")
    ar = Choice("ar", {}, [Candidate("sd", faster, 3.95, "measured"), Candidate("ar", {}, 4.0, "measured")])
    assert ar.summary().endswith("(ar stays unless another is 3% faster)")
    guess = Choice("sd", own, [Candidate("tree", {}, 2.0, "predicted"), Candidate("sd", own, 2.56, "measured")])
    assert guess.summary().endswith("next tree 2.00 ms/token (predicted, not measured)")
    slower = Choice("sd", own, [Candidate("sd", own, 2.56, "measured"), Candidate("ar", {}, 4.0, "measured")])
    assert slower.summary().endswith("next ar 4.00 ms/token")
    dropped = Choice("ar", {}, [Candidate("ar", {}, 4.0, "measured"),
                                Candidate("sd", faster, 3.5, "over 1.3x the fastest ..., dropped")])
    assert dropped.summary().endswith("next sd (gamma=6, stop_below=0.3) 3.50 ms/token (dropped early as too slow)")
    hidden = Choice("sd", own, [Candidate("tree", {}, 2.0, "predicted"), Candidate("sd", faster, 2.50, "measured"),
                                Candidate("sd", own, 2.56, "measured")])     # a measured faster one behind a guess
    assert hidden.summary().endswith("next sd (gamma=6, stop_below=0.3) 2.50 ms/token (the draft's own options "
                                     "stay unless another is 10% faster)")
