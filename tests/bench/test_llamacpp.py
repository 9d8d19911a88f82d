"""llama.cpp as a bench peer: the GGUF files written from a checkpoint, and (slow: it needs llama-cpp-python,
built from source) the peers' greedy outputs against `ar`'s."""
import json
import os
import subprocess
import sys

import gguf
import numpy as np
import pytest
import torch

from specmesh.bench.llamacpp import TOOLS, make_runner, reported_seconds, reported_tokens
from specmesh.model.gguf import permute_rope
from specmesh.model.loader import load_tokenizer, read_config, read_weights, to_gguf


@pytest.mark.parametrize("ftype", ["bf16", "f32", "q8_0", "q4_0"])
def test_gguf_holds_the_checkpoint(tiny_checkpoint, tmp_path, ftype):
    out = to_gguf(tiny_checkpoint, tmp_path / "m.gguf", ftype)
    reader = gguf.GGUFReader(str(out))
    cfg, weights = read_config(tiny_checkpoint), read_weights(tiny_checkpoint)
    tensors = {t.name: t for t in reader.tensors}
    assert len(tensors) == 2 + 9 * cfg.num_layers + 1           # embedding, output norm, layers, output
    field = reader.fields["llama.attention.head_count_kv"]
    assert int(field.parts[field.data[0]][0]) == cfg.num_kv_heads

    def values(name):
        t = tensors[name]
        data = gguf.quants.dequantize(t.data, t.tensor_type)
        return torch.from_numpy(np.ascontiguousarray(data, dtype=np.float32)).view(*reversed(t.shape.tolist()))

    q = permute_rope(weights["model.layers.0.self_attn.q_proj.weight"].float(), cfg.num_heads)
    down = weights["model.layers.1.mlp.down_proj.weight"].float()
    for got, want in ((values("blk.0.attn_q.weight"), q), (values("blk.1.ffn_down.weight"), down)):
        assert got.shape == want.shape
        if ftype in ("q8_0", "q4_0"):           # within a step of a block's max |w| / 127 (/ 8)
            assert (got - want).abs().max() <= want.abs().max() / (127 if ftype == "q8_0" else 8)
        else:
            assert torch.equal(got, want.bfloat16().float() if ftype == "bf16" else want)


def test_rope_permutation_pairs_the_halves():
    w = torch.arange(8.0)[:, None]                 # one head, hd 8: rows 0-3 first halves, 4-7 second halves
    assert permute_rope(w, 1).flatten().tolist() == [0, 4, 1, 5, 2, 6, 3, 7]


def test_the_tools_reported_time_is_read():
    speculative = ("0.00.371 I encoded  384 tokens in    0.110 seconds, speed: 3477.127 t/s\n"
                   "0.00.371 I decoded   66 tokens in    0.174 seconds, speed:  379.749 t/s\n")
    completion = ("common_perf_print: prompt eval time =      88.39 ms /   384 tokens\n"
                  "common_perf_print:        eval time =     121.85 ms /    63 runs\n"
                  "common_perf_print:       total time =     215.00 ms /   447 tokens\n")
    assert reported_seconds(speculative) == pytest.approx(0.284)
    assert reported_seconds(completion) == pytest.approx(0.21024)
    with pytest.raises(RuntimeError, match="no timings"):
        reported_seconds("nothing here")
    assert (reported_tokens(speculative), reported_tokens(completion), reported_tokens("nothing")) == (66, 64, None)


def test_the_peer_runs_a_gguf_target_as_it_is(tiny_checkpoint, tmp_path, monkeypatch):
    """By default the peers run a GGUF target's own file, whatever specmesh's dtype or --quant; --peer-weights
    same-precision gives them a copy at the run's precision (a folder gets one either way). Read from the command
    each tool would get (empty stand-ins for the tools: none runs)."""
    target = to_gguf(tiny_checkpoint, tmp_path / "target.gguf", "q8_0")
    tools = tmp_path / "bin"
    tools.mkdir()
    for tool in TOOLS.values():
        (tools / tool).touch()
    monkeypatch.setenv("SPECMESH_LLAMACPP_BIN", str(tools))
    monkeypatch.setenv("SPECMESH_CACHE_DIR", str(tmp_path / "cache"))
    tok = load_tokenizer(target)

    def peer(weights, dtype=torch.float32, quant=None, checkpoint=target):
        runner = make_runner("llama.cpp-spec", checkpoint, tiny_checkpoint, dtype, quant, 2, tok, weights)
        assert runner.cmd[runner.cmd.index("-m") + 1] == str(runner.model)
        return runner

    for dtype, quant in ((torch.float32, None), (torch.bfloat16, None), (torch.float32, "int4")):
        runner = peer("file", dtype, quant)
        assert runner.model == target and runner.weights == "file"
    draft = peer("file").cmd[peer("file").cmd.index("-md") + 1]       # a folder: a copy at the run's precision
    assert draft.endswith("-f32.gguf") and str(tmp_path / "cache" / "gguf") in draft
    for quant, ftype in ((None, "f32"), ("int8", "q8_0")):
        runner = peer("same-precision", quant=quant)
        assert runner.model.name.endswith(f"-{ftype}.gguf") and runner.weights == "same-precision"
    assert peer("file", checkpoint=tiny_checkpoint).weights == "same-precision"
    with pytest.raises(ValueError, match="peer weights"):
        peer("dequantized")

    from specmesh.bench.runner import BenchConfig, make_runner as bench_runner
    from specmesh.cli import build_parser
    assert build_parser().parse_args(["bench"]).peer_weights == "file"
    args = build_parser().parse_args(["bench", "--peer-weights", "same-precision"])
    cfg = BenchConfig(methods=["llama.cpp"], target=str(target), peer_weights=args.peer_weights)
    assert bench_runner("llama.cpp", cfg, "float32").weights == "same-precision"
    assert bench_runner("llama.cpp", BenchConfig(methods=["llama.cpp"], target=str(target)), "float32").model == target


@pytest.mark.slow
def test_llamacpp_peers_decode_what_ar_decodes(tiny_checkpoint, tiny_draft_checkpoint, tmp_path):
    """float32 GGUF, greedy: llama.cpp's plain decoding, its speculation with our draft and its prompt lookup
    give `ar`'s tokens (the same model computed by other kernels: a differing prompt is a near-tie at most)."""
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        pytest.fail("needs llama-cpp-python: pip install -e .[llamacpp] (it builds llama.cpp: about 20 minutes on "
                    "2 cores)")
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in ["def foo(x):", "class A:", "import os\n"]))
    dest = tmp_path / "bench.json"
    r = subprocess.run([sys.executable, "-m", "specmesh.cli", "bench", "--methods",
                        "ar,llama.cpp,llama.cpp-spec,llama.cpp-lookup", "--target", str(tiny_checkpoint),
                        "--draft", str(tiny_draft_checkpoint), "--prompts", str(prompts), "--max-new-tokens", "16",
                        "--dtype", "float32", "--json", str(dest)], capture_output=True, text=True,
                       env=os.environ | {"SPECMESH_CACHE_DIR": str(tmp_path)}, timeout=600)
    assert r.returncode == 0, r.stderr
    out = json.loads(dest.read_text())["methods"]
    for peer in ("llama.cpp", "llama.cpp-spec", "llama.cpp-lookup"):
        assert out[peer]["greedy_equal_to_ar"] + out[peer]["near_tie_divergences"] >= 2, (peer, out[peer])
        assert out[peer]["impl"] in ("native", "python")
        assert out[peer]["peer_weights"] == "same-precision"        # a folder target: its copy in float32


def test_the_build_leaves_ggml_amx_backend_out_where_the_cpu_has_amx(monkeypatch):
    from specmesh.bench import llamacpp
    from specmesh.kernels import build
    monkeypatch.setattr(build, "cpu_flags", lambda: {"avx2", "avx512f", "amx_tile", "amx_int8"})
    assert llamacpp.without_amx() == [f"-DCMAKE_C_FLAGS={llamacpp.NO_AMX}", f"-DCMAKE_CXX_FLAGS={llamacpp.NO_AMX}"]
    monkeypatch.setattr(build, "cpu_flags", lambda: {"avx2", "avx512f"})
    assert llamacpp.without_amx() == []


@pytest.mark.parametrize("weights", ["file", "same-precision"])
def test_a_peer_on_the_target_s_own_file_takes_ar_s_dtype_untimed(monkeypatch, weights):
    """A peer running the target's file as it is runs the same whatever the dtype: it takes `ar`'s, so that its
    outputs are compared with `ar`'s own (no float32 reference of an 8B); a peer on a copy is timed in both."""
    from specmesh.bench import runner
    made = []

    class Peer:
        def __init__(self, dtype):
            self.weights, self.dtype = weights, dtype
            made.append(dtype)

        def __call__(self, ids, max_new_tokens):
            return ids, None

    monkeypatch.setattr(runner, "make_runner", lambda method, cfg, dtype: Peer(dtype))
    dtype, peer = runner.choose_dtype("llama.cpp", runner.BenchConfig(methods=["ar", "llama.cpp"]), [1, 2, 3])
    if weights == "file":
        assert made == [runner.default_dtype("cpu")] and (dtype, peer.dtype) == (made[0], made[0])
    else:
        assert made[1:] == ["float32", "bfloat16"] and dtype == peer.dtype
