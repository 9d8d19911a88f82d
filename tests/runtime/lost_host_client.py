"""Run on host 0 (tests/runtime/test_hosts.py) beside `specmesh serve` at URL (argv[1]): once the server is healthy,
stream a long answer (saying `streaming` at its first piece), read it to its end, then ask again two seconds later; print the stream's
error event and the next answer's status and body as JSON."""
import json
import sys
import time

import httpx

url = sys.argv[1]
deadline = time.monotonic() + 120
while True:
    try:
        if httpx.get(url + "/health").status_code == 200:
            break
    except httpx.TransportError:
        pass
    if time.monotonic() > deadline:
        sys.exit("the server did not start")
    time.sleep(0.2)
model = httpx.get(url + "/v1/models").json()["data"][0]["id"]
ask = {"model": model, "prompt": "def fibonacci(n):", "max_tokens": 900, "temperature": 0}
error, said = None, False
with httpx.stream("POST", url + "/v1/completions", json=ask | {"stream": True}, timeout=120) as response:
    for line in response.iter_lines():
        if not said:
            print("streaming", flush=True)
            said = True
        if line.startswith("data: {") and '"error"' in line:
            error = json.loads(line[6:])["error"]
time.sleep(2.0)                                         # later: the server is still there, refusing
after = httpx.post(url + "/v1/completions", json=ask, timeout=120)
print(json.dumps({"stream_error": error, "after": [after.status_code, after.json()]}), flush=True)
