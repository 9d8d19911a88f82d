"""Run by torchrun on every host (tests/runtime/test_hosts.py): rank 0 asks a method for one answer, says so on
stdout, and then waits (as a server between requests); the other ranks serve as `specmesh generate` does."""
import os
import sys
import time

from specmesh import LLM, SamplingParams
from specmesh.cli import main

METHOD, PROMPT = sys.argv[1], "def fibonacci(n):"

if int(os.environ["RANK"]):
    sys.exit(main(["generate", "--target", "embedded", "--method", METHOD, PROMPT]))
with LLM(target="embedded", method=METHOD) as llm:
    llm.generate(PROMPT, SamplingParams(max_new_tokens=4))
    print("answered", flush=True)
    time.sleep(600)
