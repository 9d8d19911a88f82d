"""Every command the README shows runs as written, in a fresh folder with a cache of its own: on the embedded pair
(SPECMESH_TARGET=embedded), and where a command talks to a chat model (`--chat`, `llm.chat`) on the default,
SmolLM2, since the embedded pair has no chat template. The shell blocks run line by line (a server block's `serve`
in the background, on a free port in place of its 8000, while the block's other lines talk to it), the Python block
as a script. Only the install and the test command are left out: they are what .ci/run itself runs. Marked
`readme`: .ci/run runs these after the test command (`python -m pytest -m readme`)."""
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

README = Path(__file__).parents[1] / "README.md"
LEFT_OUT = ("pip install", "python -m pytest")          # .ci/run installs, then runs the test command


def blocks(language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", README.read_text(), re.M | re.S)


def commands(block: str) -> list[str]:
    """A shell block's commands: continued lines joined, comments after two spaces dropped, `a && b` split."""
    joined = re.sub(r"\\\n\s*", "", block)
    lines = [re.split(r"\s{2,}#", line)[0].strip() for line in joined.splitlines()]
    return [part for line in lines if line for part in line.split(" && ")
            if not part.startswith(LEFT_OUT)]


pytestmark = pytest.mark.readme


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    """The environment a user has (none of the suite's SPECMESH_* settings), with the embedded pair as the target."""
    plain = {k: v for k, v in os.environ.items() if not k.startswith("SPECMESH_")}
    return plain | {"SPECMESH_TARGET": "embedded", "SPECMESH_CACHE_DIR": str(tmp_path_factory.mktemp("cache"))}


def for_chat(env: dict) -> dict:
    return {k: v for k, v in env.items() if k != "SPECMESH_TARGET"}


def run(command: str, env: dict, cwd: Path) -> str:
    if "--chat" in command:
        env = for_chat(env)
    done = subprocess.run(command, shell=True, env=env, cwd=cwd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"README command failed: {command}\n{done.stderr[-2000:]}"
    return done.stdout


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_readme_shows_commands_to_run():
    shown = [c for b in blocks("bash") for c in commands(b)]
    assert any(c.startswith("specmesh generate") for c in shown) and any(c.startswith("specmesh serve") for c in shown)
    assert blocks("python"), "the README's Python example"


@pytest.mark.parametrize("block", [b for b in blocks("bash") if commands(b) and "specmesh serve" not in b])
def test_every_shell_command_runs(block, env, tmp_path):
    for command in commands(block):
        run(command, env, tmp_path)


def test_the_server_block_runs(env, tmp_path):
    (block,) = [b for b in blocks("bash") if "specmesh serve" in b]
    port = str(free_port())
    serve, *rest = [c.replace("8000", port) for c in commands(block)]
    server = subprocess.Popen(serve, shell=True, env=env, cwd=tmp_path, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not healthy(port):
            assert server.poll() is None and time.monotonic() < deadline, f"{serve} did not come up"
            time.sleep(0.5)
        for command in rest:
            out = run(command, env, tmp_path)
            if command.startswith("curl"):
                assert '"choices"' in out, out
    finally:
        os.killpg(server.pid, 15)
        server.wait(timeout=60)


def healthy(port: str) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def test_the_python_example_runs(env, tmp_path):
    (script,) = blocks("python")
    (tmp_path / "example.py").write_text(script)
    assert run(f"{sys.executable} example.py", for_chat(env) if "chat(" in script else env, tmp_path).strip()


def test_ci_runs_the_readmes_test_command_and_then_these():
    (tests,) = [c for b in blocks("bash") for c in re.findall(r"^pip install .* python -m pytest .*$", b, re.M)]
    ci = (README.parent / ".ci" / "run").read_text().splitlines()
    assert any(line.startswith(tests + " || exit 1") for line in ci), "CI runs it as written, and stops if it fails"
    assert any(line.startswith("python -m pytest -m readme") for line in ci)
