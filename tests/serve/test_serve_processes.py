"""The multi-process methods served: one sequence at a time behind the queue, said in /v1/models; through the
openai client their greedy answers are `ar`'s, and a client that leaves mid-stream leaves the method usable."""
import pytest

from specmesh import LLM, SamplingParams
from test_serve import LiveServer

PROMPT, NEXT = "def fibonacci(n):", "class Stack:"


@pytest.fixture(scope="module")
def ar_text():
    with LLM(target="embedded", method="ar", dtype="float32") as llm:
        return llm.generate(PROMPT, SamplingParams(max_new_tokens=24)).text


@pytest.mark.parametrize("method", ["pearl", "pp", "stpp", "pipedec"])
def test_a_multi_process_method_served_answers_as_ar_and_survives_a_client_leaving(method, ar_text):
    live = LiveServer("embedded", method=method, prefix_cache_mb=0)
    try:
        card = live.client.models.retrieve("specmesh-target").model_extra["specmesh"]
        assert card["method"] == method and card["running"] == 1
        ask = dict(model="specmesh-target", prompt=PROMPT, max_tokens=24, temperature=0)
        assert live.client.completions.create(**ask).choices[0].text == ar_text
        stream = live.client.completions.create(model="specmesh-target", prompt=NEXT, max_tokens=500,
                                                temperature=0, stream=True)
        for _ in zip(range(3), stream):
            pass
        stream.close()                                              # the client leaves mid-stream
        assert live.client.completions.create(**ask).choices[0].text == ar_text
    finally:
        live.close()
