"""A closed loop of C clients on one engine, as the server's (each finished request is replaced at once by the next
prompt), in this process: tokens a second, and for speculative methods each kind of step (by batch width, drafted or
not) and the admissions. Usage, from the repository root:

    python docs/results/2026-11-28-closed-loop.py METHOD CLIENTS REQUESTS PROMPTS.jsonl

96 new tokens a request, greedy, bfloat16, 2 threads. PADDED=1 computes the pads of a batch of trees of several sizes
(as before the runner passed `lens`), to compare."""
import collections
import json
import os
import sys
import time

import torch

from specmesh import LLM
from specmesh.engine.engine import Engine
from specmesh.methods.speculative import Speculative
from specmesh.engine.runner import Runner
from specmesh.spec.sampling import SamplingParams

torch.set_num_threads(2)
method, clients, requests, path = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
if os.environ.get("PADDED") == "1":
    forward = Runner.forward
    Runner.forward = lambda self, tokens, depths=None, mask=None, lens=None: forward(self, tokens, depths, mask)
llm = LLM("embedded", method=method, dtype="bfloat16")
params = SamplingParams(max_new_tokens=96)
ids = [llm.encode(json.loads(line)["prompt"]) for line in open(path)]
engine = Engine(llm.models, llm.method, llm.tokenizer, 16, 1024 + llm.method.slack)

record = collections.defaultdict(lambda: [0, 0.0, 0])       # kind -> calls, seconds, tokens
admit, step = Speculative.admit, Speculative.step


def timed_admit(self, seq, row):
    start = time.perf_counter()
    out = admit(self, seq, row)
    record["admit"][0] += 1
    record["admit"][1] += time.perf_counter() - start
    return out


def timed_step(self, seqs):
    start = time.perf_counter()
    out = step(self, seqs)
    kind = record[len(seqs), "drafted" if any(len(t) > 1 for t in out) else "plain"]
    kind[0] += 1
    kind[1] += time.perf_counter() - start
    kind[2] += sum(len(t) for t in out)
    return out


Speculative.admit, Speculative.step = timed_admit, timed_step
running, sent, done, tokens = [], 0, 0, 0
start = time.perf_counter()
while done < requests:
    while len(running) < clients and sent < requests:
        seqs = engine.sequences(ids[sent % len(ids)], params)
        engine.submit(seqs)
        running.append(seqs[0])
        sent += 1
    engine.step()
    for seq in [s for s in running if s.finish]:
        running.remove(seq)
        done += 1
        tokens += len(seq.tokens)
elapsed = time.perf_counter() - start
print(f"{method}, {clients} clients: {tokens / elapsed:.0f} tok/s over {requests} requests, {elapsed:.2f} s")
for kind, (calls, seconds, made) in sorted(record.items(), key=lambda item: str(item[0])):
    line = f"  {kind}: {calls} calls, {seconds * 1e3:.0f} ms"
    print(line + (f", {seconds * 1e3 / calls:.1f} ms each" if kind == "admit" else
                  f", {made} tokens, {seconds * 1e3 / max(made, 1):.2f} ms a token"))
