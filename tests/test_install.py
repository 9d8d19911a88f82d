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
