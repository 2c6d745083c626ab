"""docs/configuration.md is generated from the config's field docs and checked in: it must be
current, and every field must have an entry with a documentation line."""

import dataclasses

from hpcrl.config import Config
from hpcrl.tools import config_reference


def test_every_field_has_documentation_and_an_entry():
    text = config_reference.render()
    for f in dataclasses.fields(Config):
        assert f.metadata.get("doc", "").strip(), f"config field {f.name} has no doc"
        assert f"| `{f.name}` |" in text, f"config field {f.name} missing from the reference"
    placed = [f.name for _, fields in config_reference.sections() for f in fields]
    assert sorted(placed) == sorted(f.name for f in dataclasses.fields(Config))


def test_checked_in_reference_is_current():
    assert config_reference.DEFAULT_PATH.read_text() == config_reference.render(), (
        "docs/configuration.md is out of date: run python -m hpcrl.tools.config_reference")
    assert config_reference.main(["--check"]) == 0


def test_check_fails_on_a_stale_file(tmp_path):
    stale = tmp_path / "configuration.md"
    stale.write_text("# old\n")
    assert config_reference.main(["--check", "-o", str(stale)]) == 1
    assert config_reference.main(["-o", str(stale)]) == 0
    assert config_reference.main(["--check", "-o", str(stale)]) == 0
