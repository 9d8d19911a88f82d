# Timestamps of the pipeline ranks (Stage.forward/send_on/receive, Link.send/recv, Pipeline.send/decision,
# TreeDrafter.grow, Stage.settle/advance) into /tmp/s16/trace-PID.json, in every process: put this folder on
# PYTHONPATH as sitecustomize.py (cp trace-site.py DIR/sitecustomize.py) and set TRACE_PP=1.
import os, sys
if os.environ.get("TRACE_PP"):
    import builtins, time, json
    _imp = builtins.__import__
    done = [False]
    ev = []
    def dump():
        with open(f"/tmp/s16/trace-{os.getpid()}.json", "w") as f: json.dump(ev, f)
    def wrap(cls, name, tag):
        orig = getattr(cls, name)
        def f(*a, **k):
            t = time.perf_counter(); out = orig(*a, **k); ev.append((tag, t, time.perf_counter()))
            if len(ev) % 3000 == 0: dump()
            return out
        setattr(cls, name, f)
    def patch():
        from specmesh.runtime import pipeline as P
        from specmesh.runtime import link as L
        wrap(P.Stage, "forward", "fwd"); wrap(P.Stage, "send_on", "send_on"); wrap(P.Stage, "receive", "receive")
        wrap(L.Link, "recv", "recv"); wrap(L.Link, "send", "send")
        wrap(P.Pipeline, "decision", "decision"); wrap(P.Pipeline, "send", "psend")
        try:
            from specmesh.proposers import dynamic_tree as D
            wrap(D.TreeDrafter, "grow", "grow")
        except Exception as e: print("no grow", e)
        wrap(P.Stage, "settle", "settle"); wrap(P.Stage, "advance", "advance")
    def hook(name, *a, **k):
        m = _imp(name, *a, **k)
        if not done[0] and hasattr(sys.modules.get("specmesh.runtime.pipeline"), "Pipeline") and hasattr(sys.modules.get("specmesh.runtime.link"), "Link"):
            done[0] = True
            patch()
        return m
    builtins.__import__ = hook
    import atexit; atexit.register(dump)
