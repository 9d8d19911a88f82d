"""A wheel built from the tree (a non-editable install): it carries the C sources, lists the models it can
reach, runs the default model, and says in one line what to do for the embedded ones that only a clone holds."""
import os
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_a_wheel_built_from_the_tree_runs_models_and_names_what_it_lacks(tmp_path):
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                            str(tmp_path / "dist"), str(ROOT)], capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stderr[-2000:]
    (wheel,) = (tmp_path / "dist").glob("specmesh-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert {"specmesh/csrc/blocks.c", "specmesh/csrc/blocks512.c", "specmesh/csrc/blocks.h"} <= set(names)
    site = tmp_path / "site"
    install = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(site),
                              str(wheel)], capture_output=True, text=True, timeout=300)
    assert install.returncode == 0, install.stderr[-2000:]

    def run(*argv):
        code = f"import sys; sys.path.insert(0, {str(site)!r}); from specmesh.cli import main; sys.exit(main({list(argv)!r}))"
        caches = {k: os.environ[k] for k in ("SPECMESH_KERNEL_DIR", "SPECMESH_CACHE_DIR") if k in os.environ}
        return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                              cwd=tmp_path, env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)} | caches)
    models = run("models")
    assert models.returncode == 0, models.stderr
    assert "smollm2-135m-instruct" in models.stdout and str(site) not in models.stderr
    embedded = run("generate", "--target", "embedded", "--method", "ar", "hi")
    assert embedded.returncode == 2 and embedded.stderr.count("\n") == 1
    assert "embedded target model not found" in embedded.stderr and "SPECMESH_HOME" in embedded.stderr
    # the default model: its file from the registry (or the cache), without its draft (a clone's): auto runs ar
    smollm2 = run("generate", "--max-new-tokens", "4", "The capital of France is")
    assert smollm2.returncode == 0, smollm2.stderr[-2000:]
    assert "[ar, " in smollm2.stderr and "4 tokens" in smollm2.stderr


EXTRAS = ("scipy", "transformers", "accelerate", "matplotlib", "fastapi", "uvicorn", "prometheus_client", "aiohttp",
          "httpx", "openai", "simdjson", "llama_cpp", "pytest")        # the [test] extra's, none of them the core's


def test_the_readmes_first_command_needs_only_the_core():
    """The README's first command installs the core alone (`pip install -e .`): its answer must not import what
    only an extra brings. Each extra's modules are made unimportable in the process that answers."""
    probe = ("import sys\nclass Absent:\n    def find_spec(self, name, path=None, target=None):\n"
             f"        if name.split('.')[0] in {EXTRAS!r}:\n"
             "            raise ModuleNotFoundError(f'No module named {name!r}', name=name)\n"
             "sys.meta_path.insert(0, Absent())\nfrom specmesh.cli import main\n"
             "sys.exit(main(['generate', '--chat', 'Name a color.', '--max-new-tokens', '4', '--no-tune']))\n")
    default_target = {k: v for k, v in os.environ.items() if k != "SPECMESH_TARGET"}
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300, env=default_target)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "4 tokens" in r.stderr, r.stderr[-2000:]
