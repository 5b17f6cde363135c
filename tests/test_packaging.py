"""Packaging facts the README and docs rely on."""

import pathlib
import tomllib

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_the_notebook_extra_installs_a_jupyter_front_end():
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert any(dep.startswith("jupyterlab") for dep in extras["notebook"])
    assert "'.[notebook]'" in (ROOT / "docs" / "index.md").read_text()
