"""The embedded models' recipe: tokenizer, target and a draft distilled from it.

`specmesh train` runs it end to end on the stdlib corpus (see corpus.py):
  1. byte-level BPE tokenizer (8192 tokens) on the training split;
  2. target and draft trained together, one pass over shuffled 1024-token windows:
     target on next-token cross-entropy; draft on 0.5 * cross-entropy +
     0.5 * KL(target || draft) against the target's current (detached) logits —
     online distillation, which raises draft/target agreement;
  3. the draft alone distilled from the finished, frozen target (pure KL on a fresh
     shuffle): a draft that chases a moving target lags it, and agreement with the
     final target is what speculation pays for;
  4. bfloat16 autocast where the CPU has native bf16 (faster than float32 there: docs/models.md), AdamW,
     linear warm-up then cosine decay; checkpoints in --work for resuming;
  5. the finished weights are written in HF layout, 16-bit, with held-out metrics.
"""
from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm

from specmesh.kernels.build import native_bf16
from specmesh.model.loader import save_model
from specmesh.model.model import ModelConfig, Transformer
from specmesh.training import corpus

EOS = "<|endoftext|>"
VOCAB = 8192
CONTEXT = 1024

TARGET = dict(hidden_size=512, intermediate_size=1408, num_layers=8, num_heads=8, num_kv_heads=4, head_dim=64)
DRAFT = dict(hidden_size=256, intermediate_size=768, num_layers=4, num_heads=4, num_kv_heads=2, head_dim=64)


@dataclass
class TrainConfig:
    work: str = "runs/train"        # git-ignored: corpus, checkpoints
    out: str = "models"             # finished weights: OUT/target, OUT/draft
    prompts: str = "prompts/stdlib-heldout.jsonl"   # evaluation prompts cut from held-out files
    tokens: int = 6_000_000         # co-training tokens (the corpus holds ~9M)
    distill_tokens: int = 4_000_000 # draft-only distillation tokens
    batch: int = 4                  # windows of CONTEXT tokens per step
    lr_target: float = 1e-3
    lr_draft: float = 2e-3
    lr_distill: float = 4e-4
    warmup: int = 100
    seed: int = 0
    threads: int = 0                # 0: torch's default
    resume_from: str = ""           # models folder (target/, draft/) of a finished co-training: distill only


def model_config(shape: dict, eos_id: int) -> ModelConfig:
    return ModelConfig(vocab_size=VOCAB, max_position_embeddings=CONTEXT, tie_word_embeddings=True,
                       rms_norm_eps=1e-5, bos_token_id=eos_id, eos_token_id=eos_id, **shape)


def train_tokenizer(texts: list[str], out: Path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=[EOS], min_frequency=2,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=True)
    tok.train_from_iterator(texts, trainer)
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": EOS, "eos_token": EOS,
        "model_max_length": CONTEXT, "clean_up_tokenization_spaces": False}, indent=2) + "\n")
    return tok


def encode_split(tok, sources: list[tuple[str, str]]) -> np.ndarray:
    eos = tok.token_to_id(EOS)
    ids: list[int] = []
    for enc in tok.encode_batch([text for _, text in sources]):
        ids.extend(enc.ids)
        ids.append(eos)
    return np.array(ids, dtype=np.uint16)


def prepare_corpus(cfg: TrainConfig):
    """Tokenizer + token arrays, cached in cfg.work."""
    work = Path(cfg.work)
    tok_dir = work / "tokenizer"
    if not (work / "train.npy").exists():
        print("reading the stdlib corpus ...", flush=True)
        train, heldout = corpus.split(corpus.stdlib_sources())
        if (tok_dir / "tokenizer.json").exists():
            from tokenizers import Tokenizer
            tok = Tokenizer.from_file(str(tok_dir / "tokenizer.json"))
        else:
            tok = train_tokenizer([t for _, t in train], tok_dir)
        np.save(work / "train.npy", encode_split(tok, train))
        np.save(work / "heldout.npy", encode_split(tok, heldout))
        corpus.write_jsonl(corpus.make_prompts(heldout), cfg.prompts)
    from tokenizers import Tokenizer
    return Tokenizer.from_file(str(tok_dir / "tokenizer.json")), np.load(work / "train.npy"), \
        np.load(work / "heldout.npy")


def init_weights(model: Transformer) -> None:
    std = 0.02
    for name, p in model.named_parameters():
        if p.dim() == 1:
            continue
        scale = 1 / math.sqrt(2 * model.config.num_layers) if name.endswith(("o.weight", "down.weight")) else 1
        torch.nn.init.normal_(p, std=std * scale)


def optimizer(model: Transformer, lr: float) -> torch.optim.Optimizer:
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}],
                             lr=lr, betas=(0.9, 0.95))


def lr_factor(step: int, total: int, warmup: int) -> float:
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress))


def windows(data: np.ndarray, total_steps: int, batch: int, seed: int) -> np.ndarray:
    """Start offsets [steps, batch]: a shuffled pass over non-overlapping windows, repeated if needed."""
    rng = np.random.default_rng(seed)
    n = (len(data) - 1) // CONTEXT
    need = total_steps * batch
    order = np.concatenate([rng.permutation(n) for _ in range(need // n + 1)])[:need]
    return (order * CONTEXT).reshape(total_steps, batch)


def mixed_precision() -> torch.autocast:
    """bfloat16 autocast where the CPU's oneDNN does bf16 (kernels.native_bf16: AVX-512, AMX); float32 elsewhere,
    where autocast emulates bf16 at several times the cost of float32."""
    return torch.autocast("cpu", dtype=torch.bfloat16, enabled=native_bf16())


def batch_at(data: np.ndarray, starts: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    rows = np.stack([data[s:s + CONTEXT + 1] for s in starts]).astype(np.int64)
    t = torch.from_numpy(rows)
    return t[:, :-1], t[:, 1:]


def losses(target: Transformer, draft: Transformer, x: torch.Tensor, y: torch.Tensor):
    V = target.config.vocab_size
    with mixed_precision():
        lt = target(x).view(-1, V)
        ld = draft(x).view(-1, V)
    loss_t = F.cross_entropy(lt, y.reshape(-1))
    ce_d = F.cross_entropy(ld, y.reshape(-1))
    kl = F.kl_div(F.log_softmax(ld, -1), F.log_softmax(lt.detach(), -1), log_target=True, reduction="batchmean")
    return loss_t, ce_d, kl


def run(cfg: TrainConfig) -> dict:
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    work = Path(cfg.work)
    work.mkdir(parents=True, exist_ok=True)
    if cfg.resume_from:
        target, draft = load_stage1(cfg)
        tok, train_ids, heldout_ids = prepare_corpus(cfg)
    else:
        tok, train_ids, heldout_ids = prepare_corpus(cfg)
        target, draft = cotrain(cfg, train_ids, tok.token_to_id(EOS))
    distill(cfg, target, draft, train_ids)
    return export(cfg, target, draft, heldout_ids)


def load_stage1(cfg: TrainConfig) -> tuple[Transformer, Transformer]:
    """Target and draft of a finished co-training, exported to cfg.resume_from; its tokenizer is reused."""
    import shutil
    from specmesh.model.loader import load_model
    src = Path(cfg.resume_from)
    tok_dir = Path(cfg.work) / "tokenizer"
    tok_dir.mkdir(parents=True, exist_ok=True)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(src / "target" / f, tok_dir / f)
    return tuple(load_model(src / name, dtype=torch.float32, pack=False) for name in ("target", "draft"))


def set_lr(opt: torch.optim.Optimizer, lr: float) -> None:
    for g in opt.param_groups:
        g["lr"] = lr


def cotrain(cfg: TrainConfig, train_ids: np.ndarray, eos: int) -> tuple[Transformer, Transformer]:
    torch.manual_seed(cfg.seed)
    target, draft = Transformer(model_config(TARGET, eos)), Transformer(model_config(DRAFT, eos))
    init_weights(target)
    init_weights(draft)
    opt_t, opt_d = optimizer(target, cfg.lr_target), optimizer(draft, cfg.lr_draft)
    steps = cfg.tokens // (cfg.batch * CONTEXT)
    starts = windows(train_ids, steps, cfg.batch, cfg.seed)
    ckpt = Path(cfg.work) / "checkpoint.pt"
    step0 = resume(ckpt, target=target, draft=draft, opt_t=opt_t, opt_d=opt_d)
    print(f"target {target.num_parameters() / 1e6:.1f}M, draft {draft.num_parameters() / 1e6:.1f}M, "
          f"{steps} steps x {cfg.batch * CONTEXT} tokens", flush=True)
    bar = tqdm(range(step0, steps), initial=step0, total=steps, desc="co-train", unit="step")
    t0 = time.time()
    for step in bar:
        set_lr(opt_t, cfg.lr_target * lr_factor(step, steps, cfg.warmup))
        set_lr(opt_d, cfg.lr_draft * lr_factor(step, steps, cfg.warmup))
        x, y = batch_at(train_ids, starts[step])
        loss_t, ce_d, kl = losses(target, draft, x, y)
        (loss_t + 0.5 * ce_d + 0.5 * kl).backward()
        for model, opt in ((target, opt_t), (draft, opt_d)):
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
        tps = (step + 1 - step0) * cfg.batch * CONTEXT / (time.time() - t0)
        bar.set_postfix(target=f"{loss_t.item():.3f}", draft=f"{ce_d.item():.3f}", kl=f"{kl.item():.3f}",
                        tok_s=f"{tps:.0f}")
        if (step + 1) % 100 == 0 or step + 1 == steps:
            checkpoint(ckpt, step + 1, target=target, draft=draft, opt_t=opt_t, opt_d=opt_d)
    return target, draft


def distill(cfg: TrainConfig, target: Transformer, draft: Transformer, train_ids: np.ndarray) -> None:
    """Draft only, on KL(target || draft) with the target frozen."""
    target.eval().requires_grad_(False)
    V = target.config.vocab_size
    opt = optimizer(draft, cfg.lr_distill)
    steps = cfg.distill_tokens // (cfg.batch * CONTEXT)
    starts = windows(train_ids, steps, cfg.batch, cfg.seed + 1)
    ckpt = Path(cfg.work) / "distill.pt"
    step0 = resume(ckpt, draft=draft, opt=opt)
    bar = tqdm(range(step0, steps), initial=step0, total=steps, desc="distill", unit="step")
    t0 = time.time()
    for step in bar:
        set_lr(opt, cfg.lr_distill * lr_factor(step, steps, cfg.warmup))
        x, _ = batch_at(train_ids, starts[step])
        with mixed_precision():
            with torch.no_grad():
                lt = target(x).view(-1, V)
            ld = draft(x).view(-1, V)
        kl = distill_step(draft, opt, lt, ld)
        tps = (step + 1 - step0) * cfg.batch * CONTEXT / (time.time() - t0)
        bar.set_postfix(kl=f"{kl:.3f}", tok_s=f"{tps:.0f}")
        if (step + 1) % 100 == 0 or step + 1 == steps:
            checkpoint(ckpt, step + 1, draft=draft, opt=opt)


def distill_step(draft: Transformer, opt: torch.optim.Optimizer, teacher_logits: torch.Tensor,
                 draft_logits: torch.Tensor) -> float:
    """One optimizer step of the draft on KL(teacher || draft) ([N, V] logits); the KL."""
    kl = F.kl_div(F.log_softmax(draft_logits.float(), -1), F.log_softmax(teacher_logits.float(), -1),
                  log_target=True, reduction="batchmean")
    kl.backward()
    torch.nn.utils.clip_grad_norm_(draft.parameters(), 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)
    return kl.item()


def checkpoint(path: Path, step: int, **objs) -> None:
    torch.save({"step": step, **{k: o.state_dict() for k, o in objs.items()}}, path)


def resume(path: Path, **objs) -> int:
    """Load a checkpoint into objs (modules, optimizers); the step to continue from (0 without one)."""
    if not path.exists():
        return 0
    state = torch.load(path, weights_only=False)
    for k, o in objs.items():
        o.load_state_dict(state[k])
    print(f"resuming {path.name} at step {state['step']}", flush=True)
    return state["step"]


@torch.no_grad()
def evaluate(target: Transformer, draft: Transformer, ids: np.ndarray, windows_: int = 64) -> dict:
    """Held-out cross-entropy (nats/token) of both models and greedy next-token agreement."""
    target.eval(), draft.eval()
    n = min(windows_, (len(ids) - 1) // CONTEXT)
    stride = ((len(ids) - 1) // CONTEXT) // n * CONTEXT
    ce_t = ce_d = agree = 0.0
    for i in range(n):
        x, y = batch_at(ids, np.array([i * stride]))
        lt, ld = target(x)[0].float(), draft(x)[0].float()
        ce_t += F.cross_entropy(lt, y[0]).item()
        ce_d += F.cross_entropy(ld, y[0]).item()
        agree += (lt.argmax(-1) == ld.argmax(-1)).float().mean().item()
    return {"heldout_tokens": n * CONTEXT, "target_ce": ce_t / n, "draft_ce": ce_d / n, "greedy_agreement": agree / n}


def export(cfg: TrainConfig, target: Transformer, draft: Transformer, heldout_ids: np.ndarray) -> dict:
    import shutil
    out, work = Path(cfg.out), Path(cfg.work)
    for model, name in ((target, "target"), (draft, "draft")):
        save_model(model, out / name, dtype=torch.bfloat16)
        for f in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(work / "tokenizer" / f, out / name / f)
    metrics = evaluate(target.float(), draft.float(), heldout_ids)
    metrics["recipe"] = asdict(cfg)
    (out / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
    print(json.dumps(metrics, indent=2), flush=True)
    return metrics
