"""A server of several methods (`--methods`): each request names its own in a top-level `method` field (the openai
client's extra_body), rows of every method in one batch, each answer what its method gives alone; a method the
server did not load is a 400 naming it; /metrics counts by method."""
import threading

import pytest
from openai import BadRequestError

from specmesh import LLM, SamplingParams
from test_serve import LiveServer

PROMPTS = ["def add(a, b):", "class Point:\n    def", "for i in range(10):\n", "import os\n"]
METHODS = "ar,sd,selfdraft,suffix"


@pytest.fixture(scope="module")
def live(tiny_checkpoint):
    server = LiveServer(tiny_checkpoint, draft=str(tiny_checkpoint), methods=METHODS, prefix_cache_mb=0)
    yield server
    server.close()


def test_concurrent_clients_each_choosing_a_method_get_that_methods_answer(live, tiny_checkpoint):
    alone = {m: LLM(target=tiny_checkpoint, draft=tiny_checkpoint, method=m, dtype="float32")
             for m in METHODS.split(",")}
    want = {(p, m): alone[m].generate(p, SamplingParams(max_new_tokens=20)).text
            for p in PROMPTS for m in alone}
    got, errors = {}, []

    def client(prompt, method):
        try:
            got[prompt, method] = live.client.completions.create(
                model="specmesh-target", prompt=prompt, max_tokens=20, temperature=0,
                extra_body={"method": method}).choices[0].text
        except Exception as e:          # noqa: BLE001 - reported below
            errors.append(e)
    threads = [threading.Thread(target=client, args=key) for key in want]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and got == want
    card = live.client.models.retrieve("specmesh-target").model_extra["specmesh"]
    assert card["methods"] == METHODS.split(",") and card["method"] == "ar"
    import urllib.request
    metrics = urllib.request.urlopen(live.url + "/metrics").read().decode()
    for m in alone:
        assert f'specmesh_method_sequences_total{{method="{m}"}} {float(len(PROMPTS))}' in metrics, m


def test_a_method_the_server_did_not_load_is_a_400_naming_it(live):
    with pytest.raises(BadRequestError) as e:
        live.client.completions.create(model="specmesh-target", prompt="x", max_tokens=2,
                                       extra_body={"method": "tree"})
    error = e.value.body
    assert error["param"] == "method" and "'tree' is not one this engine runs" in error["message"]
    with pytest.raises(BadRequestError):
        live.client.completions.create(model="specmesh-target", prompt="x", max_tokens=2, extra_body={"method": 3})


def test_a_request_naming_auto_runs_the_method_auto_chooses_for_it(live, tiny_checkpoint):
    from specmesh.tuning import Candidate, Choice
    llm = live.server.llm
    before, llm.choice = llm.choice, Choice("suffix", {}, [Candidate("suffix", {}, 1.0, "measured")])
    import urllib.request
    read = lambda: next((float(line.split()[-1]) for line in urllib.request.urlopen(live.url + "/metrics").read()
                         .decode().splitlines() if line.startswith('specmesh_method_sequences_total{method="suffix"}')),
                        0.0)
    try:
        done = read()
        text = live.client.completions.create(model="specmesh-target", prompt=PROMPTS[0], max_tokens=20,
                                              temperature=0, extra_body={"method": "auto"}).choices[0].text
    finally:
        llm.choice = before
    want = LLM(target=tiny_checkpoint, method="ar", dtype="float32").generate(PROMPTS[0],
                                                                               SamplingParams(max_new_tokens=20))
    assert text == want.text and read() == done + 1
