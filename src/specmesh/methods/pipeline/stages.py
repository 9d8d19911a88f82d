"""What a pipeline stage computes, for the pipeline methods: the stage processes' main loop (`StageServer`,
run by specmesh.runtime.worker), the last stage's decisions (the next token; for stpp the shared `verify`;
for pipedec hit or miss), and the job message rank 0 sends (`job`).
"""
from __future__ import annotations

from pathlib import Path

import torch

from specmesh.engine.sequence import Sequence
from specmesh.lossless.sampling import SamplingParams, make_generator, next_tokens
from specmesh.lossless.token_tree import TokenTree
from specmesh.lossless.verify import verify
from specmesh.model.loader import DTYPES, load_model
from specmesh.runtime.link import Link
from specmesh.runtime.pipeline import COMMIT, HIT, MISS, NONE, START, Decision, Packet, Stage, stage_seed

SERVE = f"{__name__}:StageServer"


def job(seq: Sequence, method: str) -> dict:
    """What the stage ranks need of a sequence: the method, the sampling parameters and the last stage's seed."""
    return {"method": method, "seed": stage_seed(seq.generator), "params": seq.params.job()}


def meta_tree(meta: torch.Tensor) -> TokenTree:
    """The TokenTree a whole-tree packet carries (stpp's last stage verifies it)."""
    tree = TokenTree.root(int(meta[0, 0]))
    for token, _, parent in meta[1:, :3].tolist():
        tree.add(token, parent)
    return tree


class StageServer:
    """Ranks other than rank 0: load the target, keep one stage, serve jobs until shutdown."""

    def __init__(self, config: dict):
        self.model = load_model(Path(config["target"]), DTYPES[config["dtype"]], torch.device(config["device"]),
                                quant=config.get("quant"))

    def run(self, link: Link) -> None:
        stage = Stage(self.model, link, first=int(link.roles[0] == "draft"))
        with torch.inference_mode():
            while not (job := link.recv_obj(0, idle=True)).get("shutdown"):
                stage.begin(job["max_len"], range(*job["layers"][stage.index]), job["pipelined"])
                params = SamplingParams.from_job(job["params"])
                generator = make_generator(job["seed"], self.model.device)
                if job["method"] == "pp":
                    self.serve_chain(stage, params, generator)
                elif stage.last:
                    self.decide_tree(stage, job, params, generator)
                else:
                    self.serve_tree(stage, job)

    def serve_chain(self, stage: Stage, params: SamplingParams, generator: torch.Generator) -> None:
        """pp: each token's pass goes straight through; the last stage sends the next token to rank 0."""
        while (packet := stage.receive()) is not None:
            out = stage.forward(packet)
            if stage.last:
                stage.link.send(next_tokens(out[:, -1], params, generator).cpu(), 0)
            else:
                stage.send_on(Packet(out))
        stage.end()

    def serve_tree(self, stage: Stage, job: dict) -> None:
        """pipedec and stpp, every stage but the last: after the prompt's pass, each timestep take
        a packet and the last stage's decision on the timestep before, then `advance`."""
        last, size = len(stage.link.roles) - 1, 3 + job["max_nodes"]
        stage.send_on(Packet(stage.forward(stage.receive())))
        sending = []
        while True:
            packet = stage.receive()
            decision = Decision.decode(stage.link.recv(torch.zeros(size, dtype=torch.int64), last))
            for done in sending:
                done()
            if packet is None:
                return stage.end()
            sending = stage.advance(packet, decision, in_flight=stage.pipelined and stage.index > 0)

    def decide_tree(self, stage: Stage, job: dict, params: SamplingParams, generator: torch.Generator) -> None:
        """The last stage of pipedec and stpp: after the prompt's pass, decide and tell every rank.

        pipedec: a root finished on the timestep before is decided when its children arrive
        (the layer the stage before processed meanwhile): its token x is drawn, a hit when x
        is one of them; the hit child becomes the root processed now. stpp: each packet is a
        whole tree, verified (`verify`) once processed."""
        size = 3 + job["max_nodes"]
        others = [r for r in range(len(stage.link.roles)) if r != stage.link.rank]

        def tell(decision: Decision) -> list:
            """The decision to every other rank (returns the sends' waits). S (rank 0) waits for it: through gloo
            it is on its way before this rank computes on; a mailbox holds it whole once put, and waiting for S to
            take it would hold this rank's forward until S's own work ends (docs/pipelines.md)."""
            message = decision.encode(size)
            sending = [stage.link.send(message, r, wait=False) for r in others]
            if stage.link.by_mailbox(0, message.nbytes):
                return sending
            sending[0]()
            return sending[1:]

        logits = stage.forward(stage.receive())
        sending = tell(Decision(START, int(next_tokens(logits[:, -1], params, generator))))
        root = None                         # logits of the root processed on the last timestep
        while (packet := stage.receive()) is not None:
            for done in sending:
                done()
            if job["method"] == "stpp":
                verdict = verify(meta_tree(packet.meta), stage.forward(packet)[0], params, generator)
                decision = Decision(COMMIT, verdict.next_token, verdict.path)
                stage.settle(decision, packet, in_flight=False)
                sending = tell(decision)
                continue
            decision = Decision(NONE)
            if root is not None:
                x = int(next_tokens(root[:, -1], params, generator))
                hit = ((packet.meta[:, 0] == x) & (packet.meta[:, 1] == 1)).nonzero().flatten().tolist() \
                    if packet.size else []                  # x among the root's children
                decision = Decision(HIT, x, [1 + hit[0]]) if hit else Decision(MISS, x)
            sending = tell(decision)
            packet = stage.settle(decision, packet, in_flight=True)
            root = stage.forward(packet) if packet.size else None
        for done in sending:
            done()
