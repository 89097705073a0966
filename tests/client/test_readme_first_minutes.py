"""The README's "Your first five minutes" runs as written (issue 25, point 6): its Python
blocks are taken from README.md itself and executed against a live server of ours
(``tests/client/conftest.py``), with only the server address and the dates changed to the
live fixture's data (its SDI frames are of 2004-03-01). The offline Fido block runs with
sunpy's VSO client made to fail, as it would without the internet."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from sunpy.net.vso import VSOClient

pytestmark = pytest.mark.slow

README = Path(__file__).resolve().parents[2] / "README.md"


def _first_minutes_blocks() -> list[str]:
    text = README.read_text()
    section = text.split("## Your first five minutes", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", section, flags=re.S)


def test_readme_opens_with_the_first_five_minutes():
    text = README.read_text()
    first = text.index("\n## ")
    assert text[first:].startswith("\n## Your first five minutes"), "the README must open with the user's first steps"
    assert len(_first_minutes_blocks()) == 2


def test_readme_python_blocks_run_against_a_live_server(live, monkeypatch, tmp_path):
    def _no_vso(*args, **kwargs):
        raise AssertionError("the README's offline Fido asked VSO")

    monkeypatch.setattr(VSOClient, "__init__", _no_vso)
    monkeypatch.setenv("LSTDP_URL", live.url)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("builtins.print", lambda *a, **k: None)
    spaces = []
    for block in _first_minutes_blocks():
        code = (block.replace("http://127.0.0.1:8000", live.url)
                .replace("2011-06-07", "2004-03-01").replace("2011-06-08", "2004-03-02"))
        ns: dict = {}
        exec(compile(code, "README.md", "exec"), ns)  # noqa: S102 - the README's own example
        spaces.append(ns)
    client_ns, fido_ns = spaces
    assert len(client_ns["prods"]) >= 1 and len(client_ns["files"]) == min(2, len(client_ns["prods"]))
    assert all(Path(f).stat().st_size > 0 for f in client_ns["files"])
    assert len(fido_ns["res"][0]) >= 1 and not fido_ns["files"].errors
