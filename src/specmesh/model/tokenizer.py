"""A thin wrapper over a HuggingFace `tokenizers` tokenizer (a folder's tokenizer.json, or one built from a
GGUF file's metadata by model/gguf.py), with its chat template."""
from __future__ import annotations

import datetime
import functools
import hashlib
import json
import random
from pathlib import Path

import numpy as np

from tokenizers import Tokenizer as HFTokenizer

from specmesh.paths import write_whole

LONG_TEXT = 16384            # characters from which encode lets go of the GIL (encode_batch)


class Tokenizer:
    def __init__(self, inner: HFTokenizer, config: dict | None = None, pieces_file: Path | None = None):
        self.inner = inner
        self.config = config or {}          # tokenizer_config.json's keys: chat_template, bos_token, eos_token ...
        self.pieces_file = pieces_file      # where token_bytes is kept for this tokenizer (a GGUF file's: its cache)
        self.chat_template = self.config.get("chat_template")
        # the BOS a text's tokens begin with where the tokenizer adds one (add_bos_token: Gemma's, Llama 2's), else None
        bos = self.special_tokens().get("bos_token") if self.config.get("add_bos_token") else None
        self.bos_id: int | None = None if bos is None else inner.token_to_id(bos)

    @classmethod
    def from_dir(cls, path: str | Path) -> "Tokenizer":
        path = Path(path)
        cfg_path = path / "tokenizer_config.json"
        return cls(HFTokenizer.from_file(str(path / "tokenizer.json")),
                   json.loads(cfg_path.read_text()) if cfg_path.exists() else {})

    def render_chat(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        """`messages` ({"role", "content"}) through the chat template, rendered as transformers'
        apply_chat_template renders it (a sandboxed jinja2 environment, trim_blocks and lstrip_blocks,
        the special tokens as variables)."""
        if not self.chat_template:
            raise ValueError("this model's tokenizer has no chat template")
        if not isinstance(messages, list) or not messages:
            raise ValueError("messages must be a non-empty list of {\"role\": ..., \"content\": ...}")
        for i, m in enumerate(messages):
            if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
                raise ValueError(f"messages[{i}] needs a string role and a string content, got {m!r:.80}")
        return chat_template(self.chat_template).render(
            messages=messages, add_generation_prompt=add_generation_prompt, **self.special_tokens())

    @functools.cached_property
    def chat_prefix(self) -> list[int]:
        """The chat template's tokens up to where a user's first message begins (its default system prompt
        included); [] without a template."""
        if not self.chat_template:
            return []
        return self.encode(self.render_chat([{"role": "user", "content": "\x00"}]).split("\x00")[0])

    def special_tokens(self) -> dict[str, str]:
        """bos_token, eos_token ... as strings (tokenizer_config.json may spell them {"content": ...})."""
        tokens = {}
        for key, value in self.config.items():
            if key.endswith("_token") and value is not None:
                tokens[key] = value["content"] if isinstance(value, dict) else str(value)
        return tokens

    @property
    def vocab_size(self) -> int:
        return self.inner.get_vocab_size(with_added_tokens=True)

    @functools.cached_property
    def fingerprint(self) -> str:
        """A short hash of the vocabulary (every token and its id): what an n-gram cache records of the tokenizer
        that counted it."""
        return hashlib.sha256(json.dumps(sorted(self.inner.get_vocab().items())).encode()).hexdigest()[:16]

    def token_id(self, token: str) -> int | None:
        return self.inner.token_to_id(token)

    def encode(self, text: str) -> list[int]:
        """Token ids of `text`, after the BOS where the tokenizer adds one (bos_id), once: a text that begins with it
        (a chat template writes it) gets no second. A long text goes through encode_batch, which lets go of Python's
        lock while it works (about 1 s a MB): a server's other threads run on meanwhile."""
        if len(text) < LONG_TEXT:
            ids = self.inner.encode(text, add_special_tokens=False).ids
        else:
            ids = self.inner.encode_batch([text], add_special_tokens=False)[0].ids
        return ids if self.bos_id is None or ids[:1] == [self.bos_id] else [self.bos_id, *ids]

    @functools.cached_property
    def max_token_bytes(self) -> int | None:
        """The most bytes of text one token stands for (a byte-level BPE's, special tokens' text included), so a
        text of b bytes has at least b / max_token_bytes tokens; None for a tokenizer of another kind."""
        if self.token_bytes is None:
            return None
        special = [len(t.content.encode()) for t in self.inner.get_added_tokens_decoder().values()]
        return max(max(map(len, self.token_bytes)), *special, 1)

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self.inner.decode(ids, skip_special_tokens=skip_special_tokens)

    CHECKED_TOKENS = 8192       # token_bytes checks every token of a vocabulary this large, a sample of a larger one

    @functools.cached_property
    def token_bytes(self) -> list[bytes] | None:
        """Each token's bytes, where `decode` (skipping special tokens) is their concatenation read as
        UTF-8 with replacement characters: a byte-level BPE, as the embedded models' and most current
        LLMs' tokenizers are. It lets a growing output be decoded in time linear in its length
        (engine/sequence.py). Checked against `decode` on every token and on random sequences; None
        where the tokenizer is of another kind or any check fails. Read from `pieces_file` where it was kept."""
        if self.pieces_file is None:
            return self.checked_token_bytes()
        try:
            return read_pieces(self.pieces_file, self.vocab_size)
        except (OSError, ValueError):
            pieces = self.checked_token_bytes()
            write_pieces(self.pieces_file, pieces)
            return pieces

    def checked_token_bytes(self) -> list[bytes] | None:
        if (json.loads(self.inner.to_str()).get("decoder") or {}).get("type") != "ByteLevel":
            return None
        to_byte = {ord(c): b for b, c in byte_level_alphabet().items()}     # str.translate's table: char -> byte
        added = self.inner.get_added_tokens_decoder()
        texts = [None if i in added else self.inner.id_to_token(i) for i in range(self.vocab_size)]
        if any(t is None for i, t in enumerate(texts) if i not in added) \
                or not set("".join(t for t in texts if t)) <= {chr(c) for c in to_byte}:
            return None
        pieces = [(b"" if added[i].special else added[i].content.encode()) if t is None
                  else t.translate(to_byte).encode("latin-1") for i, t in enumerate(texts)]
        rng = random.Random(0)
        singles = range(self.vocab_size) if self.vocab_size <= self.CHECKED_TOKENS else \
            sorted({*rng.sample(range(self.vocab_size), self.CHECKED_TOKENS), *added})     # a large vocabulary: a sample
        samples = [[i] for i in singles] + \
            [[rng.randrange(self.vocab_size) for _ in range(rng.randrange(2, 40))] for _ in range(200)]
        if any(b"".join(pieces[i] for i in ids).decode("utf-8", "replace") != self.decode(ids) for ids in samples):
            return None
        return pieces


PIECES = b"specmesh-pieces-1\n"   # a pieces file: this, a count n (int64; -1: None), n lengths (int32), the bytes


def write_pieces(file: Path, pieces: list[bytes] | None) -> None:
    lengths = np.array([len(p) for p in pieces or []], np.int32)
    write_whole(file, PIECES + np.int64(-1 if pieces is None else len(lengths)).tobytes() + lengths.tobytes()
                + b"".join(pieces or []))


def read_pieces(file: Path, vocab_size: int) -> list[bytes] | None:
    data = file.read_bytes()
    if not data.startswith(PIECES):
        raise ValueError(f"{file} is not a pieces file")
    at = len(PIECES)
    n = int(np.frombuffer(data, np.int64, 1, at)[0])
    if n == -1:
        return None
    if n != vocab_size:
        raise ValueError(f"{file} holds {n} pieces for a vocabulary of {vocab_size}")
    lengths = np.frombuffer(data, np.int32, n, at + 8)
    ends = (at + 8 + 4 * n + np.cumsum(lengths)).tolist()
    if ends and ends[-1] != len(data):
        raise ValueError(f"{file} is cut short")
    starts = [at + 8 + 4 * n, *ends[:-1]]
    return [data[a:b] for a, b in zip(starts, ends)]


@functools.lru_cache(maxsize=8)
def chat_template(source: str):
    """A chat template compiled once per process (jinja2's compile is most of a render)."""
    return chat_environment().from_string(source)


@functools.cache
def chat_environment():
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.datetime.now().strftime(fmt)
    return env


@functools.cache
def byte_level_alphabet() -> dict[int, str]:
    """GPT-2's byte-level BPE alphabet: byte -> the character a token's text writes it as."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return chars
