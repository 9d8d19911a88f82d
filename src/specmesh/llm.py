"""The Python API: `LLM(...).generate(prompts, SamplingParams(...))`.

An `LLM` keeps one engine (engine/engine.py) per method it runs, built on the first request and sized once
as the server sizes its own (engine/sizing.py); `generate`, `stream` and `chat` submit requests to it and step
it until theirs are done, as offline batched inference: a list of prompts (and the n samples of each) decode as
one batch, each sequence with its own parameters and seeded generator; every result equals what the prompt
gives alone.
"""
from __future__ import annotations

import numbers
import sys
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

import torch
from tqdm import tqdm

from specmesh import catalog, methods, tuning
from specmesh.engine import sizing
from specmesh.engine.engine import Engine
from specmesh.engine.sequence import Output, Sequence
from specmesh.lossless.sampling import SamplingParams
from specmesh.methods import Models
from specmesh.methods import get as get_method
from specmesh.model.loader import DTYPES, load_model, load_tokenizer, vocabulary
from specmesh.options import CARDS, method_names
from specmesh.settings import settings

Prompt = str | list[int]        # text, or token ids


class VocabularyMismatchError(ValueError):
    pass


def default_dtype(device: str | torch.device = "cpu") -> str:
    """`auto`'s dtype: $SPECMESH_DTYPE where set (the test suite sets float32); else bfloat16 on a CPU whose bf16
    products run fast here (specmesh's kernels, x86 with AVX2, or native bf16), where they compute a row alike in
    any batch, so every method still gives `ar`'s tokens (docs/kernels.md); else float32, the exact reference (on a
    GPU bf16 products round by the batch's shape)."""
    if chosen := settings().dtype:
        return chosen
    if torch.device(device).type != "cpu":
        return "float32"
    from specmesh.kernels.build import kernel_lib, native_bf16
    return "bfloat16" if kernel_lib() is not None or native_bf16() else "float32"


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
    `max_batch`, `max_len`, `max_kv_mb`: the engine's rows (sequences decoded together; the multi-process methods
    take one at a time), the tokens a row holds and their KV cache's bound (engine/sizing.py: by default up to 16
    rows of the target's full context within a quarter of the memory available).
    `tp=N`: the target split over N processes (tensor parallelism, runtime/tensor_parallel.py), for the
    methods that run in one process (ar, sd, tree, easyspec, cosine, selfdraft, suffix); drafts stay on rank 0.
    method="auto" (the default): the fastest lossless method for this machine, pair and dtype (specmesh.tuning): the
    cached calibration, else the default for this CPU's kind; `tune()` calibrates (about 20 s) and caches it. The
    constructor generates nothing. `self.choice` says what it chose and why. `methods=["ar", "sd", "suffix"]`: one
    engine runs them all, each prompt naming its own (`generate(..., method=...)`, default the first), rows of
    each in one step (methods/mixed.py). `quant="int8"` (or "int4"):
    target and draft quantized at load (model/quant.py); every method is lossless against that model.
    """

    def __init__(self, target: str | Path | None = None, draft: str | Path | None = None, method: str = "auto",
                 device: str = "cpu", dtype: str | torch.dtype = "auto", max_batch: int | None = None,
                 quant: str | None = None, tp: int = 1, max_len: int | None = None, max_kv_mb: float | None = None,
                 methods: str | list[str] | None = None, **options):
        names = method_names(methods)
        if names and method == "auto":
            method = names[0]
        elif names and method not in names:
            raise ValueError(f"method {method!r} is not among methods {', '.join(names)}")
        self.names = names
        self.auto = method == "auto"
        if isinstance(options.get("drafters"), (list, tuple)):     # cosine's drafters as Python names them
            options["drafters"] = ",".join(map(str, options["drafters"]))
        self.given = {k: v for k, v in options.items() if v is not None}
        self.method = get_method("ar" if self.auto else method, options)
        check_tp(tp, method, self.method)
        for name, value in (("max_batch", max_batch), ("max_len", max_len)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if max_kv_mb is not None and not max_kv_mb > 0:
            raise ValueError(f"max_kv_mb must be a number of MB > 0, got {max_kv_mb!r}")
        self.sizes = dict(max_batch=max_batch, max_len=max_len, max_kv_mb=max_kv_mb)
        self.engines: dict[tuple, Engine] = {}          # one long-lived engine per method run (engine_for)
        self.choice: tuning.Choice | None = None
        self.by_kind: dict[str, methods.Configured] = {}      # auto: the method for each kind of prompt
        self.device = resolve_device(device)
        self.dtype = resolve_dtype(dtype, self.device)
        self.quant = quant
        target = catalog.resolve(target)
        self.tokenizer = load_tokenizer(target)
        self.models = Models(load_model(target, self.dtype, self.device, quant=quant,
                                        part=(0, tp) if tp > 1 else None), target_path=target,
                             tokenizer=self.tokenizer)
        self.draft_path = self._draft_path(target, draft)
        pair = catalog.pair_options(self.draft_path) if self.draft_path is not None else {}
        if self.draft_path is not None and not self.auto:   # the draft's own defaults under the caller's options
            self.method = get_method(method, options, pair.get(method))
        # the methods a request may choose among, all in one engine (methods/mixed.py); [] for one method
        self.mix = [self.method if name == method else get_method(name, options, pair.get(name)) for name in names]
        if any(m.needs_draft for m in self.mix):
            self.load_draft()
        if self.method.spec.start:          # other processes: pearl's draft, a pipeline's stages
            self.method.spec.start(self.models, self.draft_path, self.dtype, self.method.config)
        elif not self.auto:
            self.load_draft()
        if self.method.spec.needs_drafters:
            self._load_drafters(target, quant)
        if self.method.spec.check:
            self.method.spec.check(self.models, self.method.config)
        if tp > 1:      # the other ranks, each with its shard of the target (runtime/tensor_parallel.py)
            from specmesh.runtime import tensor_parallel
            spread = self.method.spec.spread_draft and self.draft_path is not None
            self.models.remote = tensor_parallel.start(
                self.models.target, Path(target), self.dtype, quant, tp,
                options.get("timeout") or tensor_parallel.TIMEOUT_S,
                self.models.draft if spread else None, self.draft_path if spread else None)
        if self.auto:                       # the cached calibration, else this CPU kind's default: nothing runs
            self._use(tuning.choose(self))
        elif self.mix:                      # what a request naming "auto" chooses among the mix by (auto_method)
            self.choice = tuning.choose(self)

    def _draft_path(self, target: Path, draft: str | Path | None) -> Path | None:
        """The draft given (checked: its vocabulary is the target's), or the one a known target brings where the
        method (or auto) may use one."""
        needing = [name for name in [self.method.name, *self.names] if CARDS[name].needs_draft]
        if draft is None and (needing or self.auto):
            draft = catalog.draft_for(target)
            if draft is None and needing:
                raise ValueError(f"method {needing[0]} needs a draft model and {target} has none here: "
                                 f"pass draft=... (--draft)")
        elif draft is not None:
            draft = catalog.resolve(draft, "draft")
        if draft is not None:
            check_vocabularies(target, Path(draft))
        return None if draft is None else Path(draft)

    def load_draft(self) -> None:
        """The draft model, once, where there is one (auto loads it when its choice, or `tune`, needs it)."""
        if self.draft_path is not None and self.models.draft is None:
            self.models.draft = load_model(self.draft_path, self.dtype, self.device, draft=True, quant=self.quant)

    def tune(self, prompts: list[str] | None = None, remeasure: bool = False, progress: bool = True
             ) -> tuning.Choice:
        """`auto`'s calibration (specmesh.tuning): measure this machine and pair (at most about 20 s on 2 cores, a progress
        bar on stderr), cache the choice and use it from now on. A cached choice is taken as it is unless
        `remeasure`, or `prompts` (texts to calibrate on instead of the shipped ones)."""
        if not (self.auto or self.mix):
            raise ValueError(f"tune chooses auto's method; this LLM runs {self.method.name} (method='auto' tunes)")
        if prompts is not None and not (isinstance(prompts, list) and prompts and all(isinstance(p, str) and p
                                                                                         for p in prompts)):
            raise TypeError(f"prompts must be a non-empty list of texts, got {prompts!r:.60}")
        self.load_draft()
        choice = tuning.choose(self, measure=True, remeasure=remeasure or prompts is not None, prompts=prompts,
                               progress=progress)
        if self.auto:
            self._use(choice)
        else:                               # a request's "auto" among the methods of `methods=` (auto_method)
            self.choice = choice
            print(choice.summary(), file=sys.stderr, flush=True)
        return self.choice

    def _use(self, choice: tuning.Choice) -> None:
        """Run auto's `choice` from now on (the caller's options over its own); its draft loaded if it needs one."""
        self.choice = choice
        if choice.candidates:               # measured (a default says so on its first request)
            print(choice.summary(), file=sys.stderr, flush=True)
        self.method = methods.get(choice.method, choice.options | self.given)
        self.by_kind = {kind: methods.get(c.method, c.options | self.given) for kind, c in choice.kinds.items()}
        if any(m.needs_draft for m in (self.method, *self.by_kind.values())):
            self.load_draft()
        self.engines.clear()                # the last choice's engines, with the cache pages they wrote

    def _load_drafters(self, target: Path, quant: str | None) -> None:
        """cosine's drafters: here, or each in a process of its own (proposers/remote_drafter.py)."""
        o = self.method.config
        paths, self.models.context_drafter = catalog.drafters_for(target, o.drafters)
        for path in paths:
            check_vocabularies(target, path, "drafter (in --drafters)")
        if o.drafter_processes:
            from specmesh.proposers.remote_drafter import DrafterPool
            self.models.remote = DrafterPool.start(paths, self.dtype, str(self.device), quant, o.draft_window,
                                                   o.timeout)
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
        """Tokens a sequence may reach (prompt and new tokens): the target's context, or less where the engine's
        KV cache bound cuts it (engine/sizing.py)."""
        return self.engine_for(self.method).context

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

    def auto_method(self, ids: list[int]) -> str:
        """The method of `methods=` a prompt naming "auto" runs: auto's choice for its kind of prompt (chat or text;
        calibrated, else this CPU kind's default) where this LLM runs it, else the fastest calibrated candidate it
        runs, else `ar`, else its first method. Each method's own depth policy then drafts less, down to nothing,
        as the batch widens (methods/speculative.py, depth_by_width)."""
        choice = self.choice.kinds.get(tuning.prompt_kind(self.tokenizer, ids), self.choice)
        ranked = [choice.method, *(c.method for c in sorted(choice.candidates, key=lambda c: c.ms_per_token)
                                   if c.reason.endswith("measured")), "ar"]
        return next((m for m in ranked if m in self.names), self.names[0])

    def engine_for(self, method: methods.Configured | list[methods.Configured], **serving) -> Engine:
        """The engine that runs `method`, built on its first request and kept: sized once by the server's rule
        (engine/sizing.py: full-context rows within the KV cache bound), taking requests (`submit`) and stepping
        (`step`) for every later `generate`, `stream` and `chat`. `serving`: the server's own Engine settings (its
        prefix cache, prefill share), given where it builds it. A list of methods: one engine running them all,
        each request naming its own (`methods=`)."""
        if self.closed:
            raise RuntimeError(f"this LLM was closed: {self.method.name}'s processes are stopped; make a new LLM")
        several = method if isinstance(method, list) else [method]
        key = tuple((m.name, repr(sorted(m.options.items())), m.given) for m in several)
        if key not in self.engines:
            size = sizing.size(self.models, max(m.slack for m in several), **self.sizes)
            self.engines[key] = methods.engine(self.models, method, self.tokenizer, size.rows, size.max_len, **serving)
            if len(several) > 1:
                self.engines[key].choose = self.auto_method
        return self.engines[key]

    def _requests(self, ids: list[list[int]], params: SamplingParams, method: str | list[str | None] | None = None
                  ) -> tuple[Engine, list[list[Sequence]]]:
        """These prompts' engine and their requests (a prompt's n samples each), each prompt decoded by its `method`
        (one for all, or one a prompt; with `methods=`, any of them; else the LLM's own)."""
        if self.auto and self.choice.default_for and not self.engines:
            print(self.choice.summary(), file=sys.stderr, flush=True)
        chosen = method if isinstance(method, list) else [method] * len(ids)
        if not self.mix:                    # "auto": this LLM's own choice
            chosen = [None if m == "auto" else m for m in chosen]
        if len(chosen) != len(ids):
            raise ValueError(f"method: {len(chosen)} methods for {len(ids)} prompts (one a prompt, or one for all)")
        if self.mix:
            engine = self.engine_for(self.mix)
        elif any(m not in (None, self.method.name) for m in chosen):
            raise ValueError(f"method {next(m for m in chosen if m not in (None, self.method.name))!r}: this LLM runs "
                             f"{self.method.name} (LLM(methods=[...]) lets each prompt choose)")
        else:
            engine, chosen = self.engine_for(self.method_for(ids)), [None] * len(ids)
        longest = max(len(p) for p in ids)
        if longest < engine.context < longest + params.max_new_tokens:     # (a prompt that fills it: an error)
            cut = "" if engine.context == self.models.target.config.max_position_embeddings else \
                " (the KV cache bound's: max_len, max_kv_mb)"
            warnings.warn(f"max_new_tokens {params.max_new_tokens} runs past the context of {engine.context} tokens"
                          f"{cut}: after a prompt of {longest} generation stops at {engine.context - longest} new "
                          f"tokens", stacklevel=3)
        return engine, [engine.sequences(i, params, m) for i, m in zip(ids, chosen)]

    def generate(self, prompts: Prompt | list[Prompt], params: SamplingParams | None = None,
                 method: str | list[str] | None = None) -> Output | list[Output]:
        """One prompt -> its Output; a list (or tuple) of prompts -> a list of Outputs, in order. `method`: with
        `LLM(methods=[...])`, the one of them every prompt runs, or a list of one a prompt (in one batch)."""
        params = checked(params)
        batch = is_batch(prompts)
        if batch and any(isinstance(p, numbers.Integral) for p in prompts):
            raise TypeError("prompts mix text and token ids: a batch is a list of prompts, each text or a list of ids "
                            "(one prompt of ids is a list of ints)")
        if isinstance(prompts, (list, tuple)) and not prompts:
            raise ValueError("no prompts: give a prompt, or a non-empty list of them")
        engine, requests = self._requests([self.encode(p) for p in (prompts if batch else [prompts])], params, method)
        elapsed = engine.complete(requests)     # a prompt a request: the batch shares the rows as the server's clients
        outputs = [Output.of(seqs, elapsed) for seqs in requests]
        return outputs if batch else outputs[0]

    def stream(self, prompt: Prompt, params: SamplingParams | None = None, progress: bool = False,
               method: str | None = None) -> "Stream":
        """Iterate for the first sample's text as it grows; `.output` holds the result afterwards. `progress`: once
        the first sample is done, a bar on stderr counts the others (n samples in waves of the engine's rows)."""
        params = checked(params)
        if is_batch(prompt):
            raise TypeError("stream takes one prompt (text, or a list of token ids); for a batch use generate")
        engine, (seqs,) = self._requests([self.encode(prompt)], params, method)
        return Stream(engine, seqs, progress)

    def chat(self, messages: list[dict], params: SamplingParams | None = None, method: str | None = None) -> Output:
        """The assistant's answer to `messages` ([{"role": "user", "content": ...}, ...]) through the model's chat
        template; it ends at the model's end of turn."""
        return self.generate(self.tokenizer.render_chat(messages), params, method)


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
            while not all(seq.done for seq in self.seqs):
                self.engine.step()
                piece = first.stream_piece()
                if piece:
                    yield piece
                if self.progress and first.done:
                    done = sum(seq.done for seq in self.seqs)
                    bar = bar or tqdm(total=len(self.seqs), desc="samples", unit="sample", file=sys.stderr)
                    bar.update(done - bar.n)
        except GeneratorExit:                   # the consumer stopped reading: these sequences end here
            self.engine.cancel(self.seqs)
            raise
        except BaseException:                   # a failure in a step: every sequence in flight
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
                         "--method ar, sd, tree, easyspec, cosine, selfdraft or suffix")
    if tp > 1 and method.options.get("drafter_processes"):
        raise ValueError("cosine's --drafter-processes and --tp cannot go together yet: choose one")
    if tp > 1 and method.spec.start is not None:
        raise ValueError(f"{method.name} runs its own processes and cannot split the target with --tp; "
                         f"--tp is for ar, sd, tree, easyspec, cosine, selfdraft and suffix")


def check_vocabularies(target: Path, draft: Path, role: str = "draft") -> None:
    """The draft's vocabulary is the target's (their fingerprints, cached per checkpoint: loader.vocabulary)."""
    if vocabulary(target) != vocabulary(draft):
        target_tok, draft_tok = load_tokenizer(target), load_tokenizer(draft)
        raise VocabularyMismatchError(
            f"{role} {draft} and target {target} have different vocabularies "
            f"({draft_tok.vocab_size} vs {target_tok.vocab_size} tokens); speculative decoding needs one tokenizer")
