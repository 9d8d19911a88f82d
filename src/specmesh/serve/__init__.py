"""`specmesh serve`: the OpenAI-compatible server over the engine. server.py builds and runs it; api.py is the HTTP
layer, protocol.py the request bodies, metrics.py the Prometheus counters."""
from specmesh.serve.server import ServeConfig, build, run

__all__ = ["ServeConfig", "build", "run"]
