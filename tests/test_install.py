"""A wheel built from the tree (a non-editable install): it carries the C sources, lists the models it can
reach, runs the default model, and says in one line what to do for the embedded ones that only a clone holds. It
runs on the core alone, as the README's first command installs it (`pip install -e .`): every extra's modules are
made unimportable in the processes that answer."""
import os
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXTRAS = ("scipy", "transformers", "accelerate", "matplotlib", "fastapi", "uvicorn", "prometheus_client", "aiohttp",
          "httpx", "openai", "simdjson", "llama_cpp", "pytest")        # the [test] extra's, none of them the core's
ABSENT = ("class Absent:\n    def find_spec(self, name, path=None, target=None):\n"
          f"        if name.split('.')[0] in {EXTRAS!r}:\n"
          "            raise ModuleNotFoundError(f'No module named {name!r}', name=name)\n"
          "sys.meta_path.insert(0, Absent())\n")


def test_a_wheel_built_from_the_tree_runs_on_the_core_alone_and_names_what_it_lacks(tmp_path):
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
        code = (f"import sys\n{ABSENT}sys.path.insert(0, {str(site)!r})\n"
                f"from specmesh.cli import main\nsys.exit(main({list(argv)!r}))")
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
    smollm2 = run("generate", "--max-new-tokens", "4", "--chat", "Name a color.")
    assert smollm2.returncode == 0, smollm2.stderr[-2000:]
    assert "[ar, " in smollm2.stderr and "4 tokens" in smollm2.stderr
