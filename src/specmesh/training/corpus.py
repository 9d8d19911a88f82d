"""The embedded models' corpus: the Python standard library sources of this machine.

Held-out rule (fixed): a file is held out when crc32 of its path relative to the
stdlib root, modulo 20, is 0 (about 5% of files, whole files). The tokenizer and
both models train on the rest; evaluation prompts and held-out metrics come only
from held-out files.
"""
from __future__ import annotations

import json
import random
import re
import sysconfig
import zlib
from pathlib import Path

HELDOUT_MODULUS = 20


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def is_heldout(relpath: str) -> bool:
    return zlib.crc32(relpath.encode()) % HELDOUT_MODULUS == 0


def stdlib_sources(root: Path | None = None) -> list[tuple[str, str]]:
    """(relative path, text) of every UTF-8 .py file under the stdlib, site-packages excluded."""
    root = root or stdlib_root()
    out = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if rel.startswith("site-packages/"):
            continue
        try:
            out.append((rel, path.read_text(encoding="utf-8")))
        except (UnicodeDecodeError, OSError):
            continue
    return out


def split(sources: list[tuple[str, str]]) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    train = [s for s in sources if not is_heldout(s[0])]
    heldout = [s for s in sources if is_heldout(s[0])]
    return train, heldout


_DEF = re.compile(r"^[ \t]*(async[ \t]+)?def [^\n]*:[ \t]*\n", re.M)
_DOCSTRING = re.compile(r'[ \t]*[rRbBuU]?("""|\'\'\')(.*?)\1[ \t]*\n', re.S)


def cut_points(text: str) -> list[int]:
    """Offsets just after a `def ...:` line, and after its docstring when one follows."""
    points = []
    for m in _DEF.finditer(text):
        end = m.end()
        doc = _DOCSTRING.match(text, end)
        points.append(doc.end() if doc else end)
    return points


def make_prompts(heldout: list[tuple[str, str]], count: int = 120, max_chars: int = 1500,
                 seed: int = 0) -> list[dict]:
    """Code prompts cut at natural points (after a def line and its docstring) of held-out files.

    Each prompt is up to `max_chars` of the text before the cut, starting at a line boundary.
    """
    rng = random.Random(seed)
    texts = dict(heldout)
    candidates = []
    for rel, text in heldout:
        for point in cut_points(text):
            if point > 200:
                candidates.append((rel, point))
    rng.shuffle(candidates)
    per_file: dict[str, int] = {}
    prompts = []
    for rel, point in candidates:
        if per_file.get(rel, 0) >= 3:
            continue
        text = texts[rel]
        start = max(0, point - max_chars)
        start = text.find("\n", start) + 1 if start else 0
        prompts.append({"prompt": text[start:point], "source": rel})
        per_file[rel] = per_file.get(rel, 0) + 1
        if len(prompts) == count:
            break
    return prompts


def write_jsonl(rows: list[dict], path: str | Path) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
