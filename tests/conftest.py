import os
import socket
import tempfile

import pytest
import torch
from tokenizers import Tokenizer

from specmesh.kernels.build import cache_dir
from specmesh.model.model import ModelConfig, Transformer

torch.set_num_threads(int(os.environ.get("SPECMESH_TEST_THREADS", "2")))
# --method auto's choices go to a cache of this run (inherited by the CLI and server processes tests start); the
# compiled kernels stay in this machine's cache (one build, not one a run)
os.environ.setdefault("SPECMESH_KERNEL_DIR", str(cache_dir()))
os.environ["SPECMESH_CACHE_DIR"] = tempfile.mkdtemp(prefix="specmesh-tune-")
# ... measured on two calibration prompts (plan's least), not 30 s of them: the suite tests how it chooses
os.environ["SPECMESH_TUNE_BUDGET_S"] = "0"
# the suite runs on the embedded 28M pair wherever no target is named (tests of SmolLM2 name it)
os.environ["SPECMESH_TARGET"] = "embedded"
# ... in float32, the exact reference, wherever no dtype is named (dtype auto's own tests unset it; bf16's name it)
os.environ["SPECMESH_DTYPE"] = "float32"


def pytest_collection_modifyitems(config, items):
    """Tests marked cpu(*flags) run where the CPU has those flags (and lacks those written "-flag"); elsewhere
    they are deselected and the summary names them and why."""
    lacking = {item: why for item in items if (why := missing(item))}
    if lacking:
        config.hook.pytest_deselected(items=list(lacking))
        items[:] = [item for item in items if item not in lacking]
        config.stash[LACKING] = lacking


def missing(item) -> str | None:
    from specmesh.kernels import cpu_flags
    m = item.get_closest_marker("cpu")
    if m is None:
        return None
    needed, barred = {f for f in m.args if f[0] != "-"}, {f[1:] for f in m.args if f[0] == "-"}
    why = [f"this CPU lacks {' '.join(sorted(needed - cpu_flags()))}"] if not needed <= cpu_flags() else []
    why += [f"this CPU has {' '.join(sorted(barred & cpu_flags()))}"] if barred & cpu_flags() else []
    return "; ".join(why) or None


def pytest_terminal_summary(terminalreporter, config):
    for item, why in config.stash.get(LACKING, {}).items():
        terminalreporter.write_line(f"deselected {item.nodeid}: {why}")


LACKING = pytest.StashKey[dict]()


def tiny_config(**kw) -> ModelConfig:
    base = dict(vocab_size=97, hidden_size=64, intermediate_size=96, num_layers=3, num_heads=4,
                num_kv_heads=2, head_dim=16, max_position_embeddings=256, eos_token_id=0)
    return ModelConfig(**(base | kw))


@pytest.fixture
def tiny_model():
    torch.manual_seed(0)
    model = Transformer(tiny_config()).eval()
    for p in model.parameters():        # larger weights: sharper, more varied logits
        torch.nn.init.normal_(p, std=0.2)
    return model


TEXT = ("def add(a, b):\n    return a + b\n\nclass Point:\n    def __init__(self, x, y):\n        self.x = x\n"
        "        self.y = y\n\nfor i in range(10):\n    print(i, 'hello world')\n") * 4


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory):
    """A random tiny model with a real byte-level BPE tokenizer, saved in HF layout."""
    from tokenizers import decoders, models, pre_tokenizers, trainers

    path = tmp_path_factory.mktemp("tiny")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<|endoftext|>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([TEXT], trainer)
    tok.save(str(path / "tokenizer.json"))
    save_random_model(path, tiny_config(vocab_size=tok.get_vocab_size(), eos_token_id=0), seed=0)
    return path


def save_random_model(path, cfg: ModelConfig, seed: int) -> None:
    from specmesh.model.loader import save_model
    torch.manual_seed(seed)
    model = Transformer(cfg)
    for name, p in model.named_parameters():    # unit norms, a sharp head: few likely tokens per step
        torch.nn.init.normal_(p, std=0.3 if name.startswith("lm_head") else 0.2) if p.dim() > 1 else p.data.fill_(1.0)
    save_model(model, path, dtype=torch.float32)


@pytest.fixture(scope="session")
def tiny_draft_checkpoint(tiny_checkpoint, tmp_path_factory):
    """A different, smaller random model sharing the tiny tokenizer (acceptance near zero)."""
    import shutil
    path = tmp_path_factory.mktemp("tiny-draft")
    shutil.copy(tiny_checkpoint / "tokenizer.json", path / "tokenizer.json")
    vocab = Tokenizer.from_file(str(path / "tokenizer.json")).get_vocab_size()
    save_random_model(path, tiny_config(vocab_size=vocab, eos_token_id=0, num_layers=2, hidden_size=32,
                                        num_heads=2, num_kv_heads=1), seed=7)
    return path


@pytest.fixture(scope="session")
def tiny_draft_copy(tiny_draft_checkpoint, tmp_path_factory):
    """The tiny draft again under another folder: a third drafter for cosine (--drafters refuses one twice)."""
    import shutil
    path = tmp_path_factory.mktemp("tiny-draft-copy") / "copy"
    shutil.copytree(tiny_draft_checkpoint, path)
    return path


def specmesh_here(*args) -> tuple[int, str]:
    """`specmesh ARGS` as main() in this process, the function the command runs: its exit code and what it wrote
    to stderr (for argument errors: a process each would spend most of its time starting)."""
    import contextlib
    import io
    import warnings

    from specmesh.cli import main
    err, shown = io.StringIO(), warnings.showwarning
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            code = main([str(a) for a in args])
    except SystemExit as e:
        code = e.code
    finally:
        warnings.showwarning = shown                    # main() prints warnings its own way
    return code, err.getvalue()


def run_measured(cmd: list[str], timeout: float = 600) -> tuple[int, float]:
    """Run cmd (its output discarded) under a parent of its own; its exit status and peak resident memory
    in MiB (RUSAGE_CHILDREN of a fresh parent: this process's other children do not count)."""
    import subprocess
    import sys
    measure = ("import resource, subprocess, sys; rc = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, "
               "stderr=subprocess.DEVNULL).returncode; print(rc, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)")
    out = subprocess.run([sys.executable, "-c", measure, *cmd], capture_output=True, text=True, timeout=timeout)
    rc, peak_kb = map(int, out.stdout.split())
    return rc, peak_kb / 1024


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server_process(*args) -> tuple:
    """`specmesh serve` (float32; the embedded target and `ar` unless `args` say) in a process of its own, once
    healthy: (process, url).
    The embedded target with `ar` is slow enough that a 300-token request still runs when a signal comes (speculation
    copies the target's loops in long runs)."""
    import subprocess
    import sys
    import time

    import httpx
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "specmesh.cli", "serve", "--dtype", "float32", "--port", str(port),
                             "--method", "ar", *args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            if httpx.get(url + "/health").status_code == 200:
                return proc, url
        except httpx.TransportError:
            pass
        assert time.monotonic() < deadline and proc.poll() is None, "server did not start"
        time.sleep(0.1)


def sampled_pairs(llm, n: int, seed: int, **kw):
    """How often each pair of first two tokens came out in n samples of "class Point:" at temperature 1."""
    from collections import Counter
    from specmesh import SamplingParams
    out = llm.generate("class Point:", SamplingParams(max_new_tokens=2, temperature=1.0, seed=seed, n=n, **kw))
    return Counter(tuple(s.tokens) for s in out.samples)


def assert_same_distribution(a, b) -> None:
    """A chi-square two-sample test on two Counters of outcomes (rare outcomes pooled) at p > 1e-3."""
    from scipy.stats import chi2_contingency
    common = [k for k in set(a) | set(b) if a[k] + b[k] >= 20]
    rest = [sum(c.values()) - sum(c[k] for k in common) for c in (a, b)]
    table = [[c[k] for k in common] + ([r] if sum(rest) else []) for c, r in zip((a, b), rest)]
    assert len(common) >= 3, "too few outcomes for a meaningful test"
    assert chi2_contingency(table).pvalue > 1e-3


def fail_rank_mid_stream(llm, rank: int, message: str, max_new_tokens: int, within_s: float,
                         sig: int | None = None) -> int:
    """Start a stream on `llm`, send rank `rank` of its other processes `sig` (SIGKILL) after the first piece, and
    assert that the rest of the stream fails within `within_s` with a PeerError naming the rank, its role and pid
    and `message` (regex). Returns the rank's pid."""
    import signal
    import time
    from specmesh import SamplingParams
    from specmesh.runtime.link import PeerError
    link = llm.models.remote.link
    pid = link.pids[rank]
    run = iter(llm.stream("def", SamplingParams(max_new_tokens=max_new_tokens, ignore_eos=True)))
    next(run)
    os.kill(pid, signal.SIGKILL if sig is None else sig)
    start = time.monotonic()
    with pytest.raises(PeerError, match=rf"rank {rank} \({link.roles[rank]}, pid {pid}\) {message}"):
        for _ in run:
            pass
    assert time.monotonic() - start < within_s
    return pid


def rss_mb() -> float:
    """This process's resident memory in MB (Linux)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2 ** 20
