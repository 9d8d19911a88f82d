"""The tokenizer wrapper: a long text is encoded without holding Python's lock, and a text's byte length bounds its
token count from below."""
import threading
import time

from specmesh import catalog
from specmesh.model.loader import load_tokenizer
from specmesh.model.tokenizer import LONG_TEXT


def test_a_long_text_lets_other_threads_run_while_it_is_encoded():
    """A server tokenizes a long prompt while its engine thread decodes: the engine must not wait for it."""
    tokenizer = load_tokenizer(catalog.resolve("embedded"))
    text = "def add(a, b):\n    return a + b\n" * 30_000                 # ~1 MB: about a second to encode
    assert len(text) >= LONG_TEXT
    done, gaps = threading.Event(), [0.0]

    def tick():
        last = time.perf_counter()
        while not done.is_set():
            time.sleep(0.001)
            now = time.perf_counter()
            gaps[0], last = max(gaps[0], now - last), now

    other = threading.Thread(target=tick)
    other.start()
    start = time.perf_counter()
    ids = tokenizer.encode(text)
    took = time.perf_counter() - start
    done.set()
    other.join()
    assert ids == tokenizer.inner.encode(text, add_special_tokens=False).ids
    assert took > 0.3, "too short a text to tell"
    assert gaps[0] < took / 2, f"the other thread waited {gaps[0]:.2f} s of the {took:.2f} s encode"


def test_bytes_bound_the_token_count():
    tokenizer = load_tokenizer(catalog.resolve("embedded"))
    most = tokenizer.max_token_bytes
    assert most >= max(len(b) for b in tokenizer.token_bytes)
    for text in ("    " * 400, "x" * 999, "def f(x):\n    return x\n" * 50, "é✓😀" * 100, "<|endoftext|>" * 20):
        assert len(tokenizer.encode(text)) >= len(text.encode()) / most
