"""`pp`: plain pipeline-parallel decoding over stage processes (the PipeDec runtime's first piece)."""
from collections import Counter

import pytest
import torch
from scipy.stats import chi2_contingency

from specmesh import LLM, SamplingParams, embedded
from specmesh.model.cache import KVCache
from specmesh.model.execution import Batch
from specmesh.model.loader import load_model
from specmesh.runtime.pipeline import Packet, Stage, stage_layers

PROMPTS = ["def add(a, b):", "class Point:\n    def", "for i in range(10):\n", "x"]


def test_stage_layers_split_contiguously():
    assert stage_layers(8, 3) == [range(0, 3), range(3, 6), range(6, 8)]
    assert stage_layers(3, 3) == [range(0, 1), range(1, 2), range(2, 3)]
    with pytest.raises(ValueError, match="cannot split 3 layers into 4 stages"):
        stage_layers(3, 4)


@pytest.fixture(scope="module")
def ar(tiny_checkpoint):
    return LLM(target=tiny_checkpoint)


@pytest.mark.parametrize("stages", [2, 3])
def test_greedy_equals_ar(ar, tiny_checkpoint, stages):
    with LLM(target=tiny_checkpoint, method="pp", stages=stages, timeout=20) as pp:
        for prompt in PROMPTS:
            for max_new in (1, 17):
                params = SamplingParams(max_new_tokens=max_new)
                out = pp.generate(prompt, params)
                assert out.tokens == ar.generate(prompt, params).tokens, (stages, prompt)
                assert out.stats.target_forwards == len(out.tokens)          # one full pass per token


def test_sampling_matches_ar_and_seeds_reproduce(ar, tiny_checkpoint):
    params = dict(max_new_tokens=2, temperature=1.0, n=300)
    with LLM(target=tiny_checkpoint, method="pp", stages=2) as pp:
        got = pp.generate("def", SamplingParams(seed=1, **params))
        again = [pp.generate("def", SamplingParams(max_new_tokens=10, temperature=1.0, seed=s)).tokens for s in (3, 3)]
    assert again[0] == again[1]
    ref = ar.generate("def", SamplingParams(seed=2, **params))
    a, b = Counter(tuple(s.tokens) for s in ref.samples), Counter(tuple(s.tokens) for s in got.samples)
    keys = [k for k in set(a) | set(b) if a[k] + b[k] >= 10]
    rest = (300 - sum(a[k] for k in keys), 300 - sum(b[k] for k in keys))
    assert chi2_contingency([[a[k] for k in keys] + [rest[0]], [b[k] for k in keys] + [rest[1]]])[1] > 0.001


def test_one_stage_is_refused(tiny_checkpoint):
    with pytest.raises(ValueError, match="at least 2 stages"):
        LLM(target=tiny_checkpoint, method="pp", stages=1)


def test_a_second_request_beside_an_open_stream_waits_its_turn(tiny_checkpoint):
    """The stage processes serve one request at a time, through the LLM's one engine of one row: a request while
    a stream is open queues behind it (it once waited for the link's timeout and broke the pipeline); both get
    their tokens and later requests go on."""
    with LLM(target=tiny_checkpoint, method="pp") as llm:
        params = SamplingParams(max_new_tokens=6)
        stream = llm.stream("x", params)
        pieces = iter(stream)
        head = next(pieces)
        second = llm.generate("x", params)
        assert head + "".join(pieces) == second.text and stream.output.tokens == second.tokens
        assert llm.generate("x", params).tokens == second.tokens


def test_a_closed_pipeline_says_so(tiny_checkpoint):
    with LLM(target=tiny_checkpoint, method="pp") as llm:
        llm.generate("x", SamplingParams(max_new_tokens=2))
    with pytest.raises(RuntimeError, match="this LLM was closed: pp's processes are stopped"):
        llm.generate("x", SamplingParams(max_new_tokens=2))


class LocalLink:
    """Two stages' links in one process: what one sends, the other receives (no mailboxes)."""
    def __init__(self, rank: int, queues: dict):
        self.rank, self.roles, self.queues = rank, ["stage0", "stage1"], queues

    def by_mailbox(self, peer: int, nbytes: int) -> bool:
        return False

    def send(self, tensor, dst: int, wait: bool = True):
        self.queues[dst].append(tensor.clone())
        return None if wait else (lambda: None)

    def recv(self, tensor, src: int, **kw):
        return tensor.copy_(self.queues[self.rank].pop(0))


def test_a_bf16_stage_passes_on_the_residual_stream_unrounded():
    """In bfloat16 the C forward keeps its residual stream in float32 (not bf16-representable): the next stage gets
    it as it is, so the split forward's logits are the whole forward's, bit for bit (a rounding on the way, which
    `ar` never makes, could flip a near-tie)."""
    model = load_model(embedded.ROOT / "models" / "target", torch.bfloat16)        # the C forward where there is one
    split = stage_layers(model.config.num_layers, 2)
    queues = {0: [], 1: []}
    stages = [Stage(model, LocalLink(r, queues)) for r in (0, 1)]
    for stage, layers in zip(stages, split):
        stage.begin(64, layers)
    whole = KVCache.for_model(model, 1, 64)
    ids = torch.tensor([[5, 17, 3, 99, 42, 7]])
    with torch.inference_mode():
        for x in (ids, torch.tensor([[11]]), torch.tensor([[12]])):
            expected = model(x, whole, Batch(last_only=True))
            whole.commit_all()
            stages[0].send_on(Packet(stages[0].forward(Packet(x))))
            got = stages[1].forward(stages[1].receive())
            assert torch.equal(got[:, -1], expected[:, -1])
