"""Our decoder against transformers' modelling code, loaded through our loader."""
import json

import pytest
import torch

try:
    import transformers
except ImportError:
    pytest.fail("tests need the [test] extra: pip install -e .[test]", pytrace=False)

from specmesh.model.cache import KVCache
from specmesh.model.execution import Batch
from specmesh.model.loader import CheckpointError, load_model, save_model
from specmesh.model.model import UnsupportedModelError

SMALL = dict(vocab_size=120, hidden_size=64, intermediate_size=112, num_hidden_layers=3, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=512)


def hf_model(kind: str, **extra):
    torch.manual_seed(1)
    if kind == "llama":
        cfg = transformers.LlamaConfig(**SMALL, **extra)
        model = transformers.LlamaForCausalLM(cfg)
    else:
        cfg = transformers.Qwen2Config(**SMALL, **extra)
        model = transformers.Qwen2ForCausalLM(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.1)
    return model.eval()


CASES = {
    "llama": ("llama", {}),
    "llama-tied": ("llama", {"tie_word_embeddings": True}),
    "llama3-rope": ("llama", {"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                               "high_freq_factor": 4.0, "original_max_position_embeddings": 64}}),
    "llama-bias": ("llama", {"attention_bias": True, "mlp_bias": True}),
    "qwen2": ("qwen2", {}),
}


@pytest.mark.parametrize("case", CASES)
def test_logits_match_transformers_prefill_and_decode(case, tmp_path):
    kind, extra = CASES[case]
    ref = hf_model(kind, **extra)
    ref.save_pretrained(tmp_path, safe_serialization=True, max_shard_size="100KB")   # sharded on purpose
    assert (tmp_path / "model.safetensors.index.json").exists()
    ours = load_model(tmp_path)
    ids = torch.randint(0, SMALL["vocab_size"], (1, 40))
    with torch.no_grad():
        expected = ref(ids).logits
        cache = KVCache.for_model(ours, 1, 64)
        got = ours(ids[:, :20], cache)
        cache.commit_all()
        assert (got - expected[:, :20]).abs().max() <= 1e-4
        for t in range(20, 40):          # 20 incremental decode steps
            step = ours(ids[:, t:t + 1], cache)
            cache.commit_all()
            assert (step[0, 0] - expected[0, t]).abs().max() <= 1e-4, f"decode step {t}"


def test_save_roundtrip_loads_in_transformers(tmp_path):
    ref = hf_model("llama", tie_word_embeddings=True)
    ref.save_pretrained(tmp_path / "a")
    ours = load_model(tmp_path / "a")
    save_model(ours, tmp_path / "b", dtype=torch.float32)
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "b").eval()
    ids = torch.randint(0, SMALL["vocab_size"], (1, 16))
    with torch.no_grad():
        assert torch.allclose(back(ids).logits, ref(ids).logits, atol=1e-5)


def test_missing_checkpoint_errors(tmp_path):
    with pytest.raises(CheckpointError, match="not found"):
        load_model(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match="config.json"):
        load_model(tmp_path / "empty")
    hf_model("llama").save_pretrained(tmp_path / "noweights")
    (tmp_path / "noweights" / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match="model.safetensors"):
        load_model(tmp_path / "noweights")


def test_unsupported_model_type_names_supported(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]}))
    with pytest.raises(UnsupportedModelError, match="supported: gemma3_text, llama, mistral, qwen2, qwen3"):
        load_model(tmp_path)


def restricted_copy(src, dst, ids):
    """A copy of checkpoint `src` whose head, loaded as a draft, computes `ids` only."""
    import shutil
    from safetensors.torch import save_file
    from specmesh.model.loader import HEAD_TOKENS
    shutil.copytree(src, dst)
    save_file({"ids": torch.tensor(ids)}, dst / HEAD_TOKENS)
    return dst


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_restricted_head_computes_its_tokens_only(tiny_checkpoint, tmp_path, dtype):
    from specmesh.model.cache import KVCache
    from specmesh.model.loader import load_model
    ids = list(range(0, 300, 3))
    path = restricted_copy(tiny_checkpoint, tmp_path / "draft", ids)
    full, part = load_model(tiny_checkpoint, dtype, draft=True), load_model(path, dtype, draft=True)
    assert part.lm_head.out_features == len(ids) and full.head_ids is None
    assert load_model(path, dtype).head_ids is None                           # a target computes every token
    x = torch.tensor([[5, 17, 42, 7]])
    for model_out in ((full(x), part(x)),                                     # PyTorch's path
                      tuple(m(x, KVCache.for_model(m, 1, 16)) for m in (full, part))):   # the kernels' path
        a, b = model_out
        keep = torch.zeros(a.shape[-1], dtype=torch.bool)
        keep[ids] = True
        assert torch.isinf(b[..., ~keep]).all() and (b[..., ~keep] < 0).all()
        assert (a[..., keep] - b[..., keep]).abs().max() <= 1e-5          # a head row's products are its own


def test_head_argument_gives_those_tokens_logits_with_gradients(tiny_checkpoint):
    model = load_model(tiny_checkpoint, pack=False).requires_grad_(True)
    x, ids = torch.tensor([[5, 17, 42, 7]]), torch.tensor([3, 9, 200])
    part = model(x, batch=Batch(head=ids))                                   # [1, 4, 3]
    assert part.shape == (1, 4, 3) and torch.allclose(part, model(x)[..., ids], atol=1e-6)
    part.sum().backward()
    assert model.lm_head.weight.grad[ids].abs().sum() > 0 and model.lm_head.weight.grad[4].abs().sum() == 0


def test_the_last_position_s_logits_do_not_depend_on_how_many_positions_are_asked_for(tiny_checkpoint):
    """cosine's prefill asks for the prompt's last 256 positions (its router), every other method for one: the
    first token must come from the same float32 numbers (a product's rounding depends on its rows)."""
    model = load_model(tiny_checkpoint, torch.float32)
    h = torch.randn(1, 300, model.config.hidden_size, generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        one = model.logits(h, True)
        for n in (2, 17, 256):
            assert torch.equal(model.logits(h, n)[:, -1:], one), n
