"""Run by torchrun on every host (tests/runtime/test_hosts.py): rank 0 asks a pipeline method for an answer, is
interrupted by Ctrl-C (SIGINT) in a long answer, asks again, drops a stream half-way, asks again, and prints the
three answers' tokens as JSON; the other ranks serve the pipeline's stages as `specmesh generate` does."""
import json
import os
import signal
import sys
import threading

from specmesh import LLM, SamplingParams
from specmesh.cli import main

METHOD, PROMPT = sys.argv[1], "def fibonacci(n):"
SHORT, LONG = SamplingParams(max_new_tokens=16), SamplingParams(max_new_tokens=900, ignore_eos=True)

if int(os.environ["RANK"]):
    sys.exit(main(["generate", "--target", "embedded", "--method", METHOD, PROMPT]))
signal.signal(signal.SIGINT, signal.default_int_handler)    # Ctrl-C raises, even where a shell started it ignored
with LLM(target="embedded", method=METHOD) as llm:
    answers = [llm.generate(PROMPT, SHORT).tokens]
    for delay in (1.0, 0.3, 0.1):           # (the long answer stops at the context: a fast spell may end it first)
        ctrl_c = threading.Timer(delay, os.kill, (os.getpid(), signal.SIGINT))
        ctrl_c.start()
        try:
            llm.generate("class Stack:", LONG)
            ctrl_c.cancel()
        except KeyboardInterrupt:
            break
    else:
        sys.exit("the long answer ended before Ctrl-C")
    answers.append(llm.generate(PROMPT, SHORT).tokens)
    pieces = iter(llm.stream("class Stack:", LONG))
    for _ in zip(range(5), pieces):
        pass
    pieces.close()
    answers.append(llm.generate(PROMPT, SHORT).tokens)
print(json.dumps(answers))
