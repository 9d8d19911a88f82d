"""The environment variables: declared once (specmesh/settings.py), read nowhere else, checked with an error naming
the variable."""
import re
from pathlib import Path

import pytest

from specmesh import settings as settings_module
from specmesh.settings import settings

SRC = Path(__file__).parents[1] / "src" / "specmesh"
DECLARED = set(re.findall(r"\| (SPECMESH_[A-Z0-9_]+) \|", settings_module.__doc__))


def test_every_variable_the_source_names_is_declared_and_documented():
    named = {name for p in SRC.rglob("*.py") for name in re.findall(r"SPECMESH_[A-Z0-9_]+", p.read_text())}
    assert named - DECLARED == {"SPECMESH_WORKER"}          # a launched worker's orders, not a setting
    usage = (SRC.parents[1] / "docs" / "usage.md").read_text()
    assert [v for v in sorted(DECLARED) if v not in usage] == []


def test_only_the_settings_module_reads_them():
    readers = [f"{p.relative_to(SRC)}: {line.strip()}" for p in SRC.rglob("*.py") if p.name != "settings.py"
               for line in p.read_text().splitlines()
               if re.search(r"environ(\.get)?\W+[\"']SPECMESH_(?!WORKER)|getenv\([\"']SPECMESH_", line)]
    assert readers == []


def test_values_are_read_and_checked(monkeypatch):
    monkeypatch.setenv("SPECMESH_TUNE_BUDGET_S", "2.5")
    monkeypatch.setenv("SPECMESH_KERNELS", "no-amx, dp")
    s = settings()
    assert s.tune_budget_s == 2.5 and s.kernel("amx") is False and s.kernel("dp") is True and s.kernel("fma") is None
    for name, value, message in [("SPECMESH_TUNE_BUDGET_S", "soon", "TUNE_BUDGET_S must be a number"),
                                 ("SPECMESH_DTYPE", "half", "DTYPE must be one of"),
                                 ("SPECMESH_KERNELS", "no-avx", "unknown switch 'no-avx'"),
                                 ("SPECMESH_KERNELS", "dp,no-dp", "dp and no-dp")]:
        monkeypatch.setenv(name, value)
        with pytest.raises(ValueError, match=message):
            settings()
        monkeypatch.delenv(name)
