"""The suite's own machinery in tests/conftest.py: data built once per test run and shared
read-only (``RunCache``, ``simulated_dataset``), and the xdist work units."""

from __future__ import annotations

import multiprocessing
import time

import pytest

from tests.conftest import RunCache, _simulation_params, xdist_work_unit


def _build_slowly(folder):
    """A build that takes a while and counts itself in ``folder/../builds.log``."""
    with open(folder.parent.parent / "builds.log", "a") as log:
        log.write(f"{folder}\n")
    time.sleep(0.5)
    (folder / "a.txt").write_text("built")


def _get(root: str, out) -> None:
    from pathlib import Path

    out.put(str(RunCache(Path(root)).get("k", _build_slowly)))


def test_two_processes_asking_at_once_build_once_and_read_the_same_folder(tmp_path):
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    procs = [ctx.Process(target=_get, args=(str(tmp_path), out)) for _ in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    folders = {out.get(timeout=5), out.get(timeout=5)}
    assert len(folders) == 1
    assert len((tmp_path / "builds.log").read_text().splitlines()) == 1
    assert (tmp_path / "k" / "data" / "a.txt").read_text() == "built"


def test_an_interrupted_build_is_made_again(tmp_path):
    (tmp_path / "k" / "data").mkdir(parents=True)  # no digests.json: the build did not finish
    (tmp_path / "k" / "data" / "partial.txt").write_text("half")
    data = RunCache(tmp_path).get("k", _build_slowly)
    assert sorted(p.name for p in data.iterdir()) == ["a.txt"]


def test_verify_names_a_file_a_test_changed_added_or_removed(tmp_path):
    cache = RunCache(tmp_path)
    data = cache.get("k", _build_slowly)
    cache.verify()
    (data / "a.txt").write_text("changed")
    with pytest.raises(AssertionError, match="a.txt"):
        cache.verify()
    (data / "a.txt").write_text("built")
    (data / "new.txt").write_text("")
    with pytest.raises(AssertionError, match="new.txt"):
        cache.verify()
    (data / "new.txt").unlink()
    (data / "a.txt").unlink()
    with pytest.raises(AssertionError, match="a.txt"):
        cache.verify()


def test_simulation_parameters_that_differ_only_in_spelled_out_defaults_are_one_dataset():
    short = _simulation_params({"naxis": 128, "noise": True, "seed": 3})
    spelled = _simulation_params({"channels": ("SDI", "WST", "SCI-UV", "SCI-WL"), "naxis": 128, "noise": True,
                                  "seed": 3, "sdi_sequence": True, "frames_per_channel": 1})
    assert short == spelled
    assert _simulation_params({"naxis": 128, "noise": True, "seed": 4}) != short
    with pytest.raises(TypeError):
        _simulation_params({"naxes": 128})


def test_work_units_are_files_except_the_packages_run_whole():
    assert xdist_work_unit("tests/test_ingest.py::test_a[1-2]") == "tests/test_ingest.py"
    assert xdist_work_unit("tests/test_api.py::TestX::test_y") == "tests/test_api.py"
    assert xdist_work_unit("tests/client/test_fido.py::test_z") == "tests/client"
    assert xdist_work_unit("tests/faults/test_poison.py::test_p") == "tests/faults"
