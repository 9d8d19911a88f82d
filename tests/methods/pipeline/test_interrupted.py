"""A request interrupted mid-round (KeyboardInterrupt in the middle of a long answer) or a stream its reader
dropped half-way leaves `pp`, `stpp` and `pipedec` usable: the next request gives what it gives on a fresh
pipeline (an interrupted job starts the stages again: runtime/pipeline.py `recover`)."""
import signal

import pytest

from specmesh import LLM, SamplingParams

PROMPT, LONG = "def fibonacci(n):", SamplingParams(max_new_tokens=3000, ignore_eos=True)


def interrupted_after(seconds: float, run) -> bool:
    """run() with a KeyboardInterrupt raised in it after `seconds` (as Ctrl-C would): whether it came."""
    def interrupt(*_):
        raise KeyboardInterrupt
    previous = signal.signal(signal.SIGALRM, interrupt)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        run()
        return False
    except KeyboardInterrupt:
        return True
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@pytest.mark.parametrize("method", ["pp", "stpp", "pipedec"])
def test_the_next_request_after_an_interrupt_or_a_dropped_stream_works(method):
    params = SamplingParams(max_new_tokens=16)
    with LLM(target="embedded", method=method) as llm:             # its context holds a long answer
        want = llm.generate(PROMPT, params).tokens
        assert interrupted_after(0.5, lambda: llm.generate("class Stack:", LONG)), "the answer ended first"
        assert llm.generate(PROMPT, params).tokens == want
        pieces = iter(llm.stream("class Stack:", LONG))
        for _ in zip(range(5), pieces):
            pass
        pieces.close()
        assert llm.generate(PROMPT, params).tokens == want
