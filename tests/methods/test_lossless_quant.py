"""`--quant int8` and `int4`, and a GGUF file's Q4_1 blocks run as they are: every method's greedy output equals
`ar`'s on the same quantized weights, and the quantized model is another model (its outputs differ from the
unquantized one's somewhere)."""
import pytest

from specmesh import LLM, SamplingParams
from specmesh.model.loader import to_gguf

PROMPTS = ["def add(a, b):", "class Point:\n    def", "x", "self.y = y\n\n" * 3]
PARAMS = SamplingParams(max_new_tokens=24)


KINDS = [("bfloat16", "int8"), ("float32", "int8"), ("bfloat16", "int4"), ("bfloat16", "gguf-q4_1")]


def quantized_ar(kind: tuple[str, str], tiny_checkpoint, tmp_path_factory) -> LLM:
    """`ar` on the quantized target; `gguf-q4_1`: a Q4_1 GGUF of it (its blocks as they are where the kernels
    multiply them, loader.runs_blocks)."""
    dtype, quant = kind
    if quant.startswith("gguf"):
        target = to_gguf(tiny_checkpoint, tmp_path_factory.mktemp("gguf") / "q4_1.gguf", "q4_1")
        return LLM(target=target, method="ar", dtype=dtype)
    return LLM(target=tiny_checkpoint, method="ar", dtype=dtype, quant=quant)


@pytest.fixture(scope="module", params=KINDS, ids=lambda p: "-".join(p))
def ar(request, tiny_checkpoint, tmp_path_factory):
    return quantized_ar(request.param, tiny_checkpoint, tmp_path_factory)


# the pipelines' ranks load the model as one process does: two kinds (the 8-bit product and GGUF's blocks) suffice
@pytest.fixture(scope="module", params=[KINDS[0], KINDS[3]], ids=lambda p: "-".join(p))
def ar_for_pipelines(request, tiny_checkpoint, tmp_path_factory):
    return quantized_ar(request.param, tiny_checkpoint, tmp_path_factory)


def assert_equals_ar(ar: LLM, method: str, draft) -> None:
    quant = ar.models.target.quant
    with LLM(target=ar.models.target_path, draft=draft, method=method, dtype=ar.dtype, quant=quant, gamma=3,
             timeout=30) as llm:
        assert llm.models.target.quant == quant
        outs = [llm.generate(p, PARAMS).tokens for p in PROMPTS]
    assert outs == [ar.generate(p, PARAMS).tokens for p in PROMPTS], method


@pytest.mark.parametrize("method", ["sd", "tree", "selfdraft", "pearl"])
def test_every_method_equals_ar_on_the_quantized_model(ar, method, tiny_draft_checkpoint):
    assert_equals_ar(ar, method, None if method == "selfdraft" else tiny_draft_checkpoint)


@pytest.mark.parametrize("method", ["pp", "stpp", "pipedec"])
def test_every_pipeline_equals_ar_on_the_quantized_model(ar_for_pipelines, method, tiny_draft_checkpoint):
    assert_equals_ar(ar_for_pipelines, method, tiny_draft_checkpoint)


def test_the_quantized_model_is_loaded_as_such(ar, tiny_checkpoint):
    plain = LLM(target=tiny_checkpoint, method="ar", dtype=ar.dtype)
    assert plain.models.target.quant is None
    assert [plain.generate(p, PARAMS).tokens for p in PROMPTS] != [ar.generate(p, PARAMS).tokens for p in PROMPTS]


def test_an_unknown_quantization_is_refused(tiny_checkpoint):
    with pytest.raises(ValueError, match="unknown quantization 'int2'; choose from int8, int4"):
        LLM(target=tiny_checkpoint, method="ar", quant="int2")
