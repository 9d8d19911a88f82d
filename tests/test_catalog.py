"""Models by name: the embedded pair, names resolved to paths, the draft made for a target, the served id."""
import pytest

from specmesh import catalog, embedded


def test_names_resolve_to_the_embedded_pair():
    assert catalog.resolve(None) == catalog.resolve("embedded") == catalog.resolve("specmesh-target") \
        == embedded.path("target")
    assert catalog.resolve("embedded", "draft") == catalog.resolve("specmesh-draft") == embedded.path("draft")
    assert catalog.draft_for(embedded.path("target")) == embedded.path("draft")


def test_a_path_stays_a_path_and_an_unknown_name_is_named(tmp_path):
    assert catalog.resolve(tmp_path / "model.gguf") == tmp_path / "model.gguf"
    assert catalog.draft_for(tmp_path) is None
    with pytest.raises(FileNotFoundError, match="no model named 'llama-70b' here.*known: specmesh-target"):
        catalog.resolve("llama-70b")


def test_served_name(tmp_path):
    assert catalog.served_name(None) == "specmesh-target"
    assert catalog.served_name("specmesh-draft") == "specmesh-draft"
    assert catalog.served_name(tmp_path / "Qwen2-0.5B.Q8_0.gguf") == "Qwen2-0.5B.Q8_0"
    assert catalog.served_name(tmp_path) == tmp_path.name
