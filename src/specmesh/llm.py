"""The Python API: `LLM(...).generate(prompts, SamplingParams(...))`.

`generate` runs the engine (engine/engine.py) to completion in this process, as offline batched
inference: a list of prompts (and the n samples of each) decode as one batch, each sequence with
its own parameters and seeded generator; every result equals what the prompt gives alone.
"""
from __future__ import annotations

import numbers
import os
import sys
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

import torch
from tqdm import tqdm

from specmesh import catalog, methods, tuning
from specmesh.engine.engine import Engine
from specmesh.engine.sequence import Output, Sequence
from specmesh.methods import Models
from specmesh.model.loader import DTYPES, load_model, load_tokenizer
from specmesh.proposers.remote_drafter import DrafterPool
from specmesh.runtime import tensor_parallel
from specmesh.spec.sampling import SamplingParams

Prompt = str | list[int]        # text, or token ids

MAX_BATCH = 16                  # sequences decoded together by default


class VocabularyMismatchError(ValueError):
    pass


def default_dtype(device: str | torch.device = "cpu") -> str:
    """`auto`'s dtype: $SPECMESH_DTYPE where set (the test suite sets float32); else bfloat16 on a CPU whose bf16
    products run fast here (specmesh's kernels, x86 with AVX2, or native bf16), where they compute a row alike in
    any batch, so every method still gives `ar`'s tokens (docs/kernels.md); else float32, the exact reference (on a
    GPU bf16 products round by the batch's shape)."""
    if chosen := os.environ.get("SPECMESH_DTYPE"):
        if chosen not in DTYPES:
            raise ValueError(f"$SPECMESH_DTYPE must be one of {', '.join(DTYPES)}, got {chosen!r}")
        return chosen
    if torch.device(device).type != "cpu":
        return "float32"
    from specmesh.kernels.build import avx2_lib, native_bf16
    return "bfloat16" if avx2_lib() is not None or native_bf16() else "float32"


def resolve_dtype(dtype: str | torch.dtype, device: str | torch.device = "cpu") -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        if dtype not in DTYPES.values():
            raise ValueError(f"dtype {dtype} is not one a model runs in; choose from auto, {', '.join(DTYPES)}")
        return dtype
    if dtype == "auto":
        dtype = default_dtype(device)
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; choose from auto, {', '.join(DTYPES)}")
    return DTYPES[dtype]


def resolve_device(device: str | torch.device) -> torch.device:
    """cpu, cuda, cuda:N (or mps), where this PyTorch can run it."""
    try:
        d = torch.device(device)
    except RuntimeError:
        raise ValueError(f"unknown device {device!r}; use cpu, cuda or cuda:N") from None
    if d.type not in ("cpu", "cuda", "mps") or d.type == "mps" and not torch.backends.mps.is_available():
        raise ValueError(f"device {device!r}: not one this PyTorch runs here; use cpu, cuda or cuda:N")
    if d.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device!r}: this PyTorch ({torch.__version__}) sees no CUDA GPU")
    if d.type == "cuda" and d.index is not None and d.index >= torch.cuda.device_count():
        raise ValueError(f"device {device!r}: this machine has {torch.cuda.device_count()} CUDA GPU(s)")
    return d


class LLM:
    """A target (and, for speculative methods, a draft) ready to generate.

    LLM() uses SmolLM2-135M-Instruct with its draft (LLM(target="embedded"): the 28M pair shipped here);
    LLM(target=..., draft=..., method="sd") yours: a name from
    `specmesh models`, a HuggingFace folder or a GGUF file (a known target brings its draft).
    Method options (gamma=4, tree_width=4, ...) go to the methods that have them; cosine's `drafters` may be a list.
    `max_batch`: sequences decoded together (the multi-process methods take one at a time).
    `tp=N`: the target split over N processes (tensor parallelism, runtime/tensor_parallel.py), for the
    methods that run in one process (ar, sd, tree, easyspec, cosine, selfdraft); drafts stay on rank 0.
    method="auto" (the default): the fastest lossless method for this machine, pair and dtype
    (tuning.py; measured once, then cached); `self.choice` says what it chose and why. `retune`:
    True measures again on the shipped calibration prompts, a list of texts on those. `quant="int8"` (or "int4"):
    target and draft quantized at load (model/quant.py); every method is lossless against that model.
    """

    running: Engine | None = None       # a multi-process method's last engine: its processes serve one at a time

    def __init__(self, target: str | Path | None = None, draft: str | Path | None = None, method: str = "auto",
                 device: str = "cpu", dtype: str | torch.dtype = "auto", max_batch: int = MAX_BATCH,
                 quant: str | None = None, retune: bool | list[str] = False, tp: int = 1, **options):
        auto = method == "auto"
        if isinstance(options.get("drafters"), (list, tuple)):     # cosine's drafters as Python names them
            options["drafters"] = ",".join(map(str, options["drafters"]))
        self.method = methods.get("ar" if auto else method, options)
        check_tp(tp, method, self.method)
        self.choice: tuning.Choice | None = None
        self.by_kind: dict[str, methods.Configured] = {}      # auto: the method for each kind of prompt
        if not isinstance(retune, bool) and not (isinstance(retune, list) and all(isinstance(t, str) for t in retune)):
            raise TypeError(f"retune is True, False or a list of calibration texts, got {retune!r:.60}")
        if isinstance(max_batch, bool) or not isinstance(max_batch, int) or max_batch < 1:
            raise ValueError(f"max_batch must be a positive integer, got {max_batch!r}")
        self.max_batch = max_batch
        self.device = resolve_device(device)
        self.dtype = resolve_dtype(dtype, self.device)
        target = catalog.resolve(target)
        self.tokenizer = load_tokenizer(target)
        self.models = Models(load_model(target, self.dtype, self.device, quant=quant,
                                        part=(0, tp) if tp > 1 else None), target_path=target,
                             tokenizer=self.tokenizer)
        if draft is None and (self.method.needs_draft or auto):
            draft = catalog.draft_for(target)
            if draft is None and self.method.needs_draft:
                raise ValueError(f"method {self.method.name} needs a draft model and {target} has none here: "
                                 f"pass draft=... (--draft)")
        elif draft is not None:
            draft = catalog.resolve(draft, "draft")
        if draft is not None:
            check_vocabularies(self.tokenizer, load_tokenizer(draft), target, Path(draft))
            if not auto:            # the draft's own defaults (catalog.pair_options) under the caller's options
                self.method = methods.get(method, options, catalog.pair_options(Path(draft)).get(method))
        if self.method.spec.start:          # other processes: pearl's draft, a pipeline's stages
            self.method.spec.start(self.models, None if draft is None else Path(draft), self.dtype,
                                   self.method.options)
        elif draft is not None:
            self.models.draft = load_model(draft, self.dtype, self.device, draft=True, quant=quant)
        if self.method.spec.needs_drafters:
            self._load_drafters(target, quant)
        if self.method.spec.check:
            self.method.spec.check(self.models, self.method.options)
        if tp > 1:      # the other ranks, each with its shard of the target (runtime/tensor_parallel.py)
            spread = self.method.spec.spread_draft and draft is not None
            self.models.remote = tensor_parallel.start(
                self.models.target, Path(target), self.dtype, quant, tp,
                options.get("timeout") or tensor_parallel.TIMEOUT_S,
                self.models.draft if spread else None, Path(draft) if spread else None)
        if auto:
            self.choice = tuning.choose(self, None if draft is None else Path(draft), bool(retune),
                                        retune if isinstance(retune, list) else None)
            if self.choice.candidates:                  # there was something to choose from
                print(self.choice.summary(), file=sys.stderr, flush=True)
            given = {k: v for k, v in options.items() if v is not None}
            self.method = methods.get(self.choice.method, self.choice.options | given)
            self.by_kind = {kind: methods.get(c.method, c.options | given) for kind, c in self.choice.kinds.items()}

    def _load_drafters(self, target: Path, quant: str | None) -> None:
        """cosine's drafters: here, or each in a process of its own (proposers/remote_drafter.py)."""
        o = self.method.options
        paths, self.models.context_drafter = catalog.drafters_for(target, o["drafters"])
        for path in paths:
            check_vocabularies(self.tokenizer, load_tokenizer(path), target, path, "drafter (in --drafters)")
        if o["drafter_processes"]:
            self.models.remote = DrafterPool.start(paths, self.dtype, str(self.device), quant, o["draft_window"],
                                                   o["timeout"])
        else:
            self.models.drafters = [load_model(p, self.dtype, self.device, draft=True, quant=quant) for p in paths]
        self.models.drafter_names = [catalog.name_of(p) for p in paths] + [catalog.CONTEXT] * \
            self.models.context_drafter

    def close(self) -> None:
        """Stop the method's other processes, if it has any (pearl's draft rank, a pipeline's stages)."""
        self.models.close()

    @property
    def closed(self) -> bool:
        """A multi-process method's processes are stopped (close): it decodes no more."""
        return self.method.spec.start is not None and self.models.remote is None

    def __enter__(self) -> "LLM":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def context(self) -> int:
        return self.models.target.config.max_position_embeddings

    def encode(self, prompt: Prompt) -> list[int]:
        if isinstance(prompt, str):
            if not prompt:
                raise ValueError("prompt is empty")
            return self.tokenizer.encode(prompt)
        if not isinstance(prompt, (list, tuple)):
            raise TypeError(f"a prompt is text or a list of token ids, got {type(prompt).__name__}")
        return list(prompt)

    def method_for(self, prompts: list[list[int]]) -> methods.Configured:
        """The method these prompts run with: `auto`'s choice for their kind (chat or text, tuning.prompt_kind)
        where it chose by kind and they are all of one kind, else the method."""
        kinds = {tuning.prompt_kind(self.tokenizer, p) for p in prompts} if self.by_kind else set()
        return self.by_kind.get(kinds.pop(), self.method) if len(kinds) == 1 else self.method

    def engine(self, prompts: list[list[int]], params: SamplingParams, rows: int | None = None) -> Engine:
        """An engine sized for these prompts: its cache rows hold the longest prompt plus its new tokens."""
        if self.closed:
            raise RuntimeError(f"this LLM was closed: {self.method.name}'s processes are stopped; make a new LLM")
        if self.running is not None and not self.running.idle:
            raise RuntimeError(f"{self.method.name} runs one request at a time in its processes, and a stream of this "
                               f"LLM is still open: read it to its end (or close it) first")
        method = self.method_for(prompts)
        longest = max(len(p) for p in prompts)
        if longest < self.context < longest + params.max_new_tokens:     # (a prompt that fills it: an error)
            warnings.warn(f"max_new_tokens {params.max_new_tokens} runs past the context of {self.context} tokens: "
                          f"after a prompt of {longest} generation stops at {self.context - longest} new tokens",
                          stacklevel=3)
        max_len = min(self.context, longest + params.max_new_tokens) + method.slack
        rows = rows or min(self.max_batch, len(prompts) * params.n)
        engine = Engine(self.models, method, self.tokenizer, rows, max_len)
        if method.spec.start is not None:
            self.running = engine
        return engine

    def generate(self, prompts: Prompt | list[Prompt], params: SamplingParams | None = None
                 ) -> Output | list[Output]:
        """One prompt -> its Output; a list (or tuple) of prompts -> a list of Outputs, in order."""
        params = checked(params)
        batch = is_batch(prompts)
        if batch and any(isinstance(p, numbers.Integral) for p in prompts):
            raise TypeError("prompts mix text and token ids: a batch is a list of prompts, each text or a list of ids "
                            "(one prompt of ids is a list of ints)")
        if isinstance(prompts, (list, tuple)) and not prompts:
            raise ValueError("no prompts: give a prompt, or a non-empty list of them")
        ids = [self.encode(p) for p in (prompts if batch else [prompts])]
        engine = self.engine(ids, params)
        requests = [engine.sequences(i, params) for i in ids]
        start = time.perf_counter()
        for seqs in requests:                   # a prompt a request: the batch shares the rows as the server's clients
            engine.submit(seqs)
        try:
            while not engine.idle:
                engine.step()
        except BaseException:
            engine.abandon()
            raise
        elapsed = time.perf_counter() - start
        outputs = [Output.of(seqs, elapsed) for seqs in requests]
        return outputs if batch else outputs[0]

    def stream(self, prompt: Prompt, params: SamplingParams | None = None, progress: bool = False) -> "Stream":
        """Iterate for the first sample's text as it grows; `.output` holds the result afterwards. `progress`: once
        the first sample is done, a bar on stderr counts the others (n samples in waves of max_batch)."""
        params = checked(params)
        if is_batch(prompt):
            raise TypeError("stream takes one prompt (text, or a list of token ids); for a batch use generate")
        ids = self.encode(prompt)
        engine = self.engine([ids], params)
        return Stream(engine, engine.sequences(ids, params), progress)

    def chat(self, messages: list[dict], params: SamplingParams | None = None) -> Output:
        """The assistant's answer to `messages` ([{"role": "user", "content": ...}, ...]) through the model's chat
        template; it ends at the model's end of turn."""
        return self.generate(self.tokenizer.render_chat(messages), params)


def checked(params: SamplingParams | None) -> SamplingParams:
    if params is None:
        return SamplingParams()
    if not isinstance(params, SamplingParams):
        raise TypeError(f"params must be a SamplingParams (SamplingParams(max_new_tokens=...)), "
                        f"got {type(params).__name__}")
    params.validate()
    return params


class Stream:
    def __init__(self, engine: Engine, seqs: list[Sequence], progress: bool = False):
        self.engine, self.seqs, self.progress = engine, seqs, progress
        self.output: Output | None = None

    def __iter__(self) -> Iterator[str]:
        first = self.seqs[0]
        start = time.perf_counter()
        self.engine.submit(self.seqs)
        bar = None
        try:
            while not self.engine.idle:
                self.engine.step()
                piece = first.stream_piece()
                if piece:
                    yield piece
                if self.progress and first.done:
                    done = sum(seq.done for seq in self.seqs)
                    bar = bar or tqdm(total=len(self.seqs), desc="samples", unit="sample", file=sys.stderr)
                    bar.update(done - bar.n)
        except BaseException:                   # a failure, or the consumer stopped early (GeneratorExit)
            self.engine.abandon()
            raise
        finally:
            if bar is not None:
                bar.close()
        self.output = Output.of(self.seqs, time.perf_counter() - start)
        piece = first.stream_piece()
        if piece:
            yield piece


def is_batch(prompts) -> bool:
    """A list (or tuple) of prompts, not one prompt of token ids."""
    return isinstance(prompts, (list, tuple)) and bool(prompts) and not isinstance(prompts[0], numbers.Integral)


def check_tp(tp: int, name: str, method: methods.Configured) -> None:
    if not isinstance(tp, int) or tp < 1:
        raise ValueError(f"tp must be a positive integer, got {tp!r}")
    if tp > 1 and name == "auto":
        raise ValueError("--tp needs a method (auto measures one process only): "
                         "--method ar, sd, tree, easyspec, cosine or selfdraft")
    if tp > 1 and method.options.get("drafter_processes"):
        raise ValueError("cosine's --drafter-processes and --tp cannot go together yet: choose one")
    if tp > 1 and method.spec.start is not None:
        raise ValueError(f"{method.name} runs its own processes and cannot split the target with --tp; "
                         f"--tp is for ar, sd, tree, easyspec, cosine and selfdraft")


def check_vocabularies(target_tok, draft_tok, target: Path, draft: Path, role: str = "draft") -> None:
    if target_tok.inner.get_vocab() != draft_tok.inner.get_vocab():
        raise VocabularyMismatchError(
            f"{role} {draft} and target {target} have different vocabularies "
            f"({draft_tok.vocab_size} vs {target_tok.vocab_size} tokens); speculative decoding needs one tokenizer")
