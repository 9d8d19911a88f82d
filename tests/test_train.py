"""The recipe's distillation stage, on tiny models and windows so it runs in seconds."""
import numpy as np
import torch

from specmesh.model.model import Transformer
from specmesh.training import train
from conftest import tiny_config


def test_distill_moves_the_draft_toward_the_frozen_target(tmp_path, monkeypatch):
    monkeypatch.setattr(train, "CONTEXT", 32)
    torch.manual_seed(0)
    target = Transformer(tiny_config())
    draft = Transformer(tiny_config(num_layers=1, hidden_size=32, num_heads=2, num_kv_heads=1))
    train.init_weights(draft)
    data = np.random.default_rng(0).integers(0, 97, 32 * 64 + 1).astype(np.uint16)
    before_t = {k: v.clone() for k, v in target.state_dict().items()}
    before = train.evaluate(target, draft, data, windows_=8)

    cfg = train.TrainConfig(work=str(tmp_path), distill_tokens=32 * 4 * 60, batch=4, lr_distill=1e-2, warmup=5)
    train.distill(cfg, target, draft, data)
    after = train.evaluate(target, draft, data, windows_=8)

    assert after["greedy_agreement"] > before["greedy_agreement"] + 0.2, (before, after)
    assert all(torch.equal(before_t[k], v) for k, v in target.state_dict().items()), "the target must stay frozen"
    assert torch.load(tmp_path / "distill.pt", weights_only=False)["step"] == 60      # resumable checkpoint


def test_bf16_autocast_only_where_the_cpu_has_native_bf16(monkeypatch):
    """Elsewhere autocast emulates bf16 at a tenth of float32's speed: training runs in float32 there."""
    for native in (False, True):
        monkeypatch.setattr(train, "native_bf16", lambda native=native: native)
        with train.mixed_precision():
            assert torch.is_autocast_enabled("cpu") == native
            assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == (torch.bfloat16 if native else torch.float32)
