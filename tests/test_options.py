"""The methods' options: one dataclass per method, checked when made; the CLI's flags come from them."""
import dataclasses

import pytest

from specmesh import methods
from specmesh.cli.args import add_method_options
from specmesh.options import CARDS, PearlOptions, SdOptions, declared, table


def test_every_method_has_an_options_dataclass_whose_defaults_are_valid():
    for card in CARDS.values():
        assert dataclasses.is_dataclass(card.options)
        assert dataclasses.asdict(card.options()) == card.defaults
        for f in dataclasses.fields(card.options):
            assert f.metadata["help"], f"{card.name}.{f.name} has no help"


@pytest.mark.parametrize("values, message", [
    ({"gamma": 0}, "gamma must be a positive integer, got 0"),
    ({"gamma": True}, "gamma must be a positive integer, got True"),
    ({"lookup": -1}, "lookup must be a natural number, got -1"),
    ({"stop_below": 1.0}, r"stop_below must be a probability in \[0, 1\), got 1.0"),
])
def test_a_bad_value_is_an_error_naming_the_option(values, message):
    with pytest.raises(ValueError, match=message):
        SdOptions(**values)


def test_bounds_are_each_methods_own():
    assert PearlOptions(gamma=0).gamma == 0                  # pearl: 0 means "by gamma_rule"
    with pytest.raises(ValueError, match="pearl: gamma_rule must be one of measured, c, got 'fast'"):
        methods.get("pearl", {"gamma_rule": "fast"})
    with pytest.raises(ValueError, match="sd: gamma must be a positive integer, got 0"):
        methods.get("sd", {"gamma": 0})
    with pytest.raises(ValueError, match="unknown method option"):
        methods.get("sd", {"gama": 3})


def test_configured_holds_the_dataclass_and_what_was_given():
    sd = methods.get("sd", {"gamma": 6, "routed": 3}, defaults={"stop_below": 0.3})      # routed: cosine's
    assert sd.config == SdOptions(gamma=6, stop_below=0.3) and sd.given == {"gamma"}
    assert sd.options["gamma"] == 6 and sd.slack == 7


def test_the_cli_has_a_flag_per_declared_option():
    import argparse
    p = argparse.ArgumentParser()
    add_method_options(p)
    flags = {a.dest for a in p._actions} - {"help"}
    assert flags == set(declared())
    assert p.parse_args(["--gamma", "0", "--no-fusion"]).gamma == 0      # pearl's bound; sd's is checked by sd
    with pytest.raises(SystemExit):
        p.parse_args(["--calibration", "always"])


def test_the_table_has_a_row_per_option_and_meaning():
    rows = table().splitlines()[2:]
    assert {row.split("`")[1] for row in rows} == {"--" + name.replace("_", "-") for name in declared()}
    assert any("| sd 4 |" in row for row in rows) and any("| tree 5, easyspec 5 |" in row for row in rows)
