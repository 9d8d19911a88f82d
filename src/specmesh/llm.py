"""The Python API: `LLM(...).generate(prompt, SamplingParams(...))`."""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import torch

from specmesh import embedded, methods
from specmesh.generation import Generation, Output
from specmesh.job import Models
from specmesh.loader import DTYPES, load_model, load_tokenizer
from specmesh.sampling import SamplingParams


class VocabularyMismatchError(ValueError):
    pass


def resolve_dtype(dtype: str | torch.dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; choose from {', '.join(DTYPES)}")
    return DTYPES[dtype]


class LLM:
    """A target (and, for speculative methods, a draft) ready to generate.

    LLM() uses the embedded target; LLM(target=DIR, draft=DIR, method="sd") uses yours.
    Method options (gamma=4, tree_width=4, ...) go to the methods that have them.
    """

    def __init__(self, target: str | Path | None = None, draft: str | Path | None = None, method: str = "ar",
                 device: str = "cpu", dtype: str | torch.dtype = "float32", **options):
        self.method = methods.get(method, options)
        self.dtype = resolve_dtype(dtype)
        self.device = torch.device(device)
        target = Path(target) if target else embedded.path("target")
        self.tokenizer = load_tokenizer(target)
        self.models = Models(load_model(target, self.dtype, self.device), target_path=target)
        if draft is None and self.method.needs_draft:
            draft = embedded.path("draft")
        if draft is not None:
            check_vocabularies(self.tokenizer, load_tokenizer(draft), target, Path(draft))
        if self.method.start:               # other processes: pearl's draft, a pipeline's stages
            self.method.start(self.models, None if draft is None else Path(draft), self.dtype, self.method.options)
        elif draft is not None:
            self.models.draft = load_model(draft, self.dtype, self.device, draft=True)

    def close(self) -> None:
        """Stop the method's other processes, if it has any (pearl's draft rank, a pipeline's stages)."""
        self.models.close()

    def __enter__(self) -> "LLM":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def context(self) -> int:
        return self.models.target.config.max_position_embeddings

    def encode(self, prompt: str | list[int]) -> list[int]:
        return self.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)

    def start(self, prompt: str | list[int], params: SamplingParams | None = None) -> Generation:
        params = params or SamplingParams()
        params.validate()
        if isinstance(prompt, str) and not prompt:
            raise ValueError("prompt is empty")
        return Generation(self.method, self.models, self.tokenizer, self.encode(prompt), params, self.context)

    def generate(self, prompt: str | list[int], params: SamplingParams | None = None) -> Output:
        return self.start(prompt, params).run()

    def stream(self, prompt: str | list[int], params: SamplingParams | None = None) -> Iterator[str]:
        yield from self.start(prompt, params)


def check_vocabularies(target_tok, draft_tok, target: Path, draft: Path) -> None:
    if target_tok.inner.get_vocab() != draft_tok.inner.get_vocab():
        raise VocabularyMismatchError(
            f"draft {draft} and target {target} have different vocabularies "
            f"({draft_tok.vocab_size} vs {target_tok.vocab_size} tokens); speculative decoding needs one tokenizer")
