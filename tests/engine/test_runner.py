"""Chunked prefill: a long prompt is computed a chunk per engine step between the running rows' steps,
gives the output of a whole prefill, and stops costing anything once its client leaves."""
import pytest
import torch

from specmesh import LLM, SamplingParams
from specmesh import methods

LONG = "def add(a, b):\n    return a + b\n\n" * 12          # well over the chunk below
CHUNK = 16


@pytest.fixture(scope="module")
def llm(tiny_checkpoint):
    return LLM(target=tiny_checkpoint, draft=tiny_checkpoint, method="sd", gamma=3)


def engine(llm, chunk=CHUNK, rows=4):
    return methods.engine(llm.models, llm.method, llm.tokenizer, rows, 512, prefill_chunk=chunk)


def run(engine, seqs):
    engine.submit(seqs)
    with torch.inference_mode():
        while not engine.idle:
            engine.step()


def test_a_chunked_prefill_gives_the_whole_prefills_output(llm):
    ids = llm.encode(LONG)
    assert len(ids) > 4 * CHUNK
    params = SamplingParams(max_new_tokens=20, n=2)
    whole, chunked = engine(llm, chunk=10_000), engine(llm)
    a, b = whole.sequences(ids, params), chunked.sequences(ids, params)
    run(whole, a)
    run(chunked, b)
    assert [s.tokens for s in b] == [s.tokens for s in a]
    assert chunked.stats.prefills == 1 and chunked.stats.target_forwards > whole.stats.target_forwards
    # a sequence counts its prefill as one forward, however many chunks computed it (tokens per forward stays τ)
    assert [s.stats.target_forwards for s in b] == [s.stats.target_forwards for s in a]


def test_running_rows_step_while_a_long_prompt_is_computed(llm):
    e = engine(llm)
    short = e.sequences(llm.encode("x"), SamplingParams(max_new_tokens=400, ignore_eos=True))[0]
    e.submit([short])
    with torch.inference_mode():
        e.step()
        long = e.sequences(llm.encode(LONG), SamplingParams(max_new_tokens=4))[0]
        e.submit([long])
        chunks = -(-len(long.ids) // CHUNK)
        grown = []
        for _ in range(chunks - 1):
            before = len(short.tokens)
            e.step()
            grown.append(len(short.tokens) > before)
        assert not long.tokens and e.scheduler.running == [short] and all(grown)
        e.step()                                    # the last chunk: the long prompt takes its row
        assert long.tokens and e.scheduler.running == [short, long]


def test_a_client_that_leaves_mid_prefill_stops_it(llm):
    e = engine(llm)
    long = e.sequences(llm.encode(LONG), SamplingParams(max_new_tokens=4, n=3))
    e.submit(long)
    with torch.inference_mode():
        e.step()
        e.step()
        assert e.runner.staged is long[0].prompt and e.stats.target_forwards == 2
        for seq in long:
            e.abort(seq)
        e.step()
    assert e.idle and e.runner.staged is None and e.stats.target_forwards == 2
    assert e.stats.running == 0 and e.stats.waiting == 0 and not any(s.tokens for s in long)


@pytest.mark.parametrize("chunk", [10_000, CHUNK])
def test_a_prefill_returns_the_logits_after_the_prompts_last_tokens(llm, chunk):
    """Runner.prompt_tail = n: the prefill's logits after the prompt's last n tokens (cosine's router compares its
    drafters with them), as a plain forward over the whole prompt gives them; chunked, the last chunk's."""
    e = engine(llm, chunk=chunk)
    e.runner.prompt_tail = 8
    ids = llm.encode(LONG)
    seq = e.sequences(ids, SamplingParams(max_new_tokens=1))[0]
    with torch.inference_mode():
        if chunk < len(ids):
            while not e.runner.prefill_chunk(seq):
                pass
        logits = e.runner.prefill(seq, 0)
        whole = llm.models.target(torch.tensor([ids]))[0]
    assert logits.shape == (8, whole.shape[-1])
    torch.testing.assert_close(logits, whole[-8:], atol=1e-4, rtol=1e-4)
