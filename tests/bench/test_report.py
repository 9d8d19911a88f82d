"""The README's table of figures: made from bench JSON files, and the README's own is what they give."""
import json
from pathlib import Path

import pytest

from specmesh.bench.report import figures_row, main, readme_figures

README = Path(__file__).parents[2] / "README.md"


def bench(ar: float, sd: float, peer: float | None, lookup: float | None = None) -> dict:
    methods = {"ar": {"tokens_per_s": ar, "greedy_equal_to_ar": 4, "prompts": 4},
               "sd": {"tokens_per_s": sd, "greedy_equal_to_ar": 3, "prompts": 4}}
    for name, speed in (("llama.cpp", peer), ("llama.cpp-lookup", lookup)):
        if speed is not None:
            methods[name] = {"tokens_per_s": speed, "greedy_equal_to_ar": 0, "prompts": 4}
    return {"machine": "AMD EPYC (family 25 model 1; avx2), 2 cores, torch 2.13.0+cpu", "date": "2026-12-03T08:00:00",
            "commit": "abc1234", "config": {"target": "m.gguf", "prompts": "chat-heldout"}, "methods": methods,
            "per_prompt": []}


def test_a_row_gives_the_fastest_method_and_the_peers_ratios():
    row = figures_row(bench(100.0, 150.0, 80.0, 120.0))
    assert row == ("| m.gguf | chat-heldout | AMD EPYC (family 25 model 1; avx2) | 100.0 | `sd` 1.50x | 1.25x | "
                   "1.25x (`llama.cpp-lookup`) | 3/4 | 2026-12-03 | abc1234 |")
    assert "| – | – |" in figures_row(bench(100.0, 90.0, None))          # no peer ran: no ratio to it


def test_a_run_held_to_other_kernels_says_so():
    held = bench(100.0, 150.0, 80.0) | {"machine": "Intel(R) Xeon(R) Processor (family 6 model 207; avx2+avx512f), 2 "
                                                   "cores, SPECMESH_KERNELS=no-avx512,no-amx, torch 2.13.0+cpu"}
    assert "| Intel(R) Xeon(R) Processor (family 6 model 207; avx2+avx512f), held to no-avx512,no-amx |" \
        in figures_row(held)


def test_the_readme_block_is_made_again_from_its_files(tmp_path):
    (tmp_path / "a.json").write_text(json.dumps(bench(100.0, 150.0, 80.0)))
    readme = tmp_path / "README.md"
    readme.write_text("intro\n<!-- figures from: a.json -->\n| stale |\n<!-- end of figures -->\nrest\n")
    main(["--readme", str(readme)])
    text = readme.read_text()
    assert "| stale |" not in text and "`sd` 1.50x" in text and text.startswith("intro\n") and text.endswith("rest\n")
    readme.write_text("no block")
    with pytest.raises(SystemExit):
        main(["--readme", str(readme)])


def test_the_readmes_table_is_the_one_its_bench_files_give():
    assert readme_figures(README) == README.read_text(), \
        "README.md's figures differ from its bench files: python -m specmesh.bench.report --readme README.md"
