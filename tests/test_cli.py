"""The command line, run as a user would (subprocesses); the bad arguments' checks through main() in this process,
the function the command runs (a process each would spend most of its time starting)."""
import json
import os
import subprocess
import sys

import pytest
from conftest import run_measured, specmesh_here

ENV = os.environ | {"OMP_NUM_THREADS": "1"}


def specmesh(*args, stdin=None, env=None):
    return subprocess.run([sys.executable, "-m", "specmesh.cli", *map(str, args)], capture_output=True, text=True,
                          input=stdin, env=ENV | (env or {}), timeout=300)


def test_generate_json_to_stdout_and_prompt_file_verbatim(tiny_checkpoint, tmp_path):
    prompt = tmp_path / "p.txt"
    prompt.write_bytes(b"def f(x):\r\n\n")
    r = specmesh("generate", "--prompt-file", prompt, "--target", tiny_checkpoint, "--max-new-tokens", 6, "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert set(out) == {"text", "tokens", "samples", "stats"}
    assert set(out["stats"]) == {"target_forwards", "draft_forwards", "tokens_per_forward", "tokens_per_s",
                                 "acceptance_rate"}
    assert len(out["tokens"]) == 6 and out["samples"] == [{"text": out["text"], "tokens": out["tokens"]}]
    r2 = specmesh("generate", "--prompt-file", "-", "--target", tiny_checkpoint, "--max-new-tokens", 6, "--json",
                  stdin="def f(x):\r\n\n")
    assert json.loads(r2.stdout)["tokens"] == out["tokens"]      # stdin, same bytes, same tokens
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)                                               # a pipe, as <(...) gives: not a regular file
    writer = subprocess.Popen(["sh", "-c", f"printf 'def f(x):\\r\\n\\n' > {fifo}"])
    r3 = specmesh("generate", "--prompt-file", fifo, "--target", tiny_checkpoint, "--max-new-tokens", 6, "--json")
    writer.wait(timeout=60)
    assert r3.returncode == 0 and json.loads(r3.stdout)["tokens"] == out["tokens"], r3.stderr
    r4 = specmesh("generate", "--prompt", "def f(x):\r\n\n", "--target", tiny_checkpoint, "--max-new-tokens", 6,
                  "--json")                                 # the text by name: the same tokens
    assert r4.returncode == 0 and json.loads(r4.stdout)["tokens"] == out["tokens"], r4.stderr


def test_generate_streams_and_writes_json_file(tiny_checkpoint, tmp_path):
    dest = tmp_path / "out.json"
    r = specmesh("generate", "class A:", "--target", tiny_checkpoint, "--max-new-tokens", 5, "--n", 2,
                 "--temperature", 1, "--seed", 4, "--json", dest)
    assert r.returncode == 0, r.stderr
    out = json.loads(dest.read_text())
    assert len(out["samples"]) == 2
    first, second = (sample["text"] for sample in out["samples"])          # every sample, the first streamed
    assert r.stdout == f"--- sample 1 of 2 ---\n{first}\n--- sample 2 of 2 ---\n{second}\n"


def test_damaged_files_exit_2_with_one_line_naming_them(tiny_checkpoint, tmp_path):
    import shutil
    broken = {name: shutil.copytree(tiny_checkpoint, tmp_path / name) for name in ("cut", "keyless", "garbled")}
    weights = broken["cut"] / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    config = json.loads((broken["keyless"] / "config.json").read_text())
    del config["hidden_size"]
    (broken["keyless"] / "config.json").write_text(json.dumps(config))
    (broken["garbled"] / "config.json").write_text("{bad")
    (tmp_path / "latin1.txt").write_bytes(b"caf\xe9")
    (tmp_path / "table.npz").write_text("not numpy")
    for args, message in [
        (["--target", broken["cut"]], f"{weights} is not a readable safetensors file"),
        (["--target", broken["keyless"]], "config.json has no 'hidden_size'"),
        (["--target", broken["garbled"]], "config.json is not valid JSON"),
        (["--target", tmp_path / "latin1.txt"], "latin1.txt is neither a checkpoint folder"),
        (["--target", tiny_checkpoint, "--prompt-file", tmp_path / "latin1.txt"], "latin1.txt is not UTF-8 text"),
        (["--target", tiny_checkpoint, "--method", "selfdraft", "--ngram-cache", tmp_path / "table.npz"],
         "table.npz is not an n-gram corpus cache"),
    ]:
        prompt = [] if "--prompt-file" in args else ["x"]
        code, err = specmesh_here("generate", *prompt, *args, "--max-new-tokens", 2)
        assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err


def test_generate_names_the_dtype_auto_chose(tiny_checkpoint, monkeypatch):
    from specmesh.llm import default_dtype
    monkeypatch.delenv("SPECMESH_DTYPE")                 # the suite's float32
    r = specmesh("generate", "x", "--target", tiny_checkpoint, "--method", "ar", "--max-new-tokens", 2,
                 env={"SPECMESH_DTYPE": ""})
    assert r.returncode == 0 and f"[ar, {default_dtype()}]" in r.stderr


def test_options_the_method_does_not_use_are_warned_of(tiny_checkpoint):
    r = specmesh("generate", "x", "--target", tiny_checkpoint, "--method", "ar", "--gamma", "3", "--max-new-tokens", 2)
    assert r.returncode == 0 and "warning: --gamma does not apply to ar: ignored" in r.stderr


def test_settings_from_the_environment_are_named_in_their_errors(tiny_checkpoint, tmp_path):
    (tmp_path / "latin1.jsonl").write_bytes(b"\xff\xfe")
    for args, env, message in [
        (["generate", "x"], {"SPECMESH_TARGET": "nope"}, "$SPECMESH_TARGET: no model named 'nope'"),
        (["tune", "--target", tiny_checkpoint], {"SPECMESH_TUNE_BUDGET_S": "abc"},
         "$SPECMESH_TUNE_BUDGET_S must be a number of seconds >= 0, got 'abc'"),
        (["bench", "--target", tiny_checkpoint, "--methods", "ar", "--prompts", tmp_path / "latin1.jsonl"], {},
         "latin1.jsonl is not UTF-8 text")]:
        r = specmesh(*args, env=env)
        assert r.returncode == 2 and message in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_a_reader_that_leaves_ends_generate_quietly(tiny_checkpoint):
    """`specmesh generate ... | head -c 20`: no traceback when the pipe closes."""
    p = subprocess.Popen([sys.executable, "-m", "specmesh.cli", "generate", "x", "--target", str(tiny_checkpoint),
                          "--max-new-tokens", "50"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=ENV)
    p.stdout.close()                                            # gone before the first token
    assert p.wait(timeout=300) == 1 and b"Traceback" not in p.stderr.read()


def test_max_new_tokens_past_the_context_warns(tiny_checkpoint):
    r = specmesh("generate", "x", "--target", tiny_checkpoint, "--method", "ar", "--max-new-tokens", 10**9, "--json")
    assert r.returncode == 0 and "warning: max_new_tokens 1000000000 runs past the context" in r.stderr, r.stderr


@pytest.mark.parametrize("args, message", [
    (["generate"], "exactly one of PROMPT, --prompt-file or --chat"),
    (["generate", "x", "--chat", "y"], "exactly one of PROMPT, --prompt-file or --chat"),
    (["generate", "--prompt", "y", "--chat", "y"], "exactly one of PROMPT, --prompt-file or --chat"),
    (["generate", "x", "-p", "y"], "give the prompt once: PROMPT or --prompt"),
    (["simulate", "x", "--prompt", "y"], "specmesh simulate: error: give the prompt once: PROMPT or --prompt"),
    (["tune", "--prompt", ""], "prompt is empty"),                        # its text, not a file of that name
    (["generate", "--json", "import os"], "(--json took 'import os' as its PATH: put the prompt before --json)"),
    (["simulate", "--json", "def f():"], "(--json took 'def f():' as its PATH: put the prompt before --json)"),
    (["generate", "--system", "be brief", "x"], "--system goes with --chat"),
    (["generate", "x", "--temperature", "-1"], "temperature must be a finite number >= 0"),
    (["generate", "x", "--temperature", "inf"], "temperature must be a finite number >= 0, got inf"),
    (["generate", "x", "--top-p", "0"], "top_p must be in (0, 1]"),
    (["generate", "x", "--max-new-tokens", "0"], "must be a positive integer"),
    (["generate", "x", "--target", "/no/such/dir"], "checkpoint directory not found"),
    (["generate", "x", "--method", "nope"], "unknown method 'nope'; available: auto, ar"),
    (["generate", "x", "--lam", "-1"], "argument --lam: must be a number >= 0"),
    (["generate", "x", "--method", "pearl", "--logprobs", "2"], "logprobs: pearl does not report"),   # before its ranks
    (["generate", "x", "--method", "pp", "--frequency-penalty", "1"], "frequency_penalty: pp does not apply"),
    (["generate", "x", "--max-step-ms", "-1"], "argument --max-step-ms: must be 0 or more"),
    (["generate", "x", "--device", "tpu"], "unknown device 'tpu'; use cpu, cuda or cuda:N"),
    (["generate", "", "--target", "TINY"], "prompt is empty"),
    (["generate", ""], "prompt is empty"),                  # the embedded pair: before auto measures
    (["generate", "--chat", "hi"], "this model's tokenizer has no chat template"),
    (["generate", "x = 1\n" * 600], "prompt of 2400 tokens does not fit the context of 1024 tokens"),
    (["generate", "--prompt-file", "/no/such/file", "--target", "TINY"], "prompt file not found"),
    (["generate", "--prompt-file", "/", "--target", "TINY"], "prompt file / is a folder"),
    (["generate", "x", "--json", "/"], "argument --json: '/' is a folder: give a file path"),     # before loading
    (["generate", "x", "--json", "/no/such/dir/out.json"], "no folder '/no/such/dir'"),
    (["generate", "x", "--bogus"], "specmesh generate: error: unrecognized arguments: --bogus"),
    (["bench", "--methods", "ar,nope"], "unknown method 'nope'"),
    (["bench", "--methods", "ar,sd@0t"], "sd@0t: NAME@Nt needs N >= 1 threads"),
    (["bench", "--plot", "/no/such/dir/x.png"], "argument --plot: '/no/such/dir/x.png': no folder '/no/such/dir'"),
    (["bench", "--plot", "out.txt"], "argument --plot: 'out.txt': the suffix names the image format"),
    (["ngram", "build", "--corpus", ".", "--out", "/no/such/dir/x.npz"], "argument --out: '/no/such/dir/x.npz'"),
    (["serve", "--port", "99999"], "must be a TCP port from 1 to 65535"),
    (["serve", "--grace", "-1"], "must be 0 or more seconds"),
    (["frobnicate"], "invalid choice"),
])
def test_bad_arguments_exit_2_with_one_line(args, message, tiny_checkpoint):
    code, err = specmesh_here(*[tiny_checkpoint if a == "TINY" else a for a in args])
    assert code == 2
    assert message in err and len(err.strip().splitlines()) == 1, err


def test_help_for_every_subcommand(capsys):
    from specmesh.cli import build_parser
    subs = build_parser()._subparsers._group_actions[0].choices
    assert {"generate", "tune", "models", "bench", "train", "serve", "simulate", "loadtest"} <= set(subs)
    for sub in subs:                                        # in this process: one import of torch, not one each
        with pytest.raises(SystemExit) as exit:
            build_parser().parse_args([sub, "--help"])
        assert exit.value.code == 0 and "usage: specmesh " + sub in capsys.readouterr().out
    assert "usage: specmesh" in specmesh("--help").stdout   # and the entry point itself


def test_tune_measures_prints_candidates_and_caches(tiny_checkpoint, tiny_draft_checkpoint, tmp_path):
    env = ENV | {"SPECMESH_CACHE_DIR": str(tmp_path)}
    args = ["tune", "--target", tiny_checkpoint, "--draft", tiny_draft_checkpoint, "--threads", 1, "--json", "-"]
    r = subprocess.run([sys.executable, "-m", "specmesh.cli", *map(str, args)], capture_output=True, text=True,
                       env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert {c["method"] for c in out["candidates"]} == {"ar", "sd", "tree"} and out["method"] in ("ar", "sd", "tree")
    assert out["reason"].startswith(f"auto: {out['method']}") and "ms/token" in r.stderr
    assert "1 threads" in out["key"]                    # measured for the threads asked (the key names them)
    assert list(json.loads((tmp_path / "tune.json").read_text()).values())[0]["method"] == out["method"]
    r = subprocess.run([sys.executable, "-m", "specmesh.cli", "generate", "def f():", "--target", str(tiny_checkpoint),
                        "--draft", str(tiny_draft_checkpoint), "--max-new-tokens", "4", "--threads", "1",
                        "--json", "-"],
                       capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["auto"]["method"] == out["method"] and "calibrating" not in r.stderr   # cached
    assert f"[{out['method']}, " in r.stderr


def test_bench_methods_and_peers_json_and_plot(tiny_checkpoint, tiny_draft_checkpoint, tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "def foo(x):"}\n{"turns": ["class A:", "ignored"]}\n')
    dest, png = tmp_path / "bench.json", tmp_path / "bench.png"
    methods = ["ar", "hf", "sd", "tree", "easyspec", "auto", "hf-assisted", "hf-pld"]
    r = specmesh("bench", "--methods", ",".join(methods), "--target", tiny_checkpoint, "--draft",
                 tiny_draft_checkpoint, "--prompts", prompts, "--max-new-tokens", 8, "--dtype", "float32",
                 "--gamma", 2, "--layer-groups", 2, "--json", dest, "--plot", png)
    assert r.returncode == 0, r.stderr
    out = json.loads(dest.read_text())
    assert set(out) == {"machine", "date", "commit", "config", "methods", "per_prompt", "memory_bound"}
    assert set(out["memory_bound"]) == {"copy_gb_s", "target_weight_mb", "ar_tokens_per_s_bound"}
    assert out["memory_bound"]["copy_gb_s"] > 0 and "ar's memory bound" in r.stdout
    fields = {"dtype", "threads", "tokens_per_s", "speedup_vs_ar", "speedup_ci95", "tokens_per_forward",
              "acceptance_rate", "mean_accepted_length", "draft_ms_per_step", "verify_ms_per_step", "greedy_equal_to_ar",
              "near_tie_divergences", "prompts", "peak_rss_mb"}
    assert list(out["methods"]) == methods
    for name in methods:
        m = out["methods"][name]
        assert fields <= set(m)
        assert m["greedy_equal_to_ar"] == 2 and m["near_tie_divergences"] == 0 and m["prompts"] == 2
    assert out["methods"]["ar"]["speedup_vs_ar"] == 1.0
    assert out["methods"]["sd"]["speedup_ci95"] is None          # two prompts: too few for an interval
    assert out["methods"]["sd"]["acceptance_rate"] is not None and out["methods"]["ar"]["acceptance_rate"] is None
    assert out["methods"]["easyspec"]["draft_ms_per_step"] > 0 and out["methods"]["ar"]["verify_ms_per_step"] is None
    assert len(out["per_prompt"]) == 2 * len(methods)
    assert out["methods"]["auto"]["chose"] in ("ar", "sd", "tree") and "auto: chose" in r.stdout
    assert png.stat().st_size > 10_000


def test_bench_layer_similarity_table(tiny_checkpoint, tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "def foo(x):\\n    return x + 1\\n" }\n' * 40)
    dest = tmp_path / "sim.json"
    r = specmesh("bench", "--layer-similarity", "--target", tiny_checkpoint, "--draft", tiny_checkpoint,
                 "--prompts", prompts, "--json", dest)
    assert r.returncode == 0, r.stderr
    out = json.loads(dest.read_text())
    assert out["layers"] == 3 and set(out["cosine"]) == {"2", "3"} and "group size" in r.stdout
    assert all(set(row) == {"hidden", "attention"} for row in out["cosine"].values())


def test_many_samples_of_one_prompt_share_its_prefill_in_bounded_memory(tmp_path):
    """`--n 1500` on a 100-token prompt with the embedded target: the prompt's keys and values are computed
    once and copied into the rows of each wave of max_batch samples, so memory does not grow with n times
    the prompt (peak resident memory of the generate process, measured by a parent of its own)."""
    from specmesh.bench.prompts import load_prompts
    from specmesh.model.tokenizer import Tokenizer
    from specmesh import embedded
    tokenizer = Tokenizer.from_dir(embedded.path("target"))
    prompt = tokenizer.decode(tokenizer.encode(load_prompts(None)[0])[:100])
    (tmp_path / "prompt.txt").write_text(prompt)
    out = tmp_path / "out.json"
    cmd = [sys.executable, "-m", "specmesh.cli", "generate", "--prompt-file", str(tmp_path / "prompt.txt"),
           "--method", "ar", "--n", "1500", "--max-new-tokens", "3", "--temperature", "1", "--seed", "0",
           "--json", str(out)]
    rc, peak_mib = run_measured(cmd)
    assert rc == 0
    samples = json.loads(out.read_text())["samples"]
    assert len(samples) == 1500 and all(len(s["tokens"]) == 3 or s["tokens"][-1] == 0 for s in samples)   # 0: eos
    assert len({tuple(s["tokens"]) for s in samples}) > 500           # independent draws
    assert peak_mib < 2048, f"peak resident memory {peak_mib:.0f} MiB"


@pytest.mark.parametrize("argv", [["--help"], ["generate", "--help"], ["bench", "--help"], ["serve", "--help"],
                                  ["models"]])
def test_help_and_models_start_without_torch(argv):
    """The parser is built from specmesh/options.py's declarations alone: `--help` and `models` never load torch
    (nor the methods, kernels or model code), so they answer at once."""
    probe = ("import sys, contextlib, io\nfrom specmesh.cli import main\nout = io.StringIO()\n"
             f"with contextlib.redirect_stdout(out):\n    try:\n        main({argv!r})\n    except SystemExit:\n"
             "        pass\nloaded = sorted(m for m in sys.modules if m == 'torch' or m.startswith('specmesh.'))\n"
             "print(len(out.getvalue()), *loaded)\n")
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    printed, *loaded = r.stdout.split()
    assert int(printed) > 200 and "torch" not in loaded
    assert not any(m.startswith(("specmesh.methods", "specmesh.kernels", "specmesh.engine")) for m in loaded), loaded
