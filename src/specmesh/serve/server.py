"""The server's construction and life: the LLM and its engine sized for serving (`build`), then HTTP in a thread
beside the engine loop, and the shutdown on signals (`run`)."""
from __future__ import annotations

import dataclasses
import ipaddress
import signal
import socket
import sys
import threading
import time
import warnings
from dataclasses import dataclass, field

from specmesh import catalog
from specmesh.engine.runner import PREFILL_CHUNK, PREFILL_SHARE
from specmesh.engine.sizing import kv_mb_per_token
from specmesh.options import CARDS
from specmesh.runtime import PeerError


@dataclass
class ServeConfig:
    method: str = "ar"
    methods: str | None = None      # the methods a request may name ("sd,selfdraft,ar"; None: `method` alone)
    host: str = "127.0.0.1"
    port: int = 8000
    model_name: str | None = None   # the model id clients send (None: the target's name, catalog.served_name)
    dtype: str = "auto"             # llm.default_dtype: bfloat16 on CPU, float32 on a GPU
    quant: str | None = None
    target: str | None = None
    draft: str | None = None
    device: str = "cpu"
    tp: int = 1                     # the target split over tp processes (tensor parallelism)
    max_batch: int | None = None    # running requests (None: 16, fewer where their KV cache would pass max_kv_mb)
    max_kv_mb: float | None = None  # the KV cache's bound (None: a quarter of the memory available at start)
    tune: bool = True               # auto with no cached calibration: calibrate at start (False: the CPU kind's default)
    options: dict = field(default_factory=dict)     # method options (sd without gamma: γ by batch size)
    grace_s: float = 30.0           # SIGTERM: how long running requests may take to finish
    prefix_cache_mb: float = 256.0  # prompt prefixes' keys and values kept for reuse (0: off)
    max_n: int | None = None        # samples per prompt a request may ask for (None: max_batch)
    max_queued: int | None = None   # sequences that may wait for a row, past it 429 (None: 16 x max_batch)
    prefill_chunk: int = PREFILL_CHUNK      # prompt tokens computed per engine step
    log_level: str = "info"
    api_key: str | None = None      # every /v1 request must carry `Authorization: Bearer KEY` (None: no key)
    key_everywhere: bool = False    # /health and /metrics need the key too


def build(cfg: ServeConfig):
    """The server state (engine not started yet) and the FastAPI app for `cfg`."""
    try:
        import fastapi  # noqa: F401
        import prometheus_client  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as e:
        raise ValueError(f"specmesh serve needs {e.name}: pip install -e '.[serve]'") from None
    from specmesh import LLM
    from specmesh.serve.api import Key, Server, create_app
    from specmesh.serve.metrics import Metrics
    from specmesh.serve.protocol import Limits
    if cfg.method not in ("auto", *CARDS):
        raise ValueError(f"unknown method {cfg.method!r}: one of auto, {', '.join(CARDS)}")
    if not cfg.prefix_cache_mb >= 0:
        raise ValueError(f"--prefix-cache-mb must be >= 0, got {cfg.prefix_cache_mb}")
    llm = LLM(target=cfg.target, draft=cfg.draft, method=cfg.method, device=cfg.device, dtype=cfg.dtype,
              quant=cfg.quant, tp=cfg.tp, max_batch=cfg.max_batch, max_kv_mb=cfg.max_kv_mb, methods=cfg.methods,
              **cfg.options)
    if cfg.tune and (llm.auto or llm.mix) and llm.choice.default_for:  # auto's first run calibrates, once (cached)
        llm.tune()
    llm.tokenizer.token_bytes                           # checked once now, not on the first request
    metrics = Metrics()
    engine = llm.engine_for(llm.mix or llm.method, prefix_cache=make_prefix_cache(cfg, llm), prefill_chunk=cfg.prefill_chunk,
                            prefill_share=PREFILL_SHARE)
    rows = engine.scheduler.rows
    engine.scheduler.per_request = rows - rows // 4     # rows left for newcomers
    engine.on_finish, metrics.default_method = metrics.finish, engine.methods[0]
    limits = Limits.for_engine(rows, engine.context)
    limits = dataclasses.replace(limits, **{k: v for k, v in (("max_n", cfg.max_n), ("max_queued", cfg.max_queued))
                                            if v is not None})
    server = Server(engine, cfg.model_name or catalog.served_name(cfg.target), metrics, limits, llm)
    return server, create_app(server, Key(cfg.api_key, cfg.key_everywhere) if cfg.api_key else None)


def make_prefix_cache(cfg: ServeConfig, llm):
    """The engine's prefix cache, or None where it is off or could not be exact (said on stderr)."""
    from specmesh.engine.prefix_cache import PrefixCache, unsupported
    if cfg.prefix_cache_mb == 0:
        return None
    reason = unsupported(llm.models.target)
    if reason:
        print(f"specmesh serve: prefix cache off: {reason}", file=sys.stderr)
        return None
    return PrefixCache(llm.models.target, cfg.prefix_cache_mb)


def address_taken(host: str, port: int) -> str | None:
    """Why the server could not listen on host:port (bound as uvicorn binds it), or None."""
    try:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        with socket.socket(family) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind((host, port))
    except OSError as e:
        return e.strerror or str(e)
    return None


def is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def run(cfg: ServeConfig) -> int:
    """Serve until SIGINT, SIGTERM (drain: new requests get 503, running ones may finish within
    the grace period; then, or at a second SIGTERM, the ones left are cancelled: an error event, and
    exit 0), an engine failure or an address it cannot listen on (exit status 1).

    The engine loop runs in the main thread (where the models were loaded) and HTTP in a thread
    of its own. The reason was OpenMP: each thread that runs parallel ops gets a team of worker
    threads, and libgomp stops its workers spin-waiting between ops once there are more of them
    than CPUs. Forwards in a second thread made decode steps much slower on 2 cores (docs/serving.md);
    the kernels' loops now run on a pool of their own (csrc/pool.c), PyTorch's ops still on OpenMP."""
    import uvicorn
    if cfg.api_key is None and not is_loopback(cfg.host):
        print(f"specmesh serve: warning: {cfg.host} is reachable from other machines and no key is set: anyone who "
              "reaches the port may use it (--api-key-file FILE, or $SPECMESH_API_KEY)", file=sys.stderr)
    if (taken := address_taken(cfg.host, cfg.port)) is not None:     # before the models load (and auto measures)
        print(f"specmesh serve: could not serve on {cfg.host}:{cfg.port}: {taken}", file=sys.stderr)
        return 1
    server, app = build(cfg)
    failed, cancelled = threading.Event(), threading.Event()

    class Uvicorn(uvicorn.Server):
        def handle_exit(self, sig, frame):
            if sig == signal.SIGTERM and not server.draining:
                server.draining = True
                threading.Thread(target=drain, daemon=True).start()
            elif sig == signal.SIGTERM and not cancelled.is_set():
                cancel()                        # a second SIGTERM: cancel what is left now
            else:
                super().handle_exit(sig, frame)

    def drain():
        deadline = time.monotonic() + cfg.grace_s
        while not server.engine.idle and time.monotonic() < deadline and not cancelled.is_set():
            time.sleep(0.05)
        cancel()

    def cancel():
        cancelled.set()
        server.engine.stop()                # the engine loop ends after its step, failing what is in flight
        web.should_exit = True

    def on_failure(error):
        failed.set()
        if isinstance(error, PeerError):    # the clients hear which host was lost (503) until the server is stopped
            print(f"specmesh serve: a process of {server.engine.name} was lost: {error}; every request is answered "
                  "503 until this server is stopped", file=sys.stderr)
            return
        print(f"specmesh serve: engine failure, exiting: {type(error).__name__}: {error}", file=sys.stderr)
        web.should_exit = True

    def serve_http():
        try:
            web.run()
        finally:
            if not web.started:             # it could not listen (uvicorn said why): exit 1, not 0
                failed.set()
                print(f"specmesh serve: could not serve on {cfg.host}:{cfg.port}", file=sys.stderr)
            server.engine.stop()            # ends engine.run() in the main thread

    server.engine.on_failure = on_failure
    warnings.showwarning = lambda message, *_, **__: print(f"specmesh serve: warning: {message}", file=sys.stderr)
    e = server.engine
    chosen = f" (chose {e.name})" if cfg.method == "auto" else ""
    what = f"methods {e.name} (a request's default: {e.methods[0]})" if len(e.methods) > 1 else cfg.method + chosen
    print(f"specmesh serve: {what} on {e.scheduler.rows} rows of {e.runner.max_len} tokens "
          f"({e.scheduler.rows * e.runner.max_len * kv_mb_per_token(server.llm.models):.0f} MB of KV cache at most), "
          f"http://{cfg.host}:{cfg.port}/v1", file=sys.stderr)
    web = Uvicorn(uvicorn.Config(app, host=cfg.host, port=cfg.port, log_level=cfg.log_level,
                                 timeout_graceful_shutdown=5))
    http = threading.Thread(target=serve_http, name="specmesh-http")
    for sig in (signal.SIGINT, signal.SIGTERM):     # uvicorn listens for signals only in the main thread
        signal.signal(sig, web.handle_exit)
    http.start()
    server.engine.run()
    http.join()
    return 1 if failed.is_set() else 0
