"""The embedded model family and prompt set shipped in the repository."""
from __future__ import annotations

from pathlib import Path

from specmesh.settings import settings

ROOT = settings().home or Path(__file__).resolve().parents[2]
HELDOUT_PROMPTS = ROOT / "prompts" / "stdlib-heldout.jsonl"
CHAT_PROMPTS = ROOT / "prompts" / "chat-heldout.jsonl"


def path(role: str) -> Path:
    """Directory of the embedded model with this role ("target" or "draft")."""
    if role not in ("target", "draft"):
        raise ValueError(f"no embedded model with role {role!r}")
    p = ROOT / "models" / role
    if not (p / "config.json").exists():
        raise FileNotFoundError(f"embedded {role} model not found at {p}; run from a clone of the repository "
                                f"(or set SPECMESH_HOME to it), or pass --{role} MODEL")
    return p
