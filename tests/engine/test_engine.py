"""The one engine: a batch of prompts gives each prompt's solo output; n samples share one prefill."""
import pytest

from specmesh import LLM, SamplingParams
from specmesh.lossless.sampling import InvalidParameter
from specmesh.methods import METHODS

PROMPTS = ["def add(a, b):", "class Point:\n    def", "for i in range(10):\n", "x", "self.y = y\n\n" * 3,
           "import os\n", "print(", "return self", "while True:"]
BATCHED = ["ar", "sd", "tree", "selfdraft"]


def llm_for(method, checkpoint, draft, dtype):
    options = {"gamma": 3} if method in ("sd", "tree") else {}
    return LLM(target=checkpoint, draft=draft if method in ("sd", "tree") else None, method=method, dtype=dtype,
               **options)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("method", BATCHED)
def test_a_batch_of_prompts_gives_each_its_solo_output(tiny_checkpoint, tiny_draft_checkpoint, method, dtype):
    llm = llm_for(method, tiny_checkpoint, tiny_draft_checkpoint, dtype)
    params = SamplingParams(max_new_tokens=20)
    alone = [llm.generate(p, params).tokens for p in PROMPTS]
    together = llm.generate(PROMPTS, params)
    assert [o.tokens for o in together] == alone
    ar = LLM(target=tiny_checkpoint, dtype=dtype)
    assert alone == [ar.generate(p, params).tokens for p in PROMPTS]      # and ar's, in this dtype


def test_outputs_keep_the_order_of_the_prompts_and_each_its_own_params(tiny_checkpoint):
    llm = LLM(target=tiny_checkpoint)
    outs = llm.generate(PROMPTS[:3], SamplingParams(max_new_tokens=5, n=2))
    assert len(outs) == 3 and all(len(o.samples) == 2 for o in outs)
    assert [o.prompt_tokens for o in outs] == [len(llm.encode(p)) for p in PROMPTS[:3]]
    ids = llm.encode(PROMPTS[0])
    assert llm.generate(ids, SamplingParams(max_new_tokens=5)).tokens == outs[0].tokens     # token ids: one prompt
    assert llm.generate([ids, ids], SamplingParams(max_new_tokens=5))[1].tokens == outs[0].tokens


def spy_forwards(model) -> list[int]:
    """The number of new tokens of every forward of `model` from now on."""
    widths = []
    real = model.forward
    model.forward = lambda x, *a, **kw: (widths.append(x.shape[1]), real(x, *a, **kw))[1]
    return widths


@pytest.mark.parametrize("method", BATCHED)
def test_n_samples_prefill_the_prompt_once(tiny_checkpoint, tiny_draft_checkpoint, method):
    llm = llm_for(method, tiny_checkpoint, tiny_draft_checkpoint, "float32")
    prompt = "class Point:\n    def __init__(self, x, y):\n        self.x = x\n"
    length = len(llm.encode(prompt))
    widths = spy_forwards(llm.models.target)
    out = llm.generate(prompt, SamplingParams(max_new_tokens=6, temperature=1.0, seed=0, n=64))
    assert len(out.samples) == 64 and all(1 <= len(s.tokens) <= 6 for s in out.samples)
    assert widths.count(length) == 1 and max(widths) <= max(length, 16)
    assert len({tuple(s.tokens) for s in out.samples}) > 8             # independent samples


@pytest.mark.parametrize("method", BATCHED)
def test_sample_j_of_a_seeded_request_is_the_seed_plus_j_alone(tiny_checkpoint, tiny_draft_checkpoint, method):
    llm = llm_for(method, tiny_checkpoint, tiny_draft_checkpoint, "float32")
    many = llm.generate("def", SamplingParams(max_new_tokens=8, temperature=1.0, seed=10, n=3))
    alone = [llm.generate("def", SamplingParams(max_new_tokens=8, temperature=1.0, seed=10 + j)).tokens
             for j in range(3)]
    assert [s.tokens for s in many.samples] == alone


def test_a_seeded_sd_sample_is_the_same_in_a_wide_batch(tiny_checkpoint, tiny_draft_checkpoint):
    """sd drafts less as the batch widens (none from 5 rows), and its chain samples from the draft: a seeded
    request drafts as it would alone, so its samples do not depend on the batch."""
    llm = LLM(target=tiny_checkpoint, draft=tiny_draft_checkpoint, method="sd")
    params = lambda seed, n=1: SamplingParams(max_new_tokens=12, temperature=1.0, seed=seed, n=n)  # noqa: E731
    many = llm.generate("def", params(10, 6))
    assert [s.tokens for s in many.samples] == [llm.generate("def", params(10 + j)).tokens for j in range(6)]
    together = llm.generate(PROMPTS[:6], params(3))
    assert [o.tokens for o in together] == [llm.generate(p, params(3)).tokens for p in PROMPTS[:6]]


def test_a_batch_wider_than_max_batch_runs_in_waves(tiny_checkpoint):
    llm = LLM(target=tiny_checkpoint, max_batch=3)
    params = SamplingParams(max_new_tokens=12)
    assert [o.tokens for o in llm.generate(PROMPTS, params)] == [llm.generate(p, params).tokens for p in PROMPTS]
    with pytest.raises(ValueError, match="max_batch"):
        LLM(target=tiny_checkpoint, max_batch=0)


def test_a_stream_of_many_waves_counts_its_samples(tiny_checkpoint, capsys):
    llm = LLM(target=tiny_checkpoint, max_batch=2)
    run = llm.stream("def", SamplingParams(max_new_tokens=3, n=5, temperature=1.0, seed=0), progress=True)
    assert "".join(run) == run.output.samples[0].text and len(run.output.samples) == 5
    err = capsys.readouterr().err
    assert "samples: 100%" in err and "5/5" in err


def test_stream_of_a_stopped_consumer_ends_its_sequences(tiny_checkpoint):
    llm = LLM(target=tiny_checkpoint)
    stream = llm.stream("def add(a, b):", SamplingParams(max_new_tokens=50))
    pieces = iter(stream)
    next(pieces)
    pieces.close()                      # the consumer stops reading: its sequence leaves the engine at once
    assert stream.engine.idle and stream.engine is llm.engine_for(llm.method)


def test_one_engine_serves_every_request_of_an_llm(tiny_checkpoint):
    """Built on the first request and sized once (engine/sizing.py), as the server's: later generate, stream and
    chat calls reuse it; a stream left open shares it with a generate call, and each gets its own tokens."""
    llm = LLM(target=tiny_checkpoint, max_batch=4)
    params = SamplingParams(max_new_tokens=8)
    first = llm.generate("def f(x):", params)
    engine = llm.engine_for(llm.method)
    assert llm.generate(["class A:", "import os"], params)[0].tokens and llm.engine_for(llm.method) is engine
    assert len(llm.engines) == 1 and engine.scheduler.rows == 4 and engine.context == llm.context
    stream = iter(llm.stream("def f(x):", params))
    head = next(stream)
    assert llm.generate("def f(x):", params).tokens == first.tokens        # beside the open stream
    assert head + "".join(stream) == first.text and len(llm.engines) == 1 and engine.idle


def test_the_engine_counts_what_it_runs(tiny_checkpoint):
    llm = LLM(target=tiny_checkpoint, max_batch=5)
    engine = llm.engine_for(llm.method)
    engine.complete([engine.sequences([1, 2, 3], SamplingParams(max_new_tokens=4, n=5))])
    s = engine.stats
    assert s.prefills == 1 and s.generated_tokens == 20 and s.target_forwards == 1 + 3 and s.steps == 3


def test_admission_shares_the_rows_fairly_between_requests():
    """A request for many samples or prompts is admitted in pieces: a free row goes to the request with the
    fewest running sequences, so a later request is not stuck behind all of an earlier one's; and with
    `per_request` no request takes every row."""
    from types import SimpleNamespace

    from specmesh.engine.scheduler import Scheduler
    seq = lambda name: SimpleNamespace(aborted=False, done=False, name=name)  # noqa: E731
    scheduler = Scheduler(rows=2)
    scheduler.add([seq(f"big{i}") for i in range(5)])          # n = 5, or five prompts: one request
    scheduler.add([seq("small")])

    def next_admission(scheduler=scheduler):
        """The engine's admission without a prefill: the sequence the next free row goes to takes it."""
        waiting = scheduler.next_waiting()
        if waiting is not None:
            scheduler.admit(waiting)
        return waiting

    admitted = [next_admission().name for _ in range(2)]
    assert admitted == ["big0", "small"] and next_admission() is None                # one row each
    scheduler.running[0].done = True
    scheduler.retire(lambda src, dst: None)
    assert next_admission().name == "big1" and scheduler.waiting == 3
    scheduler.queues[1][0].aborted = True                                             # its client left
    scheduler.running[0].done = True
    scheduler.retire(lambda src, dst: None)
    assert next_admission().name == "big3"
    assert [s.name for s in scheduler.retire(lambda src, dst: None)] == ["big2"]      # reported once (metrics)
    assert scheduler.retire(lambda src, dst: None) == []

    capped = Scheduler(rows=4, per_request=3)
    capped.add([seq(f"big{i}") for i in range(8)])
    assert [next_admission(capped).name for _ in range(3)] == ["big0", "big1", "big2"]
    assert next_admission(capped) is None                       # a row stays free while only the big one waits
    capped.add([seq("late")])
    assert next_admission(capped).name == "late"


@pytest.mark.parametrize("method", BATCHED)
def test_logprobs_are_the_targets_whatever_the_method(tiny_checkpoint, tiny_draft_checkpoint, method):
    """Greedy float32: each emitted token's log-probability and top alternatives come from the target's own
    logits, bit for bit those `ar` reports, alone or in a batch."""
    params = SamplingParams(max_new_tokens=16, logprobs=3)
    ar = LLM(target=tiny_checkpoint).generate(PROMPTS[:4], params)
    spec = llm_for(method, tiny_checkpoint, tiny_draft_checkpoint, "float32").generate(PROMPTS[:4], params)
    assert [o.samples[0].logprobs for o in spec] == [o.samples[0].logprobs for o in ar]
    assert all(len(o.samples[0].logprobs) == len(o.tokens) for o in spec)
    assert all(top[0] == (t, lp) for o in spec for t, (lp, top) in zip(o.tokens, o.samples[0].logprobs))


def test_penalties_are_refused_by_a_method_that_does_not_apply_them(tiny_checkpoint):
    llm = LLM(target=tiny_checkpoint)
    params = SamplingParams(max_new_tokens=4, repetition_penalty=1.2)
    engine = llm.engine_for(llm.method)
    engine.check_params = METHODS["pp"].check_params                   # as pp, stpp and pipedec declare
    with pytest.raises(InvalidParameter, match="repetition_penalty: pp does not apply") as e:
        engine.sequences([1, 2], params)
    assert e.value.param == "repetition_penalty"


def test_a_logit_bias_past_the_vocabulary_is_refused(tiny_checkpoint):
    llm = LLM(target=tiny_checkpoint)
    params = SamplingParams(max_new_tokens=4, logit_bias={10 ** 6: 1.0})
    with pytest.raises(InvalidParameter, match="past the vocabulary") as e:
        llm.generate("def", params)
    assert e.value.param == "logit_bias"
