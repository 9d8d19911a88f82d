"""Prometheus metrics of one server (its own registry, so several servers can share a process)."""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class Metrics:
    def __init__(self):
        r = self.registry = CollectorRegistry()
        self.requests = Counter("specmesh_requests", "Sequences submitted to the engine (a request's prompts times n)",
                                registry=r)
        self.finished = Counter("specmesh_requests_finished", "Sequences finished, or aborted (running or waiting)",
                                ["reason"], registry=r)
        self.generated = Counter("specmesh_generated_tokens", "Tokens generated", registry=r)
        self._generated = 0
        self.cached = Counter("specmesh_prefix_cache_hit_tokens", "Prompt tokens read from the prefix cache",
                              registry=r)
        self._cached = 0
        self.acceptance = Gauge("specmesh_acceptance_rate", "Accepted / drafted tokens (speculative methods)",
                                registry=r)
        self.tokens_per_forward = Gauge("specmesh_tokens_per_target_forward", "Generated tokens per target forward",
                                        registry=r)
        self.queue = Gauge("specmesh_queue_length", "Requests waiting for a batch row", registry=r)
        self.batch = Gauge("specmesh_running_batch_size", "Requests in the running batch", registry=r)
        self.prefill = Gauge("specmesh_prefill_pending_tokens", "Tokens of the prompt computed in chunks still to "
                             "compute", registry=r)
        self.ttft = Histogram("specmesh_time_to_first_token_seconds", "Arrival to first token", registry=r,
                              buckets=LATENCY_BUCKETS)
        self.tpot = Histogram("specmesh_time_per_output_token_seconds", "Mean time between output tokens",
                              registry=r, buckets=LATENCY_BUCKETS)

        # per method (a server of several: each request names its own)
        self.method_sequences = Counter("specmesh_method_sequences", "Sequences finished, by the method that decoded "
                                        "them", ["method"], registry=r)
        self.method_generated = Counter("specmesh_method_generated_tokens", "Tokens generated, by method", ["method"],
                                        registry=r)
        self.method_forwards = Counter("specmesh_method_target_forwards", "Target forwards the sequences took part "
                                       "in, by method", ["method"], registry=r)
        self.method_drafted = Counter("specmesh_method_drafted_tokens", "Tokens proposed, by method", ["method"],
                                      registry=r)
        self.method_accepted = Counter("specmesh_method_accepted_tokens", "Of those, accepted, by method", ["method"],
                                       registry=r)
        self.default_method = ""

        # cosine: per drafter
        self.drafter_rounds = Counter("specmesh_drafter_rounds", "Rounds a drafter was routed to a request",
                                      ["drafter"], registry=r)
        self.drafter_drafted = Counter("specmesh_drafter_drafted_tokens", "Tokens a drafter proposed along the "
                                       "fused spine", ["drafter"], registry=r)
        self.drafter_accepted = Counter("specmesh_drafter_accepted_tokens", "Of those, the accepted prefix",
                                        ["drafter"], registry=r)
        self.drafter_score = Gauge("specmesh_drafter_score", "The router's score of a drafter at the end of the "
                                   "last finished request it served", ["drafter"], registry=r)
        self.drafter_alive = Gauge("specmesh_drafter_alive", "1 while a drafter is routed, 0 once its process died",
                                   ["drafter"], registry=r)

    def finish(self, seq) -> None:
        """Called by the engine when a sequence leaves the batch."""
        info = seq.stats.info
        for n, name in enumerate(info.get("drafters", [])):
            self.drafter_rounds.labels(name).inc(info["rounds"][n])
            self.drafter_drafted.labels(name).inc(info["drafted"][n])
            self.drafter_accepted.labels(name).inc(info["accepted"][n])
            if info["rounds"][n]:
                self.drafter_score.labels(name).set(info["scores"][n])
            self.drafter_alive.labels(name).set(info["alive"][n])
        self.finished.labels("aborted" if seq.aborted else (seq.finish or "length")).inc()
        method, st = seq.method or self.default_method, seq.stats
        self.method_sequences.labels(method).inc()
        self.method_generated.labels(method).inc(len(seq.tokens))
        self.method_forwards.labels(method).inc(st.target_forwards)
        self.method_drafted.labels(method).inc(st.drafted_tokens)
        self.method_accepted.labels(method).inc(st.accepted_tokens)
        if seq.first_token_at is not None:
            self.ttft.observe(seq.first_token_at - seq.arrival)
            if seq.finished_at and len(seq.tokens) > 1:
                self.tpot.observe((seq.finished_at - seq.first_token_at) / (len(seq.tokens) - 1))

    def render(self, engine) -> bytes:
        s = engine.stats
        self.generated.inc(s.generated_tokens - self._generated)
        self._generated = s.generated_tokens
        self.cached.inc(s.cached_prompt_tokens - self._cached)
        self._cached = s.cached_prompt_tokens
        self.tokens_per_forward.set(s.generated_tokens / s.target_forwards if s.target_forwards else 0)
        self.acceptance.set(s.acceptance_rate or 0)
        self.queue.set(s.waiting)
        self.batch.set(s.running)
        self.prefill.set(s.prefill_pending)
        return generate_latest(self.registry)
