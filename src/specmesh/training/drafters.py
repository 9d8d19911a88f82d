"""CoSine's specialised drafters: the embedded draft distilled further on one domain of the corpus.

Domains of the standard library (corpus.py's files, its held-out rule unchanged): `tests`, the test suites
(test/, */test*/ and idlelib's idle_test), and `lib`, the library code beside them. `specmesh train
--specialise DOMAIN` starts from the general draft (models/draft) and distils it from the frozen embedded
target on that domain's training files only (train.distill: KL(target || draft)), then writes
models/drafters/DOMAIN with its held-out metrics on every domain, and the domain's held-out prompts
(prompts/DOMAIN-heldout.jsonl, cut as corpus.make_prompts cuts them).
"""
from __future__ import annotations

import json
import shutil
import zlib
from dataclasses import asdict
from pathlib import Path

import torch

from specmesh import embedded
from specmesh.catalog import DOMAINS
from specmesh.model.loader import load_model, save_model
from specmesh.training import corpus
from specmesh.training.train import TrainConfig, distill, encode_split, evaluate



def domain_of(relpath: str) -> str:
    """A stdlib file's domain."""
    parts = relpath.split("/")
    if any(p == "test" or p == "tests" or p.startswith("test_") or p == "idle_test" for p in parts):
        return "tests"
    return "lib"


def domain_sources(domain: str) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """(training, held-out) files of a domain."""
    if domain not in DOMAINS:
        raise ValueError(f"unknown domain {domain!r}; choose from {', '.join(DOMAINS)}")
    train, heldout = corpus.split(corpus.stdlib_sources())
    keep = lambda files: [(rel, text) for rel, text in files if domain_of(rel) == domain]
    return keep(train), keep(heldout)


def specialise(domain: str, out: str = "models/drafters", work: str = "runs/drafters", tokens: int = 1_600_000,
               lr: float = 6e-4, prompts: str = "prompts", init: str | None = None) -> dict:
    """Distil the general draft (or the draft in `init`, to go on specialising one) on `domain`; write
    out/DOMAIN (bf16, with its tokenizer) and the domain's held-out prompts; returns the metrics (held-out
    cross-entropy and agreement with the target per domain)."""
    from tokenizers import Tokenizer
    work_dir, out_dir = Path(work) / domain, Path(out) / domain
    work_dir.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer.from_file(str(embedded.path("draft") / "tokenizer.json"))
    train_files, heldout_files = domain_sources(domain)
    corpus.write_jsonl(corpus.make_prompts(heldout_files, count=60), Path(prompts) / f"{domain}-heldout.jsonl")
    ids = encode_split(tok, train_files)
    target = load_model(embedded.path("target"), torch.float32, "cpu", pack=False)
    draft = load_model(init or embedded.path("draft"), torch.float32, "cpu", pack=False)
    cfg = TrainConfig(work=str(work_dir), out=str(out_dir), distill_tokens=tokens, lr_distill=lr, warmup=50,
                      seed=zlib.crc32(domain.encode()) % 1000)
    distill(cfg, target, draft, ids)
    save_model(draft, out_dir, dtype=torch.bfloat16)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(embedded.path("draft") / f, out_dir / f)
    metrics = {"domain": domain, "train_tokens": int(len(ids)), "recipe": asdict(cfg)}
    for other in DOMAINS:
        held = encode_split(tok, domain_sources(other)[1])
        metrics[f"heldout_{other}"] = evaluate(target, draft.float(), held, windows_=32)
    (out_dir / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
    return metrics


def general_metrics() -> dict:
    """The general draft's held-out metrics per domain (for comparison)."""
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(str(embedded.path("draft") / "tokenizer.json"))
    target = load_model(embedded.path("target"), torch.float32, "cpu", pack=False)
    draft = load_model(embedded.path("draft"), torch.float32, "cpu", pack=False)
    return {d: evaluate(target, draft, encode_split(tok, domain_sources(d)[1]), windows_=32) for d in DOMAINS}


