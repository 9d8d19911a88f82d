"""`pearl`: two processes, lossless, mode switching as in the paper, failures that end cleanly."""
import signal
import subprocess
import sys
import time
from collections import Counter

import pytest
import torch
from scipy.stats import chi2_contingency

from conftest import fail_rank_mid_stream

from specmesh import LLM, SamplingParams
from specmesh.lossless.sampling import SamplingParams as Params
from specmesh.lossless.verify import Verdict, verify
from specmesh.methods import pearl
from specmesh.methods.pearl import Rounds
from specmesh.model.loader import load_model
from specmesh.proposers.remote_chain import ChainDrafter, one_hot

PROMPTS = ["def add(a, b):", "class Point:\n    def", "for i in range(10):\n", "x", "self.y = y\n\n" * 3]


# -- mode switching on the paper's Appendix B walk-through (Table 9), scripted ------------------

# the target's greedy continuation of the prompt, and per step the draft's new tokens (Table 9's
# "draft model output" column, in words)
TARGET = "I 'm happy to help you with your question ! However I notice that the equations you provided".split()
DRAFTS = [["Great", "I", "'m"], ["'m", "glad", "you"], ["are", "interested", "in"],
          ["to", "help", "you", "with", "this"], ["equation", "!", "However", "I"], ["question", "!", "However", "I"],
          ["notice", "that", "the", "equation", "you"], ["provided", "is", "not", "correct"]]
WORDS = sorted(set(TARGET) | {w for d in DRAFTS for w in d} | {"<prompt>"})
MODES = ["pre-verify", "pre-verify", "post-verify", "pre-verify", "post-verify", "pre-verify", "post-verify",
         "post-verify"]
OUTPUTS = ["I", "I 'm", "I 'm happy", "I 'm happy to", "I 'm happy to help you with your",
           "I 'm happy to help you with your question", "I 'm happy to help you with your question ! However I notice",
           "I 'm happy to help you with your question ! However I notice that the equations"]


def test_mode_switching_follows_the_papers_walk_through():
    ids = WORDS.index
    rounds, committed, modes, outputs = Rounds(ids("<prompt>")), [], [], []
    for drafts in DRAFTS:
        modes.append(rounds.mode)
        inputs = rounds.inputs()
        logits = torch.zeros(len(inputs), len(WORDS))          # greedy target: one-hot of its next word
        for i in range(len(inputs)):
            logits[i, ids(TARGET[len(committed) + i])] = 1.0
        drafted = [ids(w) for w in drafts]
        verdict = verify(rounds.chain(drafted, None), logits, Params())
        rounds.settle(verdict, drafted, None)
        committed += [WORDS[t] for t in verdict.tokens]
        outputs.append(" ".join(committed))
    assert modes == MODES
    assert outputs == OUTPUTS
    assert rounds.mode == "pre-verify"                          # "equation" was rejected at step 7


def test_post_verify_full_acceptance_needs_no_bonus_token():
    rounds = Rounds(5)
    rounds.undecided = [6, 7]
    logits = torch.zeros(3, 10)
    logits[0, 6] = logits[1, 7] = logits[2, 8] = 1.0
    verdict = verify(rounds.chain([8, 9, 1], None), logits, Params())
    assert verdict.next_token is None and verdict.tokens == [6, 7, 8]
    assert rounds.settle(verdict, [8, 9, 1], None) == (3, -1, 3)     # fresh + both undecided are committed
    assert rounds.inputs() == [8, 9, 1] and rounds.mode == "post-verify"


# -- γ from measured costs, scripted -----------------------------------------------------------

def simulate(gamma: int, alpha: float, draft_ms: float, target_ms, lent_ms=None, overhead_ms: float = 0.0,
             rounds: int = 20000) -> float:
    """Tokens per ms of the real `Rounds` bookkeeping, each check passing with probability α."""
    rng, state, tokens, ms = torch.Generator().manual_seed(0), Rounds(0), 0, 0.0
    for _ in range(rounds):
        width = len(state.inputs())
        ms += overhead_ms + pearl.round_ms(gamma * draft_ms, target_ms(width), lent_ms(width) if lent_ms else None)
        drafts = list(range(1, gamma + 1))
        checks = len(state.undecided) + 1
        k = 0
        while k < checks and torch.rand((), generator=rng) < alpha:
            k += 1
        chain = state.undecided + drafts[:1]
        verdict = Verdict(list(range(k + 1)), chain[:k] + ([] if k == checks else [99]), None if k == checks else 99)
        state.settle(verdict, drafts, None)
        tokens += len(verdict.tokens)
    return tokens / ms


@pytest.mark.parametrize("gamma, alpha, cost", [(1, 0.7, "flat"), (4, 0.8, "flat"), (6, 0.5, "linear"),
                                                (9, 0.9, "steep")])
def test_expected_tokens_per_ms_matches_the_rounds(gamma, alpha, cost):
    target_ms = {"flat": lambda w: 2.0, "linear": lambda w: 2.0 + 0.3 * w, "steep": lambda w: 1.0 * w}[cost]
    predicted = pearl.tokens_per_ms(gamma, alpha, 0.4, target_ms)
    assert simulate(gamma, alpha, 0.4, target_ms) == pytest.approx(predicted, rel=0.03)


def test_round_length_with_and_without_the_draft_ranks_core():
    assert pearl.round_ms(1.0, 3.0) == 3.0                  # no lending: the slower rank
    assert pearl.round_ms(4.0, 3.0, 1.5) == 4.0             # the draft is slower: nothing to lend
    assert pearl.round_ms(1.0, 3.0, 1.5) == 2.0             # 1 ms alone, then the other 2 ms of work at twice the speed
    assert pearl.round_ms(0.0, 3.0, 1.5) == 1.5


@pytest.mark.parametrize("gamma, alpha, overhead", [(3, 0.7, 0.0), (6, 0.85, 0.4)])
def test_expected_tokens_per_ms_with_the_draft_ranks_core_lent(gamma, alpha, overhead):
    target_ms, lent_ms = (lambda w: 2.0 + 0.3 * w), (lambda w: 1.1 + 0.2 * w)
    predicted = pearl.tokens_per_ms(gamma, alpha, 0.3, target_ms, lent_ms, overhead)
    assert simulate(gamma, alpha, 0.3, target_ms, lent_ms, overhead) == pytest.approx(predicted, rel=0.03)


def test_gamma_policy_prices_drafting_once_the_draft_lends_its_core_and_the_rounds_overhead():
    alone, lent = {1: 2.6, 4: 2.7, 8: 3.8, 16: 6.0}, {1: 1.7, 4: 1.9, 8: 2.5, 16: 3.8}
    counts = {"accepted": 800, "rejected": 200}
    hidden = pearl.GammaPolicy(0.3, alone, **counts).gamma()           # drafting hidden behind the forward: free
    priced = pearl.GammaPolicy(0.3, alone, lent, **counts).gamma()     # each draft step delays the borrowed core
    assert priced < hidden
    slow_rounds = pearl.GammaPolicy(0.3, alone, lent, **counts)
    for _ in range(20):
        slow_rounds.observe(0, False, overhead_ms=2.0)                  # every round costs 2 ms beside its forward
    assert slow_rounds.overhead_ms == pytest.approx(2.0) and slow_rounds.gamma() > priced


def test_gamma_policy_follows_the_draft_ranks_measured_drafting():
    """The start-up forward is a prior: rounds whose chains prompt lookup filled cost the draft rank next to
    nothing, and the policy drafts longer; a draft rank slower than measured makes it draft shorter."""
    alone, lent = {1: 2.6, 4: 2.7, 8: 3.8, 16: 6.0}, {1: 1.7, 4: 1.9, 8: 2.5, 16: 3.8}
    first = pearl.GammaPolicy(0.4, alone, lent, accepted=800, rejected=200).gamma()
    cheap, dear = (pearl.GammaPolicy(0.4, alone, lent, accepted=800, rejected=200) for _ in range(2))
    for _ in range(50):
        cheap.observe(0, False, drafted=5, drafting_ms=0.05)
        dear.observe(0, False, drafted=5, drafting_ms=5.0)
    assert cheap.step_ms < 0.05 and cheap.gamma() > first
    assert dear.step_ms > 0.9 and dear.gamma() < first


@pytest.mark.parametrize("draft_ms, target_ms, accepted, rejected, expected", [
    (0.05, {1: 2.0, 16: 2.0}, 90, 10, range(12, 17)),     # free draft, free width, good acceptance: long chains
    (0.05, {1: 2.0, 16: 5.0}, 1, 99, range(1, 3)),        # nothing is accepted: width is wasted
    (0.05, {1: 1.0, 16: 16.0}, 80, 20, range(1, 2)),      # every verified token costs a forward's worth
    (0.5, {1: 2.0, 16: 2.0}, 95, 5, range(3, 7)),         # the draft's time bounds the round: about c = 4
])
def test_gamma_policy_on_scripted_costs(draft_ms, target_ms, accepted, rejected, expected):
    policy = pearl.GammaPolicy(draft_ms, target_ms, accepted=accepted, rejected=rejected)
    assert policy.gamma() in expected


def test_gamma_policy_follows_the_running_acceptance():
    policy = pearl.GammaPolicy(0.3, {1: 2.0, 4: 2.2, 16: 4.0})
    first = policy.gamma()
    for _ in range(50):
        policy.observe(6, False)
    assert policy.alpha > 0.95 and policy.gamma() > first
    for _ in range(1500):
        policy.observe(0, True)
    assert policy.alpha < 0.3 and policy.gamma() < first


def test_width_interpolation():
    ms = pearl.by_width({1: 2.0, 4: 5.0, 8: 6.0})
    assert [ms(1), ms(2), ms(4), ms(6), ms(8), ms(16)] == [2.0, 3.0, 5.0, 5.5, 6.0, 6.0]


# -- the draft rank's chains with prompt lookup ---------------------------------------------------

def test_looked_up_tokens_lead_the_chain_and_the_draft_drafts_the_rest(tiny_checkpoint):
    """Prompt 5 6 7 8 9 10 5, then 6 is decided: "5 6" occurred before, followed by 7 8 9."""
    model = load_model(tiny_checkpoint, torch.float32, torch.device("cpu"), draft=True)
    vocab = model.config.vocab_size
    for params in (Params(), Params(temperature=1.0)):
        drafter = ChainDrafter(model, [5, 6, 7, 8, 9, 10, 5], 64, 32, params, seed=0, lookup=2)
        drafter.decide(0, 6)
        drafts, q = drafter.draft_chain(5)
        assert drafts[:3] == [7, 8, 9] and len(drafts) == 5 and drafter.chain.tokens == [6] + drafts
        if params.greedy:
            assert q is None
        else:                               # one-hot rows for the looked-up tokens, the draft's distribution after
            assert q.shape == (5, vocab) and torch.equal(q[:3].argmax(1), torch.tensor([7, 8, 9]))
            assert torch.equal(q[:3].sum(1), torch.ones(3)) and q[:3].count_nonzero() == 3
            assert torch.allclose(q[3:].sum(1), torch.ones(2))
        drafter.decide(0, 5)                # the first draft rejected, 5 instead: "6 5" occurred nowhere before
        read = drafter.read
        assert drafter.looked_up(2) == []
        assert len(drafter.draft_chain(2)[0]) == 2 and drafter.read > read      # the draft model drafted both


def test_a_looked_up_token_with_its_one_hot_row_keeps_the_targets_distribution():
    """A looked-up draft x is not drawn from any q: with its one-hot q row the standard rule accepts it with
    probability p(x) and otherwise draws from p without x, so the first token is an exact draw from p. (Any other
    row, such as half its mass on x, would emit x too often.)"""
    from scipy.stats import chisquare
    logits = torch.tensor([[0.5, 1.5, 1.0, -0.5, 0.0], [0.0] * 5])       # the root's row decides the first token
    p = logits[0].softmax(-1)
    rng, counts = torch.Generator().manual_seed(0), torch.zeros(5)
    for _ in range(6000):
        tree = Rounds(4).chain([1], one_hot(1, 5)[None])                 # x = 1, p(x) = 0.43
        counts[verify(tree, logits, Params(temperature=1.0), rng).tokens[0]] += 1
    assert chisquare(counts.numpy(), (6000 * p).numpy()).pvalue > 0.001


# -- the real thing: two processes ----------------------------------------------------------------

@pytest.fixture(scope="module")
def ar(tiny_checkpoint):
    return LLM(target=tiny_checkpoint)


@pytest.fixture(scope="module", params=["random-draft", "perfect-draft", "measured-gamma", "lookup"])
def pair(request, tiny_checkpoint, tiny_draft_checkpoint):
    draft = {"random-draft": tiny_draft_checkpoint, "perfect-draft": tiny_checkpoint,
             "measured-gamma": tiny_checkpoint, "lookup": tiny_draft_checkpoint}[request.param]
    gamma = 4 if request.param != "measured-gamma" else None      # measured-gamma: GammaPolicy's, each round
    lookup = 2 if request.param == "lookup" else 0                # prompt lookup leads the draft's chains
    with LLM(target=tiny_checkpoint, draft=draft, method="pearl", gamma=gamma, lookup=lookup, timeout=20) as llm:
        yield request.param, llm


@pytest.mark.parametrize("max_new", [1, 3, 4, 5, 17, 40])
def test_greedy_equals_ar(ar, pair, max_new):
    kind, llm = pair
    for prompt in PROMPTS:
        params = SamplingParams(max_new_tokens=max_new)
        out = llm.generate(prompt, params)             # the ranks' committed tokens are checked inside
        assert out.tokens == ar.generate(prompt, params).tokens, (kind, prompt)
    if kind == "perfect-draft" and max_new == 40:
        assert out.stats.acceptance_rate == 1.0 and out.stats.phases == 1     # never leaves post-verify


def test_greedy_with_penalties_equals_ar(ar, pair):
    kind, llm = pair
    params = SamplingParams(max_new_tokens=24, frequency_penalty=0.7, presence_penalty=0.3, repetition_penalty=1.3,
                            logit_bias={9: 3.0})
    outs = [llm.generate(prompt, params).tokens for prompt in PROMPTS]
    assert outs == [ar.generate(prompt, params).tokens for prompt in PROMPTS], kind
    assert outs != [ar.generate(prompt, SamplingParams(max_new_tokens=24)).tokens for prompt in PROMPTS]


def test_start_up_measures_c_and_the_target_by_width(pair):
    kind, llm = pair
    peer = llm.models.remote
    assert peer.c > 0 and peer.gamma == max(1, min(pearl.MAX_GAMMA, round(peer.c)))
    assert sorted(peer.target_ms_by_width) == [1, 2, 4, 8, 12, 16] and min(peer.target_ms_by_width.values()) > 0
    assert sorted(peer.lent_ms_by_width) == [1, 2, 4, 8, 12, 16]     # with the draft rank's core lent (docs/methods.md)
    info = llm.generate("def", SamplingParams(max_new_tokens=8)).stats.info
    if kind == "measured-gamma":
        assert info["gamma_rule"] == "measured" and 1 <= info["gamma"] <= pearl.MAX_GAMMA
    else:
        assert info["gamma_rule"] == "given" and info["gamma"] == 4


def test_the_target_by_width_is_measured_once_per_model_and_machine(tiny_checkpoint, capfd):
    """A start of pearl measures the target by width (about a second) where this machine has not for this model
    file; a later one reads them from the cache, under the machine, the model file and the lending."""
    from specmesh.proposers import remote_chain
    for _ in range(2):
        with LLM(target=tiny_checkpoint, draft=tiny_checkpoint, method="pearl", gamma=3) as llm:
            peer = llm.models.remote
            key = remote_chain.widths_key(llm.models.target, tiny_checkpoint, peer.link)
            assert remote_chain.cached_widths(key) == (peer.target_ms_by_width, peer.lent_ms_by_width)
    starts = [line for line in capfd.readouterr().err.splitlines() if line.startswith("pearl: target forward")]
    assert "target forward by width (cached): " in starts[-1]


def test_lending_can_be_turned_off_to_compare(tiny_checkpoint, ar, monkeypatch):
    monkeypatch.setenv("SPECMESH_KERNELS", "no-lend")
    with LLM(target=tiny_checkpoint, draft=tiny_checkpoint, method="pearl", gamma=3, lookup=2) as llm:
        peer = llm.models.remote
        assert peer.link.boxes is None and peer.lent_ms_by_width is None      # no core lent, none measured
        out = llm.generate(PROMPTS[-1], SamplingParams(max_new_tokens=20))
    assert out.tokens == ar.generate(PROMPTS[-1], SamplingParams(max_new_tokens=20)).tokens


def test_the_papers_rule_keeps_round_c(tiny_checkpoint, ar):
    with LLM(target=tiny_checkpoint, draft=tiny_checkpoint, method="pearl", gamma_rule="c") as llm:
        out = llm.generate(PROMPTS[0], SamplingParams(max_new_tokens=20))
        assert out.stats.info == {"c": llm.models.remote.c, "gamma_rule": "c", "gamma": llm.models.remote.gamma}
    assert out.tokens == ar.generate(PROMPTS[0], SamplingParams(max_new_tokens=20)).tokens


def test_an_unknown_gamma_rule_is_refused(tiny_checkpoint):
    with pytest.raises(ValueError, match="gamma_rule must be one of measured, c, got 'fast'"):
        LLM(target=tiny_checkpoint, draft=tiny_checkpoint, method="pearl", gamma_rule="fast")


def test_ranks_that_disagree_are_caught(tiny_checkpoint, monkeypatch):
    with LLM(target=tiny_checkpoint, draft=tiny_checkpoint, method="pearl", gamma=3) as llm:
        monkeypatch.setattr(pearl.Rounds, "settle", broken_settle)
        with pytest.raises(pearl.RanksDivergedError):
            llm.generate(PROMPTS[0], SamplingParams(max_new_tokens=20))


real_settle = pearl.Rounds.settle


def broken_settle(self, verdict, drafts, q):
    """Tell the draft one token fewer was accepted than really was (a protocol bug)."""
    accepted, token, commit = real_settle(self, verdict, drafts, q)
    return max(accepted - 1, 0), token, commit


@pytest.mark.parametrize("prompt, lookup", [("def", 0), ("x = y\nx = y\nx", 2)])
def test_sampling_matches_ar_two_sample(tiny_checkpoint, tiny_draft_checkpoint, prompt, lookup):
    """Joint distribution of the first 3 tokens: pearl vs ar, chi-square two-sample test (with lookup: a prompt
    that repeats itself, so looked-up tokens, one-hot q rows, lead the chains)."""
    params = dict(max_new_tokens=3, temperature=1.0, n=400)
    ar_llm = LLM(target=tiny_checkpoint)
    ar_out = ar_llm.generate(prompt, SamplingParams(seed=1, **params))
    with LLM(target=tiny_checkpoint, draft=tiny_checkpoint, method="pearl", gamma=2, lookup=lookup) as llm:
        pl_out = llm.generate(prompt, SamplingParams(seed=2, **params))
    a = Counter(tuple(s.tokens) for s in ar_out.samples)
    b = Counter(tuple(s.tokens) for s in pl_out.samples)
    keys = [k for k in set(a) | set(b) if a[k] + b[k] >= 10]
    other = (sum(a.values()) - sum(a[k] for k in keys), sum(b.values()) - sum(b[k] for k in keys))
    table = [[a[k] for k in keys] + [other[0]], [b[k] for k in keys] + [other[1]]]
    assert chi2_contingency(table)[1] > 0.001


def test_seeded_sampling_is_reproducible(tiny_checkpoint, tiny_draft_checkpoint):
    with LLM(target=tiny_checkpoint, draft=tiny_draft_checkpoint, method="pearl", gamma=3) as llm:
        runs = [llm.generate("def", SamplingParams(max_new_tokens=30, temperature=1.0, seed=s)).tokens
                for s in (5, 5, 6)]
    assert runs[0] == runs[1] != runs[2]


def test_a_seeded_request_drafts_a_gamma_no_timing_sways(tiny_checkpoint, tiny_draft_checkpoint):
    """Both γ rules time the machine, and how far the draft runs decides which random numbers each sampled token
    takes: a seeded request drafts SEEDED_GAMMA (without --gamma), so its samples are the same in every run."""
    from specmesh.methods.pearl import SEEDED_GAMMA
    params = SamplingParams(max_new_tokens=30, temperature=1.0, seed=5)
    runs = []
    for _ in range(2):
        with LLM(target=tiny_checkpoint, draft=tiny_draft_checkpoint, method="pearl") as llm:
            runs.append(llm.generate("def", params))
    assert runs[0].tokens == runs[1].tokens
    assert all(r.stats.info["gamma_rule"] == "seeded" and r.stats.info["gamma"] == SEEDED_GAMMA for r in runs)


# -- failures -----------------------------------------------------------------------------------

@pytest.mark.parametrize("sig, message", [(signal.SIGKILL, "was killed by signal 9"),
                                          (signal.SIGSTOP, "did not answer within 3 s")])
def test_a_dead_or_hung_draft_rank_fails_within_the_timeout(tiny_checkpoint, sig, message):
    llm = LLM(target=tiny_checkpoint, draft=tiny_checkpoint, method="pearl", gamma=2, timeout=3)
    pid = fail_rank_mid_stream(llm, 1, message, max_new_tokens=200, within_s=3 + 2, sig=sig)
    llm.close()                               # kills what is left of the draft rank
    assert not alive(pid)


def test_cli_launcher_prints_ranks_and_leaves_no_orphans(tiny_checkpoint):
    proc = subprocess.Popen([sys.executable, "-m", "specmesh.cli", "generate", "--method", "pearl", "--target",
                             str(tiny_checkpoint), "--draft", str(tiny_checkpoint), "--max-new-tokens", "200",
                             "def"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    lines = [proc.stderr.readline() for _ in range(2)]
    assert lines[0] == f"rank 0 role target pid {proc.pid}\n"
    assert lines[1].startswith("rank 1 role draft pid ")
    worker = int(lines[1].split()[-1])
    proc.kill()                               # rank 0 dies: the draft rank must not outlive it
    proc.wait()
    deadline = time.monotonic() + 10
    while alive(worker):
        if time.monotonic() > deadline:
            pytest.fail(f"the draft rank (pid {worker}) outlived rank 0")
        time.sleep(0.05)


def alive(pid: int) -> bool:
    """Running, and not a zombie waiting for its new parent (init) to reap it."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except FileNotFoundError:
        return False
