"""`specmesh bench --link`: the crossing bench (bench/crossing.py) from the command line. Its runs across hosts are
checked in tests/runtime/test_hosts.py; here what the command refuses, its whole run (`slow`) and its plot."""
import json
import subprocess
import sys

import pytest

from specmesh.bench import crossing


@pytest.mark.parametrize("argv, said", [
    (["--link", "1gbit", "--methods", "pp,ar"], "runs pp, pipedec, stpp, pearl, sd, cosine across hosts, not ar"),
    (["--link", "1gb"], "'1gb' is not a link rate like 10gbit, 1gbit or 100mbit"),
    (["--link", "1gbit", "--methods", ","], "--methods is empty"),
    (["--link", "1gbit", "--target", "gemma3-270m"], "--target cannot go with it"),
    (["--link", "1gbit", "--tp", "2", "--gamma", "3"], "--tp, --gamma cannot go with it"),
    (["--link", "1gbit", "--dtype", "float32", "--threads", "1"], "--dtype, --threads cannot go with it"),
])
def test_bench_across_hosts_refuses_what_it_cannot_run_in_one_line(argv, said):
    done = subprocess.run([sys.executable, "-m", "specmesh.cli", "bench", *argv], capture_output=True, text=True)
    assert done.returncode == 2 and said in done.stderr.splitlines()[-1], done.stderr


def result(methods=("pp", "pearl"), rates=("10gbit", "1gbit")) -> dict:
    return {"rows": [{"method": m, "rate": r, "one_host_tokens_per_s": 100.0, "hosts_tokens_per_s": 80.0 - i,
                      "simulated_tokens_per_s": 70.0 + i, "messages_per_token": 3.0, "bytes_per_token": 2000.0}
                     for m in methods for i, r in enumerate(rates)]}


def test_the_crossing_plot_draws_each_method_at_each_rate_measured_and_simulated(tmp_path):
    crossing.plot(result(), str(tmp_path / "crossing.png"))
    assert (tmp_path / "crossing.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(crossing.table(result()).splitlines()) == 2 + 4          # a header, a row a method and rate


@pytest.mark.slow
def test_bench_across_hosts_runs_a_method_at_a_rate_and_writes_json_and_plot(tmp_path):
    out, png = tmp_path / "crossing.json", tmp_path / "crossing.png"
    done = subprocess.run([sys.executable, "-m", "specmesh.cli", "bench", "--link", "1gbit", "--methods", "pp",
                           "--limit", "1", "--max-new-tokens", "16", "--json", str(out), "--plot", str(png)],
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-1500:]
    [row] = json.loads(out.read_text())["rows"]
    assert row["method"] == "pp" and row["rate"] == "1gbit" and row["hosts_tokens_per_s"] > 0
    assert 2.5 < row["messages_per_token"] < 4 and png.stat().st_size > 0
    assert "| pp | 1gbit |" in done.stdout
