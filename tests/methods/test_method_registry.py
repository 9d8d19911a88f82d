"""The methods' registry: every declared method (options.CARDS) is found where methods.WHERE says, under its own
name, and asking for one imports only its own modules (a run of `ar` starts without the others)."""
import subprocess
import sys

from specmesh.methods import METHODS, WHERE
from specmesh.options import CARDS


def test_every_card_has_its_spec():
    assert list(METHODS) == list(CARDS) == list(WHERE)
    assert [METHODS[name].name for name in CARDS] == list(CARDS)


def test_asking_for_ar_imports_no_other_method():
    code = ("import sys; from specmesh import methods; methods.get('ar'); "
            "print(sorted(m for m in sys.modules if m.startswith('specmesh.methods.')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert eval(out) == ["specmesh.methods.ar", "specmesh.methods.base"]
