"""`--quant int8`: every method's greedy output equals `ar`'s on the same quantized weights, and the
quantized model is another model (its outputs differ from the unquantized one's somewhere)."""
import pytest

from specmesh import LLM, SamplingParams

PROMPTS = ["def add(a, b):", "class Point:\n    def", "x", "self.y = y\n\n" * 3]
PARAMS = SamplingParams(max_new_tokens=24)


@pytest.fixture(scope="module", params=["bfloat16", "float32"])
def ar(request, tiny_checkpoint):
    return LLM(target=tiny_checkpoint, method="ar", dtype=request.param, quant="int8")


@pytest.mark.parametrize("method", ["sd", "tree", "selfdraft", "pearl", "pp", "stpp", "pipedec"])
def test_every_method_equals_ar_on_the_quantized_model(ar, method, tiny_checkpoint, tiny_draft_checkpoint):
    draft = None if method == "selfdraft" else tiny_draft_checkpoint
    with LLM(target=tiny_checkpoint, draft=draft, method=method, dtype=ar.dtype, quant="int8", gamma=3,
             timeout=30) as llm:
        assert llm.models.target.quant == "int8"
        outs = [llm.generate(p, PARAMS).tokens for p in PROMPTS]
    assert outs == [ar.generate(p, PARAMS).tokens for p in PROMPTS], method


def test_the_quantized_model_is_loaded_as_such(ar, tiny_checkpoint):
    plain = LLM(target=tiny_checkpoint, method="ar", dtype=ar.dtype)
    assert plain.models.target.quant is None
    assert [plain.generate(p, PARAMS).tokens for p in PROMPTS] != [ar.generate(p, PARAMS).tokens for p in PROMPTS]


def test_an_unknown_quantization_is_refused(tiny_checkpoint):
    with pytest.raises(ValueError, match="unknown quantization 'int4'; choose from int8"):
        LLM(target=tiny_checkpoint, method="ar", quant="int4")
