"""`specmesh serve --api-key-file`: every /v1 route asks for `Authorization: Bearer KEY` (401 in OpenAI's shape
otherwise, which the official client raises as AuthenticationError); /health and /metrics stay open unless
--key-everywhere; the key comes from the flag, the file or $SPECMESH_API_KEY."""

import httpx
import pytest
from openai import AuthenticationError, OpenAI

from specmesh.serve.api import Key
from test_serve import LiveServer

KEY = "sk-test-4f1c9a"


@pytest.fixture(scope="module")
def keyed(tiny_checkpoint):
    server = LiveServer(tiny_checkpoint, api_key=KEY)
    yield server
    server.close()


def client(server, key):
    return OpenAI(base_url=server.url + "/v1", api_key=key, max_retries=0)


def test_the_openai_client_needs_the_key(keyed):
    with pytest.raises(AuthenticationError):
        client(keyed, "wrong").completions.create(model="specmesh-target", prompt="def", max_tokens=2)
    with pytest.raises(AuthenticationError):
        client(keyed, "wrong").models.list()
    out = client(keyed, KEY).completions.create(model="specmesh-target", prompt="def", max_tokens=2)
    assert out.usage.completion_tokens >= 1


def test_a_401_is_openais_error_body_and_the_open_routes_stay_open(keyed):
    for headers in ({}, {"Authorization": f"Bearer {KEY}x"}, {"Authorization": KEY}, {"Authorization": "Bearer"}):
        r = httpx.post(keyed.url + "/v1/completions", json={"prompt": "x"}, headers=headers)
        assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer", (headers, r.text)
        assert r.json()["error"]["code"] == "invalid_api_key" and r.json()["error"]["type"] == "invalid_request_error"
    assert httpx.get(keyed.url + "/health").status_code == 200
    assert httpx.get(keyed.url + "/metrics").status_code == 200
    assert httpx.get(keyed.url + "/v1/models", headers={"Authorization": f"bearer {KEY}"}).status_code == 200


def test_key_everywhere_guards_health_and_metrics_too():
    key = Key(KEY, everywhere=True)
    assert key.guards("/health") and key.guards("/metrics") and not key.admits(None)
    assert not Key(KEY).guards("/health") and Key(KEY).guards("/v1/chat/completions") and not Key(KEY).guards("/v1x")
    assert key.admits(f"Bearer {KEY}") and not key.admits(f"Bearer {KEY[:-1]}") and not key.admits(f"Basic {KEY}")


@pytest.mark.parametrize("args, message", [
    (["--api-key", "a", "--api-key-file", "/etc/hostname"], "give one of --api-key and --api-key-file"),
    (["--api-key-file", "/no/such/file"], "argument --api-key-file: /no/such/file: No such file or directory"),
    (["--key-everywhere"], "--key-everywhere needs a key"),
    (["--api-key", " "], "the API key is empty"),
])
def test_bad_key_arguments_are_clear_errors_before_anything_loads(args, message, monkeypatch):
    from conftest import specmesh_here
    monkeypatch.delenv("SPECMESH_API_KEY", raising=False)
    code, err = specmesh_here("serve", *args)
    assert code == 2 and message in err, err


def test_the_key_from_a_file_or_the_environment(tmp_path, monkeypatch):
    from argparse import Namespace
    from specmesh.cli.serve import api_key
    path = tmp_path / "key"
    path.write_text(f"{KEY}\nanything after\n")
    args = Namespace(api_key=None, api_key_file=path, key_everywhere=False)
    assert api_key(args, None) == KEY
    monkeypatch.setenv("SPECMESH_API_KEY", "from-env")
    assert api_key(Namespace(api_key=None, api_key_file=None, key_everywhere=False), None) == "from-env"
    assert api_key(Namespace(api_key="given", api_key_file=None, key_everywhere=False), None) == "given"


def test_serving_beyond_loopback_without_a_key_warns(capsys):
    import socket
    from specmesh.serve import ServeConfig, run
    from specmesh.serve.server import is_loopback
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("192.168.1.5")
    with socket.socket() as taken:                          # the port taken: run() says so and returns, no model loads
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert run(ServeConfig(host="0.0.0.0", port=port)) == 1
        assert run(ServeConfig(host="0.0.0.0", port=port, api_key=KEY)) == 1
    said = capsys.readouterr().err.split("\n")
    assert sum("0.0.0.0 is reachable from other machines and no key is set" in line for line in said) == 1
