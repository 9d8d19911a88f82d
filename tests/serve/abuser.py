"""Run by tests/serve/test_abuse.py beside `specmesh serve` on 127.0.0.1:PORT (argv[1]): one careless or hostile
client, a request every PACE seconds, until its stdin closes; then it prints, as JSON, the answers that were not what
they should be and when (time.monotonic) each bad request was answered.

A process of its own started afresh, with the standard library only: light on the CPU it shares with the server and
the well-behaved clients (a fork of the test's process would copy that big heap's pages as either side writes them).
"""
import http.client
import json
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

PACE = 0.01
LONG_PROMPT = "def add(a, b):\n    return a + b\n\n" * 60          # several prefill chunks

BAD = [  # (body, the field the 400 must name)
    ({"prompt": "x", "n": 100000}, "n"),
    ({"prompt": "x", "max_tokens": 10 ** 9}, "max_tokens"),
    ({"prompt": "x", "max_tokens": -1}, "max_tokens"),
    ({"prompt": "x", "stop": ["a", "b", "c", "d", "e"]}, "stop"),
    ({"prompt": "x", "stop": "s" * 1000}, "stop"),
    ({"prompt": ["x"] * 1000}, "prompt"),
    ({"prompt": [[1, 2], [10 ** 7]]}, "prompt"),
    ({"prompt": ""}, "prompt"),
    ({"prompt": "x", "temperature": -1}, "temperature"),
    ({"prompt": "x", "top_p": 0}, "top_p"),
    ({"prompt": "x", "logprobs": 50}, "logprobs"),
    ({"prompt": "x", "frequency_penalty": 9}, "frequency_penalty"),
    ({"prompt": "x", "logit_bias": {"not-an-id": 1}}, "logit_bias"),
    ({"prompt": "x", "best_of": 5}, "best_of"),
    ({"prompt": "x", "made_up": True}, "made_up"),
    ({"messages": [{"role": "wizard", "content": "x"}]}, "messages"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}, "messages"),
    ({"prompt": "x", "seed": 2 ** 64}, "seed"),
    ({"prompt": "x", "stop": ""}, "stop"),
    (json.dumps({"prompt": "def f():\n" * 300_000}).encode(), "prompt"),           # 2.7 MB: never tokenized
    (json.dumps({"prompt": "x", "logit_bias": {str(i): 1 for i in range(150_000)}}).encode(), "logit_bias"),
]


def request(port: int, body, leave_after: float | None = None) -> int | None:
    """One request on a connection of its own (the standard library's client: light on the CPU this
    client shares with the server); its status, or None when it left after `leave_after` seconds."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=leave_after or 30)
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    path = "/v1/chat/completions" if isinstance(body, dict) and "messages" in body else "/v1/completions"
    try:
        conn.request("POST", path, raw, {"content-type": "application/json"})
        r = conn.getresponse()
        if leave_after and json.loads(raw).get("stream"):
            time.sleep(leave_after)         # a stream's headers came: leave mid-prefill or mid-stream
            return None
        return r.status if r.status != 400 else (400, json.loads(r.read())["error"]["param"])
    except TimeoutError:
        return None
    finally:
        conn.close()


def abuse(port: int, stop: threading.Event) -> tuple[list[str], list[float]]:
    """One careless or hostile client, one request after another (PACE apart) until told to stop; it
    reports the answers that were not what they should be, and when each bad request was answered."""
    seen, times = [], []
    while not stop.is_set():
        for body, param in BAD + [(raw, None) for raw in (b"{not json", b"\xff\xfe", b"[]")]:
            got = request(port, body)
            seen.append((isinstance(got, tuple) and (param is None or param in (got[1] or "")), body))
            times.append(time.monotonic())
            time.sleep(PACE)
        for body in ({"prompt": LONG_PROMPT, "max_tokens": 100, "stream": True},          # leaves mid-prefill
                     {"prompt": "x", "max_tokens": 200, "stream": True, "n": 4},          # leaves mid-stream
                     {"prompt": "x", "max_tokens": 200, "n": 4}):                         # gives up waiting
            request(port, body, leave_after=0.05)
            time.sleep(PACE)
        with ThreadPoolExecutor(4) as pool:                     # a burst of more than the queue holds
            codes = list(pool.map(lambda _: request(port, {"prompt": "y", "max_tokens": 100, "n": 8}, 0.05),
                                  range(4)))
        seen.append((set(codes) <= {200, 429, None}, f"burst answered {codes}"))
    return [repr(what)[:200] for ok, what in seen if not ok], times


if __name__ == "__main__":
    stop = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
    print(json.dumps(abuse(int(sys.argv[1]), stop)), flush=True)
