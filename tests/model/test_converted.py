"""Files made the way users' files are made: a random transformers checkpoint of each architecture converted by
llama.cpp's own convert_hf_to_gguf.py (kept by `python -m specmesh.bench.llamacpp build`), then quantized by its
llama-quantize. The F32 file gives transformers' float32 logits, with and without a KV cache; on the Q4_K_M and
IQ4_XS files every one-process method gives `ar`'s tokens. `slow`: the converter loads torch and transformers once
per file (test_architectures.py checks the same architectures through specmesh's own writer in the default suite)."""
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

try:
    import transformers
except ImportError:
    pytest.fail("tests need the [test] extra: pip install -e .[test]", pytrace=False)

from specmesh import LLM, SamplingParams, catalog
from specmesh.bench.llamacpp import converter, native_bin
from specmesh.model.cache import KVCache
from specmesh.model.loader import load_model, load_tokenizer

pytestmark = pytest.mark.slow

SHAPE = dict(hidden_size=256, intermediate_size=512, num_hidden_layers=6, num_attention_heads=4,
             num_key_value_heads=2, head_dim=64, max_position_embeddings=4096, bos_token_id=1, eos_token_id=2)
LLAMA3 = {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 512}
GEMMA_ROPE = {"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
              "full_attention": {"rope_type": "default", "rope_theta": 1e6}}
CASES = {   # Gemma 3's layers as llama.cpp reads them from a GGUF: every sixth global, the window below the prompt
    "llama3.2": lambda s: transformers.LlamaForCausalLM(transformers.LlamaConfig(
        **s, rope_scaling=LLAMA3, rope_theta=500000.0, tie_word_embeddings=True)),
    "mistral": lambda s: transformers.MistralForCausalLM(transformers.MistralConfig(**s, sliding_window=None)),
    "qwen2.5": lambda s: transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**s, tie_word_embeddings=True)),
    "qwen3": lambda s: transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**s, tie_word_embeddings=False)),
    "gemma3": lambda s: transformers.Gemma3ForCausalLM(transformers.Gemma3TextConfig(
        **s, query_pre_attn_scalar=64, sliding_window=16, rope_parameters=GEMMA_ROPE,
        layer_types=["sliding_attention"] * 5 + ["full_attention"])),
}
# transformers maps a qwen2 folder's tokenizer to its Qwen2Tokenizer, whose split rule over SmolLM2's vocabulary
# hashes to no pre-tokenizer the converter knows: it is told the rule's name, as it would find it for Qwen2.5's own
CONVERT = """import runpy, sys
script, pre = sys.argv.pop(1), sys.argv.pop(1)
sys.path[:0] = [str(__import__("pathlib").Path(script).parent)]
if pre:
    from conversion.base import TextModel
    TextModel.get_vocab_base_pre = lambda self, tokenizer: pre
sys.argv[0] = script
runpy.run_path(script, run_name="__main__")
"""


@pytest.fixture(scope="module")
def smollm2_tokenizer():
    return load_tokenizer(catalog.resolve("smollm2-135m-instruct"))


@pytest.fixture(scope="module")
def converted(smollm2_tokenizer, tmp_path_factory):
    """case -> (transformers' model, {"F32" | "Q4_K_M" | "IQ4_XS": the file}); each made on first use."""
    with pytest.MonkeyPatch.context() as env:
        if not os.environ.get("SPECMESH_LLAMACPP_BIN"):     # the suite's cache is a temporary one: the machine's
            env.setenv("SPECMESH_LLAMACPP_BIN", str(Path(os.environ["SPECMESH_KERNEL_DIR"]) / "llama.cpp" / "bin"))
        if not converter().exists() or not (native_bin() / "llama-quantize").exists():
            pytest.fail(f"needs llama.cpp's converter and llama-quantize in {converter().parent.parent}: run "
                        "python -m specmesh.bench.llamacpp build", pytrace=False)
        made = {}
        yield lambda case: made.get(case) or made.setdefault(
            case, convert(case, smollm2_tokenizer, tmp_path_factory.mktemp(case)))


def convert(case: str, tokenizer, folder: Path) -> tuple:
    torch.manual_seed(7)
    ref = CASES[case](dict(SHAPE, vocab_size=tokenizer.vocab_size)).eval()
    with torch.no_grad():
        for name, p in ref.named_parameters():
            p.normal_(1.0 if "norm" in name else 0.0, 0.1 if "norm" in name else 0.05)
    ref.save_pretrained(folder)
    transformers.PreTrainedTokenizerFast(tokenizer_object=tokenizer.inner, bos_token="<|im_start|>",
                                         eos_token="<|im_end|>").save_pretrained(folder)
    files = {"F32": folder / "model-f32.gguf"}
    run([sys.executable, "-c", CONVERT, str(converter()), "qwen2" if case == "qwen2.5" else "", str(folder),
         "--outtype", "f32", "--outfile", str(files["F32"])])
    for kind in ("Q4_K_M", "IQ4_XS"):
        files[kind] = folder / f"model-{kind}.gguf"
        run([str(native_bin() / "llama-quantize"), str(files["F32"]), str(files[kind]), kind])
    return ref, files


def run(argv: list[str]) -> None:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, (argv[-4:], done.stderr[-2000:])


@pytest.mark.parametrize("case", CASES)
def test_the_converted_file_gives_transformers_logits(converted, case):
    ref, files = converted(case)
    ours = load_model(files["F32"], torch.float32)
    ids = torch.randint(0, ref.config.vocab_size, (1, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want = ref(ids).logits
        assert (ours(ids) - want).abs().max() <= 1e-4
        cache = KVCache.for_model(ours, 1, 64)
        steps = [ours(ids[:, :8], cache)]
        cache.commit_all()
        for t in range(8, ids.shape[1]):                       # one-token steps, past Gemma's window
            steps.append(ours(ids[:, t:t + 1], cache))
            cache.commit_all()
        assert (torch.cat(steps, 1) - want).abs().max() <= 1e-4


@pytest.mark.parametrize("kind", ["Q4_K_M", "IQ4_XS"])
@pytest.mark.parametrize("case", CASES)
def test_every_method_decodes_what_ar_decodes_on_the_quantized_file(converted, case, kind):
    target = converted(case)[1][kind]
    draft = converted("llama3.2")[1]["Q4_K_M"]
    prompt = "Write a Python function that merges two sorted lists, then explain its running time."
    tokens = {m: LLM(target=target, draft=draft, method=m).generate(prompt, SamplingParams(max_new_tokens=32)).tokens
              for m in ("ar", "sd", "tree", "selfdraft", "suffix")}
    assert all(t == tokens["ar"] for t in tokens.values()), tokens
