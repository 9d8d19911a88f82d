"""Benchmark prompt files: JSON lines with `prompt` (a string, used as it is) or `turns` (chat: the first, as a
user message through the target's chat template when its tokenizer has one). Without a file: the held-out chat
instructions for a model with a chat template, else the held-out standard-library code."""
from __future__ import annotations

import json
from pathlib import Path

from specmesh import embedded


def utf8(data: bytes, name) -> str:
    """A prompt file's bytes as text, verbatim (no newline translation), or an error naming the file."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"prompt file {name} is not UTF-8 text: {e.reason} at byte {e.start}") from None


def prompt_file(path: str | Path | None, tokenizer=None) -> Path:
    """`path`, or the default set for this tokenizer's model."""
    chat = tokenizer is not None and tokenizer.chat_template
    return Path(path) if path else embedded.CHAT_PROMPTS if chat else embedded.HELDOUT_PROMPTS


def load_prompts(path: str | Path | None = None, limit: int | None = None, tokenizer=None,
                 messages: bool = False) -> list[str] | list[str | list[dict]]:
    """The file's prompts as texts; `messages`: a `turns` line as a chat request's messages (its first turn, the
    user's), for a client whose server applies the template."""
    path, chat = prompt_file(path, tokenizer), tokenizer is not None and tokenizer.chat_template
    if not path.is_file():
        raise FileNotFoundError(f"prompt file not found: {path}")
    prompts = []
    for n, line in enumerate(utf8(path.read_bytes(), path).splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{n}: not valid JSON ({e.msg})") from None
        text = row.get("prompt") if isinstance(row, dict) else None
        turn = row["turns"][0] if text is None and isinstance(row, dict) and row.get("turns") else None
        text = turn if turn is not None else text
        if not isinstance(text, str) or not text:
            raise ValueError(f"{path}:{n}: needs a non-empty 'prompt' string or a 'turns' list")
        if turn is not None and (chat or messages):
            user = [{"role": "user", "content": text}]
            text = user if messages else tokenizer.render_chat(user)
        prompts.append(text)
        if limit and len(prompts) == limit:
            break
    if not prompts:
        raise ValueError(f"{path}: no prompts")
    return prompts
