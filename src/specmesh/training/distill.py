"""A draft for any target: `specmesh train --teacher MODEL --out DIR` (the SmolLM2 draft's recipe).

1. Instructions made from templates (instructions.py) and instructions the teacher writes itself (Magpie,
   Xu et al. 2024: its chat template up to where a user's message begins, sampled), answered by the teacher
   (through its chat template, on the engine in batches): chat transcripts in the teacher's own words. Code: the
   standard library's training split (corpus.py; the held-out files stay out), in the teacher's tokens, and the
   teacher's greedy continuations of snippets of it (what a draft meets when the teacher completes code).
2. A fresh small draft (DRAFT: 4 layers of width 256) with the teacher's vocabulary and tokenizer. Its tied
   embedding starts as the teacher's projected on its top 256 principal directions, so that its logits
   start in the teacher's logit space (h·Eᵀ ≈ (hP)(EP)ᵀ).
   Or an existing draft to go on from (`init`).
3. Distilled on KL(teacher ‖ draft) over windows, half chat and half code, the teacher frozen, both heads
   restricted to the draft's head tokens (its decoding head: the training text's most frequent tokens), which
   also makes a step faster than over the whole vocabulary.
4. Written 16-bit with the teacher's tokenizer and chat template; metrics.json has the greedy agreement
   with the teacher on held-out chat (answers to held-out instructions) and held-out code.

Why this size: speculation pays when a draft step costs a small fraction c of a target step. SmolLM2's head
alone (49152 x 576) is a fifth of its weights, so its first layers under that head cost a large share of a target
step; this width-256 draft (16M weights, kept in int8 by the draft kernels) costs a small one (the measured c:
docs/results).
"""
from __future__ import annotations

import json
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from tqdm import tqdm

from specmesh import catalog
from specmesh.model.execution import Batch
from specmesh.training import corpus
from specmesh.training.instructions import instructions
from specmesh.model.loader import HEAD_TOKENS, load_model, load_tokenizer, save_model
from specmesh.model.model import ModelConfig, Transformer
from specmesh.training.train import (checkpoint, distill_step, init_weights, lr_factor, mixed_precision, optimizer, resume,
                            set_lr)

DRAFT = dict(hidden_size=256, intermediate_size=768, num_layers=4, num_heads=4, num_kv_heads=2, head_dim=64)


@dataclass
class DistillConfig:
    teacher: str = "smollm2-135m-instruct"
    out: str = "models/smollm2-draft"
    work: str = "runs/distill"          # git-ignored: transcripts, token arrays, checkpoints
    instructions: int = 2000            # answered by the teacher for training (as many as the templates make)
    self_instructions: int = 2048       # written by the teacher itself, then answered (greedy)
    code_continuations: int = 2048      # training-split snippets the teacher continues (greedy)
    continuation_tokens: int = 128
    heldout_instructions: int = 48
    answer_tokens: int = 192
    code_chars: int = 3_000_000         # of standard-library training files (and a fifteenth of it held out)
    steps: int = 1600
    batch: int = 8                      # windows per step, half chat, half code
    window: int = 256
    head_tokens: int = 16384            # the draft's head computes the most frequent tokens only (0: all)
    lr: float = 2e-3
    warmup: int = 30
    seed: int = 0
    threads: int = 0
    init: str = ""                      # a draft folder to go on distilling (else a fresh draft)


def run(cfg: DistillConfig) -> dict:
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    work = Path(cfg.work)
    work.mkdir(parents=True, exist_ok=True)
    teacher_path = catalog.resolve(cfg.teacher)
    tokenizer = load_tokenizer(teacher_path)
    chat, chat_heldout = (transcripts(cfg, teacher_path, split) for split in ("train", "heldout"))
    chat = np.concatenate([chat, self_transcripts(cfg, teacher_path)])
    code, code_heldout = code_tokens(cfg, tokenizer, cfg.code_chars, cfg.code_chars // 15)
    code = np.concatenate([code, code_continuations(cfg, teacher_path, code)])
    head = frequent_tokens([chat, code], cfg.head_tokens)
    teacher = load_model(teacher_path, torch.bfloat16, pack=False).requires_grad_(False)
    draft = load_model(cfg.init, pack=False).train().requires_grad_(True) if cfg.init else make_draft(teacher)
    train(cfg, teacher, draft, chat, code, head)
    return export(cfg, tokenizer, teacher, draft, {"chat": chat_heldout, "code": code_heldout}, head)


def transcripts(cfg: DistillConfig, teacher_path: Path, split: str) -> np.ndarray:
    """The teacher's answers to generated instructions, each with its prompt, as one token stream (cached)."""
    path = Path(cfg.work) / f"chat-{split}.npy"
    if path.exists():
        return np.load(path)
    from specmesh import LLM, SamplingParams
    count = cfg.instructions if split == "train" else cfg.heldout_instructions
    asks = instructions(count, split, seed=cfg.seed)
    llm = LLM(target=teacher_path, method="ar", dtype="bfloat16")
    # greedy answers (what the bench measures), and for training also sampled ones (more of the teacher's text)
    runs = [SamplingParams(max_new_tokens=cfg.answer_tokens)]
    if split == "train":
        runs.append(SamplingParams(max_new_tokens=cfg.answer_tokens, temperature=0.7, seed=cfg.seed))
    stream = np.concatenate([answers(llm, asks, params, split) for params in runs])
    np.save(path, stream)
    return stream


def self_transcripts(cfg: DistillConfig, teacher_path: Path) -> np.ndarray:
    """The teacher's greedy answers to instructions it wrote itself (cached); empty for a teacher without a
    chat template."""
    path = Path(cfg.work) / "chat-self.npy"
    if path.exists():
        return np.load(path)
    from specmesh import LLM, SamplingParams
    llm = LLM(target=teacher_path, method="ar", dtype="bfloat16")
    asks = self_instructions(llm, cfg.self_instructions, cfg.seed) if llm.tokenizer.chat_template else []
    stream = (answers(llm, asks, SamplingParams(max_new_tokens=cfg.answer_tokens), "self") if asks
              else np.zeros(0, np.int32))
    np.save(path, stream)
    return stream


def self_instructions(llm, count: int, seed: int) -> list[str]:
    """Instructions sampled from the teacher given its chat template up to the user's first word (the
    template's default system prompt included), each kept once."""
    from specmesh import SamplingParams
    prefix = llm.tokenizer.chat_prefix
    asks: dict[str, None] = {}
    bar = tqdm(total=count, desc="teacher instructions", unit="ask")
    n = min(64, 4 * count)                                  # samples a batch
    for batch in range(4 * count // n + 1):                 # gives up on a teacher that keeps repeating itself
        params = SamplingParams(n=n, max_new_tokens=64, temperature=1.0, seed=seed + n * batch)
        for sample in llm.generate(prefix, params).samples:
            ask = sample.text.strip()
            if sample.finish_reason == "eos" and len(ask) >= 12 and ask not in asks and len(asks) < count:
                asks[ask] = None                    # a whole turn, not a fragment, once
                bar.update()
        if len(asks) >= count:
            break
    bar.close()
    return list(asks)


def code_continuations(cfg: DistillConfig, teacher_path: Path, code: np.ndarray) -> np.ndarray:
    """Snippets of the training code (a line's start onwards, 64 to 256 tokens) each followed by the teacher's
    greedy continuation, as one token stream (cached)."""
    path = Path(cfg.work) / "code-self.npy"
    if path.exists():
        return np.load(path)
    from specmesh import LLM, SamplingParams
    llm = LLM(target=teacher_path, method="ar", dtype="bfloat16")
    newline = set(llm.tokenizer.encode("\n") + llm.tokenizer.encode("\n\n"))
    rng = np.random.default_rng(cfg.seed)
    prompts = []
    while len(prompts) < cfg.code_continuations:
        start, length = rng.integers(0, len(code) - 256), rng.integers(64, 257)
        lines = [i + 1 for i in range(start, start + 64) if int(code[i]) in newline]
        if lines:
            prompts.append([int(t) for t in code[lines[0]:start + length]])
    stream = continued(llm, prompts, SamplingParams(max_new_tokens=cfg.continuation_tokens),
                       "teacher continuations (code)")
    np.save(path, stream)
    return stream


def answers(llm, asks: list[str], params, split: str) -> np.ndarray:
    """Each instruction in the chat template followed by the teacher's answer, as one token stream."""
    tok = llm.tokenizer
    prompts = [tok.encode(tok.render_chat([{"role": "user", "content": a}]) if tok.chat_template else a + "\n\n")
               for a in asks]
    return continued(llm, prompts, params, f"teacher answers ({split})")


def continued(llm, prompts: list[list[int]], params, desc: str) -> np.ndarray:
    """Each prompt followed by what the teacher generates after it, as one token stream (64 prompts a batch)."""
    ids = []
    for start in tqdm(range(0, len(prompts), 64), desc=desc, unit="x64"):
        outs = llm.generate(prompts[start:start + 64], params)
        ids += [t for p, o in zip(prompts[start:start + 64], outs) for t in p + o.tokens]
    return np.array(ids, dtype=np.int32)


def code_tokens(cfg: DistillConfig, tokenizer, train_chars: int, heldout_chars: int):
    """Standard-library code in the teacher's tokens: a random sample of the training split's files, and of the
    held-out files (cached)."""
    work = Path(cfg.work)
    if (work / "code-train.npy").exists():
        return np.load(work / "code-train.npy"), np.load(work / "code-heldout.npy")
    train, heldout = corpus.split(corpus.stdlib_sources())
    eos = tokenizer.token_id("<|endoftext|>")              # a document separator, where the vocabulary has one
    out = []
    for files, chars, name in ((train, train_chars, "train"), (heldout, heldout_chars, "heldout")):
        random.Random(cfg.seed).shuffle(files)
        texts, total = [], 0
        for _, text in files:
            texts.append(text)
            total += len(text)
            if total >= chars:
                break
        ids = [t for enc in tokenizer.inner.encode_batch(texts, add_special_tokens=False)
               for t in enc.ids + ([eos] if eos is not None else [])]
        out.append(np.array(ids, dtype=np.int32))
        np.save(work / f"code-{name}.npy", out[-1])
    return tuple(out)


def make_draft(teacher: Transformer) -> Transformer:
    t = teacher.config
    cfg = ModelConfig(vocab_size=t.vocab_size, max_position_embeddings=t.max_position_embeddings,
                      rms_norm_eps=t.rms_norm_eps, rope_theta=t.rope_theta, tie_word_embeddings=True,
                      bos_token_id=t.bos_token_id, eos_token_id=t.eos_token_id, **DRAFT)
    draft = Transformer(cfg)
    init_weights(draft)
    E = teacher.embed.weight.float()                          # [V, D]: the teacher's tied embedding
    _, _, Vh = torch.linalg.svd(E[torch.randperm(len(E), generator=torch.Generator().manual_seed(0))[:16384]],
                                full_matrices=False)
    k = min(DRAFT["hidden_size"], len(Vh))                    # a teacher narrower than 256: the rest stays random
    draft.embed.weight.data[:, :k] = E @ Vh[:k].T             # [V, k]
    draft.lm_head.weight = draft.embed.weight
    return draft


def windows(stream: np.ndarray, count: int, length: int, rng: np.random.Generator) -> torch.Tensor:
    starts = rng.integers(0, len(stream) - length, count)
    return torch.from_numpy(np.stack([stream[s:s + length] for s in starts]).astype(np.int64))


def train(cfg: DistillConfig, teacher: Transformer, draft: Transformer, chat: np.ndarray, code: np.ndarray,
          head: np.ndarray | None = None) -> None:
    """KL(teacher ‖ draft) over the `head` tokens' logits (all tokens without one), each renormalised there."""
    ids = None if head is None else torch.from_numpy(head.astype(np.int64))
    opt = optimizer(draft, cfg.lr)
    ckpt = Path(cfg.work) / "draft.pt"
    step0 = resume(ckpt, draft=draft, opt=opt)
    rng = np.random.default_rng(cfg.seed + step0)
    bar = tqdm(range(step0, cfg.steps), initial=step0, total=cfg.steps, desc="distill", unit="step")
    t0 = time.time()
    for step in bar:
        set_lr(opt, cfg.lr * lr_factor(step, cfg.steps, cfg.warmup))
        x = torch.cat([windows(chat, cfg.batch // 2, cfg.window, rng),
                       windows(code, cfg.batch - cfg.batch // 2, cfg.window, rng)])
        with mixed_precision():
            with torch.no_grad():
                lt = teacher(x, batch=Batch(head=ids)).flatten(0, 1)         # [N, K]
            ld = draft(x, batch=Batch(head=ids)).flatten(0, 1)
        if step == 0 and not cfg.init:      # a fresh draft's logits are too sharp: match the teacher's spread
            scale = (lt.float().std() / ld.float().std()).item()
            draft.norm.weight.data.mul_(scale)
            ld = ld * scale
        kl = distill_step(draft, opt, lt, ld)
        tps = (step + 1 - step0) * x.numel() / (time.time() - t0)
        bar.set_postfix(kl=f"{kl:.3f}", tok_s=f"{tps:.0f}")
        if (step + 1) % 20 == 0 or step + 1 == cfg.steps:
            checkpoint(ckpt, step + 1, draft=draft, opt=opt)


@torch.no_grad()
def agreement(teacher: Transformer, draft: Transformer, stream: np.ndarray, length: int = 512, count: int = 16,
              head: np.ndarray | None = None) -> dict:
    """Greedy next-token agreement with the teacher and both models' cross-entropy (nats/token) on `stream`;
    with `head` (sorted token ids) also the agreement of the draft's head restricted to them, whose logits are
    the full head's at those tokens (Transformer.restrict_head)."""
    length = min(length, len(stream))
    n = min(count, len(stream) // length)
    x = torch.from_numpy(stream[:n * length].reshape(n, length).astype(np.int64))
    lt, ld = teacher(x)[:, :-1].float(), draft(x)[:, :-1].float()
    y, top = x[:, 1:], lt.argmax(-1)
    out = {"tokens": int(y.numel()), "greedy_agreement": (top == ld.argmax(-1)).float().mean().item(),
           "teacher_ce": F.cross_entropy(lt.flatten(0, 1), y.flatten()).item(),
           "draft_ce": F.cross_entropy(ld.flatten(0, 1), y.flatten()).item()}
    if head is not None:
        ids = torch.from_numpy(head.astype(np.int64))
        restricted = ids[ld[..., ids].argmax(-1)]                  # the best of the head's tokens
        out |= {"head_tokens": len(ids), "head_greedy_agreement": (top == restricted).float().mean().item()}
    return out


def frequent_tokens(streams: list[np.ndarray], k: int) -> np.ndarray | None:
    """The k most frequent tokens of the training streams (each stream weighted alike), or None for all."""
    vocab = max(int(s.max()) for s in streams) + 1
    counts = sum(np.bincount(s, minlength=vocab) / len(s) for s in streams)
    return None if not k or k >= vocab else np.sort(np.argsort(-counts, kind="stable")[:k])


def export(cfg: DistillConfig, tokenizer, teacher: Transformer, draft: Transformer,
           heldout: dict[str, np.ndarray], head: np.ndarray | None = None) -> dict:
    """The draft in 16 bits with the teacher's tokenizer and chat template, the tokens its head computes
    (HEAD_TOKENS), and its metrics: agreement and cross-entropy with the full head, and the agreement of
    the restricted head (what decoding uses)."""
    out = Path(cfg.out)
    save_model(draft, out, dtype=torch.bfloat16)
    tokenizer.inner.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps(tokenizer.config, indent=2) + "\n")
    teacher, draft = teacher.float(), draft.float()
    if head is not None:
        save_file({"ids": torch.from_numpy(head.astype(np.int64))}, out / HEAD_TOKENS)
    metrics = {name: agreement(teacher, draft, stream, head=head) for name, stream in heldout.items()}
    metrics["recipe"] = asdict(cfg)
    (out / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
    print(json.dumps(metrics, indent=2), flush=True)
    return metrics
