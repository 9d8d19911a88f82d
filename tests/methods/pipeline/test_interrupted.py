"""A request interrupted mid-round (Ctrl-C in the middle of a long answer) or a stream its reader dropped half-way
leaves `pp`, `stpp` and `pipedec` usable: the next request gives what it gives on a fresh pipeline. One Ctrl-C is
held until the stages are in step and ends the job there; a second one interrupts at once, and the next job starts
the stages again (runtime/pipeline.py `recover`)."""
import os
import signal
import threading

import pytest

from specmesh import LLM, SamplingParams

PROMPT, LONG = "def fibonacci(n):", SamplingParams(max_new_tokens=900, ignore_eos=True)
DELAYS = (0.2, 0.5, 0.05)   # the long answer stops at the embedded context (256 tokens): a fast spell ends it in 0.5 s


def interrupted(run, at_once: bool = False) -> bool:
    """run() interrupted mid-answer after each of DELAYS in turn until one comes before the answer ends: whether one
    did."""
    return any(interrupted_after(seconds, run, at_once) for seconds in DELAYS)


def interrupted_after(seconds: float, run, at_once: bool = False) -> bool:
    """run() interrupted after `seconds`, as Ctrl-C does (SIGINT to this process), or `at_once` as a second Ctrl-C
    does (a KeyboardInterrupt raised wherever it is): whether it came."""
    def interrupt(*_):
        raise KeyboardInterrupt
    if at_once:
        previous = signal.signal(signal.SIGALRM, interrupt)
        signal.setitimer(signal.ITIMER_REAL, seconds)
    else:       # Ctrl-C as a terminal's foreground process takes it (a shell's background job inherits it ignored)
        previous = signal.signal(signal.SIGINT, signal.default_int_handler)
        timer = threading.Timer(seconds, os.kill, (os.getpid(), signal.SIGINT))
        timer.start()
    try:
        run()
        return False
    except KeyboardInterrupt:
        return True
    finally:
        if at_once:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
        else:
            timer.cancel()
            signal.signal(signal.SIGINT, previous)


@pytest.mark.parametrize("method", ["pp", "stpp"])      # pipedec: across hosts, tests/runtime/test_hosts.py
def test_the_next_request_after_an_interrupt_or_a_dropped_stream_works(method):
    params = SamplingParams(max_new_tokens=16)
    with LLM(target="embedded", method=method) as llm:             # its context holds a long answer
        want, link = llm.generate(PROMPT, params).tokens, llm.models.remote.link
        assert interrupted(lambda: llm.generate("class Stack:", LONG)), "the answer ended first"
        assert llm.generate(PROMPT, params).tokens == want
        assert llm.models.remote.link is link, "one Ctrl-C started the stages again"
        assert interrupted(lambda: llm.generate("class Stack:", LONG), at_once=True), "it ended first"
        mid_round = llm.models.remote.interrupted       # (not where it came as the answer ended: the stages in step)
        assert llm.generate(PROMPT, params).tokens == want
        assert (llm.models.remote.link is not link) == mid_round, "the stages went on, out of step"
        pieces = iter(llm.stream("class Stack:", LONG))
        for _ in zip(range(5), pieces):
            pass
        pieces.close()
        assert llm.generate(PROMPT, params).tokens == want
