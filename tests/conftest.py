import os

import pytest
import torch

from specmesh.model import ModelConfig, Transformer

torch.set_num_threads(int(os.environ.get("SPECMESH_TEST_THREADS", "2")))


def tiny_config(**kw) -> ModelConfig:
    base = dict(vocab_size=97, hidden_size=64, intermediate_size=96, num_layers=3, num_heads=4,
                num_kv_heads=2, head_dim=16, max_position_embeddings=256, eos_token_id=0)
    return ModelConfig(**(base | kw))


@pytest.fixture
def tiny_model():
    torch.manual_seed(0)
    model = Transformer(tiny_config()).eval()
    for p in model.parameters():        # larger weights: sharper, more varied logits
        torch.nn.init.normal_(p, std=0.2)
    return model
