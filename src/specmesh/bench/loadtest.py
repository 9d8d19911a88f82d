"""`specmesh loadtest`: streaming requests against a running server.

A prompt file's `prompt` lines go to /v1/completions as they are, its `turns` lines to /v1/chat/completions
(the first turn, the user's: the server applies the model's template). Open loop (`rate`): requests start at
Poisson arrivals of `rate` per second for `duration` seconds, whatever the server's pace. Closed loop
(`concurrency`): that many clients each send their next request when the last one ends. Per request: time to
first token (first non-empty text), time per output token ((end - first token) / (tokens - 1), tokens from the
stream's usage), end-to-end latency; a request that gets a non-200 status, an error event, or no [DONE] counts as
an error.

The client shares the machine with the server it measures, so it is a light one: aiohttp on
uvloop (where installed) spends a third of the CPU per streamed token that httpx on asyncio spent
(docs/serving.md).
"""
from __future__ import annotations

import asyncio
import json
import random
import time
from dataclasses import dataclass, field

import numpy as np


@dataclass
class LoadConfig:
    url: str                            # the server root, without /v1
    rate: float | None = None
    concurrency: int | None = None
    duration: float = 60.0
    prompts: list[str | list[dict]] = field(default_factory=list)    # a text: /v1/completions; messages: chat
    max_tokens: int = 64
    model: str | None = None
    method: str | None = None           # the body's `method` (a server of several methods: --methods)
    seed: int = 0


@dataclass
class Sample:
    ok: bool
    latency: float = 0.0
    ttft: float | None = None
    tokens: int = 0
    tpot: float | None = None
    error: str = ""


async def one_request(session, cfg: LoadConfig, prompt: str | list[dict]) -> Sample:
    chat = not isinstance(prompt, str)
    body = {"messages" if chat else "prompt": prompt, "max_tokens": cfg.max_tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    body |= {k: v for k, v in (("model", cfg.model), ("method", cfg.method)) if v}
    route = "/v1/chat/completions" if chat else "/v1/completions"
    start, first, tokens, done = time.perf_counter(), None, 0, False
    try:
        async with session.post(cfg.url.rstrip("/") + route, json=body) as r:
            if r.status != 200:
                return Sample(False, error=f"HTTP {r.status}: {(await r.text())[:200]}")
            async for line in r.content:                # read to the end: the connection is reused
                if not line.startswith(b"data: ") or done:
                    continue
                data = line[6:].rstrip()
                if data == b"[DONE]":
                    done, end = True, time.perf_counter()
                    continue
                if first is not None and b'"usage"' not in data and b'"error"' not in data:
                    continue                    # a text piece after the first: nothing to read (saves client CPU)
                event = json.loads(data)
                if "error" in event:
                    return Sample(False, error=event["error"].get("message", "error event"))
                if event.get("usage"):
                    tokens = event["usage"]["completion_tokens"]
                if first is None and any(c.get("text") or c.get("delta", {}).get("content")
                                         for c in event.get("choices", [])):
                    first = time.perf_counter()
    except Exception as e:                  # noqa: BLE001 - a failed request is a data point
        return Sample(False, error=f"{type(e).__name__}: {e}")
    if not done:
        return Sample(False, error="stream ended without [DONE]")
    tpot = (end - first) / (tokens - 1) if first is not None and tokens > 1 else None
    return Sample(True, end - start, None if first is None else first - start, tokens, tpot)


async def run_async(cfg: LoadConfig, progress=None) -> tuple[list[Sample], float]:
    import aiohttp
    rng = random.Random(cfg.seed)
    samples: list[Sample] = []
    prompts = iter(lambda: rng.choice(cfg.prompts), None)

    async def record(prompt: str) -> None:
        samples.append(await one_request(session, cfg, prompt))
        if progress:
            progress(samples[-1])

    timeout = aiohttp.ClientTimeout(total=None, sock_connect=10.0)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), timeout=timeout) as session:
        start = time.perf_counter()
        end = start + cfg.duration
        if cfg.rate:
            tasks, t = [], start
            while True:
                t += rng.expovariate(cfg.rate)
                if t >= end:
                    break
                await asyncio.sleep(max(0.0, t - time.perf_counter()))
                tasks.append(asyncio.create_task(record(next(prompts))))
            await asyncio.gather(*tasks)
        else:
            async def client_loop():
                while time.perf_counter() < end:
                    await record(next(prompts))
            await asyncio.gather(*(client_loop() for _ in range(cfg.concurrency)))
        wall = time.perf_counter() - start
    return samples, wall


def percentiles(values: list[float]) -> dict:
    if not values:
        return {"p50": None, "p90": None, "p99": None}
    ms = np.array(values) * 1e3
    return {f"p{q}": float(np.percentile(ms, q)) for q in (50, 90, 99)}


def summarize(samples: list[Sample], wall: float) -> dict:
    ok = [s for s in samples if s.ok]
    return {"requests": len(samples), "errors": len(samples) - len(ok),
            "throughput_tok_s": sum(s.tokens for s in ok) / wall if wall > 0 else 0.0,
            "ttft_ms": percentiles([s.ttft for s in ok if s.ttft is not None]),
            "tpot_ms": percentiles([s.tpot for s in ok if s.tpot is not None]),
            "latency_ms": percentiles([s.latency for s in ok])}


def event_loop_runner():
    """uvloop's where it is installed (with uvicorn[standard]): the client's own CPU time per
    streamed token is part of what it measures on a machine it shares with the server."""
    try:
        import uvloop
        return uvloop.run
    except ImportError:
        return asyncio.run


def check_server(url: str) -> None:
    """A load against nothing would report nothing but errors for its whole duration: ask /health first."""
    import urllib.error
    import urllib.request
    try:
        with urllib.request.urlopen(f"{url.rstrip('/')}/health", timeout=10) as answer:
            answer.read()
    except (urllib.error.URLError, ValueError, OSError) as e:
        raise ValueError(f"no server answers at {url}/health ({getattr(e, 'reason', e)}); start one with "
                         f"`specmesh serve` and pass its root, e.g. http://127.0.0.1:8000") from None


def run(cfg: LoadConfig) -> tuple[dict, list[str]]:
    """Run the load; returns the summary and the distinct error messages."""
    from tqdm import tqdm
    if not cfg.prompts:
        raise ValueError("no prompts")
    check_server(cfg.url)
    bar = tqdm(desc="requests", unit="req")
    samples, wall = event_loop_runner()(run_async(cfg, lambda s: bar.update()))
    bar.close()
    return summarize(samples, wall), sorted({s.error for s in samples if not s.ok})


def print_summary(summary: dict, file) -> None:
    print(f"requests {summary['requests']}  errors {summary['errors']}  "
          f"throughput {summary['throughput_tok_s']:.1f} tok/s", file=file)
    print(f"{'':12}{'p50':>10}{'p90':>10}{'p99':>10}", file=file)
    for key, label in (("ttft_ms", "TTFT ms"), ("tpot_ms", "TPOT ms"), ("latency_ms", "latency ms")):
        row = summary[key]
        print(f"{label:12}" + "".join(f"{'-' if row[q] is None else f'{row[q]:.1f}':>10}" for q in ("p50", "p90", "p99")),
              file=file)
