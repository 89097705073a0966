"""``lstdp fsck``: the database and the stores compared both ways, and the safe repairs.

A store of real products (simulated WST frames and masters, ingested and calibrated in
this process by ``calibrate_product`` on SQLite) is broken in each way the command looks
for; fsck must find exactly those, ``--repair`` fix the safe ones, and a second fsck find
only what it reports without repairing (then nothing once that is fixed by hand).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
import time
from pathlib import Path

import pytest
from sqlalchemy import select

from backend.models import CalibrationFile, Frame, Product, ProductState

N_FRAMES = 7
#: mtime of the files made "old" [s ago]: over the partial threshold and the lease (3600 s, 960 s)
OLD_S = 2 * 3600


@pytest.fixture(scope="module")
def simulated(tmp_path_factory):
    from pipelines.simulation import simulate

    out = tmp_path_factory.mktemp("fsck_sim")
    return simulate(out, channels=("WST",), naxis=64, noise=False, seed=7, sdi_sequence=False,
                    frames_per_channel=N_FRAMES)


@pytest.fixture
def store(sqlite_env, simulated):
    """``sqlite_env`` with N_FRAMES written products; returns (settings, product ids)."""
    from backend.db import session_scope
    from backend.services.ingest import ingest_path
    from backend.worker.processing import calibrate_product, plan_product

    with session_scope() as s:
        for p in [c.path for c in simulated.calibration_files] + list(simulated.raw_files):
            out = ingest_path(s, p, sqlite_env, move=False)
            assert out.status in ("ingested", "calibration"), out
    with session_scope() as s:
        ids = [plan_product(s, f, pinned=None, options={}, job_id=None)[0].id
               for f in s.scalars(select(Frame).order_by(Frame.id))]
    with session_scope() as s:
        for pid in ids:
            prod = calibrate_product(s, pid, sqlite_env)
            assert prod.state == ProductState.written, prod.error
    return sqlite_env, ids


def _fsck(settings, **kw):
    from backend.db import session_scope
    from backend.services.fsck import run_fsck

    with session_scope() as s:
        return run_fsck(s, settings, **kw)


def _cli(capsys, *args) -> tuple[int, str]:
    from backend.cli import main

    capsys.readouterr()
    rc = main(["fsck", *args])
    return rc, capsys.readouterr().out


def _age(path: Path, seconds: float) -> None:
    t = time.time() - seconds
    os.utime(path, (t, t))


def _rows(ids):
    from backend.db import session_scope

    with session_scope() as s:
        return {p.id: (p.state, p.error, p.path, p.quicklook_path, p.sha256)
                for p in s.scalars(select(Product).where(Product.id.in_(ids)))}


def test_written_products_leave_no_temporary_file_and_the_store_is_clean(store, capsys):
    settings, ids = store
    from backend.services.fsck import PRODUCT_NAME
    from pipelines.fitsio import store_tmp_dir

    rows = _rows(ids)
    files = sorted(p for p in settings.products.rglob("*") if p.is_file())
    assert files == sorted(Path(r[k]) for r in rows.values() for k in (2, 3))  # FITS and PNG, nothing else
    assert all(PRODUCT_NAME.match(f.name) for f in files)  # the names fsck matches to rows
    assert store_tmp_dir(settings.products).is_dir() and list(store_tmp_dir(settings.products).iterdir()) == []
    report = _fsck(settings)
    assert report.clean and report.findings == []
    assert report.checked == {"products": N_FRAMES, "product_files": 2 * N_FRAMES, "temporary_files": 0,
                              "frames": N_FRAMES, "calibration_files": 4}
    from backend.db import session_scope

    with session_scope() as s:  # every product FITS, raw frame and master read once
        hashed = [r[2] for r in rows.values()] + list(s.scalars(select(Frame.path))) + \
            list(s.scalars(select(CalibrationFile.path)))
    assert report.bytes_hashed == sum(os.path.getsize(p) for p in hashed)
    rc, out = _cli(capsys)
    assert rc == 0 and "clean: the database and the disk agree" in out
    assert f"checked {N_FRAMES} products, {2 * N_FRAMES} product files" in out


def _break_store(settings, ids, tmp_path):
    """Break the store in each way; returns what fsck must find, {(kind, row or path)}."""
    from backend.db import session_scope
    from backend.state import move_product
    from pipelines.fitsio import store_tmp_dir

    rows = _rows(ids)
    p_missing, p_flipped, p_noql, p_outside, p_failed = ids[:5]
    Path(rows[p_missing][2]).unlink()  # 1. a product FITS deleted
    flipped = Path(rows[p_flipped][2])  # 2. one byte flipped in the data of another
    raw = bytearray(flipped.read_bytes())
    raw[-100] ^= 0xFF
    flipped.write_bytes(bytes(raw))
    flipped_bytes = bytes(raw)
    ql = Path(rows[p_noql][3])  # 3. a quicklook deleted
    ql_bytes = ql.read_bytes()
    ql.unlink()
    outside = tmp_path / "elsewhere" / Path(rows[p_outside][2]).name  # 4. a row pointing outside
    outside.parent.mkdir()
    shutil.move(rows[p_outside][2], outside)
    day_dir = Path(rows[ids[0]][2]).parent
    orphan = day_dir / "lst_wst_l2_20101015T230011_f999_v1.fits"  # 5. a FITS no row names
    shutil.copy(rows[ids[5]][2], orphan)
    _age(orphan, OLD_S)
    stray = day_dir / "notes.fits"  # ... and one with no product name at all
    stray.write_bytes(b"SIMPLE  =                    T")
    tmp = store_tmp_dir(settings.products)  # 6. temporary files of killed writes, and a live one
    killed = tmp / "lst_wst_l2_x_f1_v1.fits.abc.part"
    killed.write_bytes(b"half")
    _age(killed, OLD_S)
    old_style = day_dir / ".lst_wst_l2_y.fits.def.part"
    old_style.write_bytes(b"")
    _age(old_style, OLD_S)
    live = tmp / "lst_wst_l2_z_f2_v1.fits.ghi.part"
    live.write_bytes(b"in progress")
    with session_scope() as s:  # 4, 7: the row moved outside; a product failed whose files remain
        s.get(Product, p_outside).path = str(outside)
        move_product(s.get(Product, p_failed), ProductState.failed, "test: failed after writing")
        frame = s.scalars(select(Frame).order_by(Frame.id.desc())).first()
        frame_path = Path(frame.path)
        cal = s.scalars(select(CalibrationFile).order_by(CalibrationFile.id)).first()
        cal_id, cal_path = cal.id, Path(cal.path)
    for f in (rows[p_failed][2], rows[p_failed][3]):
        _age(Path(f), OLD_S)
    frame_bytes = frame_path.read_bytes()  # 8. a raw frame missing, a master changed
    frame_path.unlink()
    cal_bytes = cal_path.read_bytes()
    cal_path.write_bytes(cal_bytes + b"\0" * 2880)
    expected = {
        ("missing_file", f"product {p_missing}"),
        ("checksum_mismatch", f"product {p_flipped}"),
        ("missing_quicklook", f"product {p_noql}"),
        ("outside_store", f"product {p_outside}"),
        ("orphan_file", str(orphan)), ("orphan_file", str(stray)),
        ("unwritten_file", rows[p_failed][2]), ("unwritten_file", rows[p_failed][3]),
        ("partial_file", str(killed)), ("partial_file", str(old_style)),
        ("in_progress", str(live)),
        ("frame_missing", f"frame {frame.id}"),
        ("calibration_mismatch", f"calibration file {cal_id}"),
    }
    restore = {"outside": (p_outside, outside, rows[p_outside][2]), "frame": (frame_path, frame_bytes),
               "cal": (cal_path, cal_bytes), "ql": (ql, ql_bytes), "orphan": orphan, "flipped": flipped, "flipped_bytes": flipped_bytes,
               "live": live, "killed": killed, "old_style": old_style, "stray": stray}
    return expected, restore


def _found(report):
    return {(f.kind, f.row if f.kind not in ("orphan_file", "unwritten_file", "partial_file", "in_progress")
             else f.path) for f in report.findings}


def test_fsck_finds_each_break_and_repair_fixes_the_safe_ones(store, tmp_path, capsys):
    from backend.services.fsck import MISSING_REASON

    settings, ids = store
    expected, restore = _break_store(settings, ids, tmp_path)
    p_missing, p_flipped, p_noql, p_outside, p_failed = ids[:5]
    before = _rows(ids)

    report = _fsck(settings)
    assert _found(report) == expected
    assert not report.clean and len(report.problems) == len(expected) - 1  # in_progress is no problem
    assert _rows(ids) == before and restore["orphan"].exists() and restore["killed"].exists()  # nothing changed

    rc, out = _cli(capsys, "--json")
    body = json.loads(out)
    assert rc == 1 and body["clean"] is False and body["repaired"] is False
    assert body["problems"] == body["remaining"] == len(expected) - 1
    assert {(f["kind"], f["problem"]) for f in body["findings"]} >= {("in_progress", False), ("missing_file", True)}
    assert len(body["findings"]) == len(expected)
    rc, out = _cli(capsys)
    assert rc == 1 and f"missing_file: product {p_missing}: FITS missing on disk" in out
    assert "`lstdp fsck --repair` repairs the safe ones" in out

    rc, out = _cli(capsys, "--repair")
    assert rc == 1  # the row outside the store, the missing frame and the changed master remain
    assert "problem(s): 9 repaired, 3 remain" in out, out
    rows = _rows(ids)
    assert rows[p_missing][:2] == (ProductState.failed, MISSING_REASON)
    assert rows[p_flipped][0] == ProductState.failed
    assert rows[p_flipped][1].startswith("file differs from its SHA-256 (") and "found by lstdp fsck" in rows[p_flipped][1]
    assert rows[p_noql][0] == ProductState.written and restore["ql"][0].read_bytes() == restore["ql"][1]  # same PNG
    assert rows[p_outside] == before[p_outside]  # reported only
    assert rows[p_failed][:2] == (ProductState.failed, "test: failed after writing")
    for pid in ids[5:]:
        assert rows[pid] == before[pid]
    # science files are quarantined with their reason, never deleted
    qdir = settings.quarantine / "fsck"
    kept = sorted(p.name.split("_", 1)[1] for p in qdir.iterdir() if not p.name.endswith(".reason"))
    names = [Path(before[p_missing][3]).name, Path(before[p_flipped][2]).name, Path(before[p_flipped][3]).name,
             restore["orphan"].name, "notes.fits", Path(before[p_failed][2]).name, Path(before[p_failed][3]).name]
    assert kept == sorted(names)
    flipped_q = next(qdir.glob(f"*_{restore['flipped'].name}"))
    assert flipped_q.read_bytes() == restore["flipped_bytes"]  # the damaged file kept as it was
    assert "file differs from its SHA-256" in flipped_q.with_name(flipped_q.name + ".reason").read_text()
    assert str(restore["orphan"]) in next(qdir.glob(f"*_{restore['orphan'].name}.reason")).read_text()
    assert not restore["killed"].exists() and not restore["old_style"].exists() and restore["live"].exists()

    again = _fsck(settings)
    assert _found(again) == {("outside_store", f"product {p_outside}"), ("in_progress", str(restore["live"])),
                             ("frame_missing", next(r for k, r in expected if k == "frame_missing")),
                             ("calibration_mismatch", next(r for k, r in expected if k == "calibration_mismatch"))}

    # fixed by hand: the file back in the store, the frame restored, the master restored
    pid, outside, inside = restore["outside"]
    shutil.move(outside, inside)
    from backend.db import session_scope

    with session_scope() as s:
        s.get(Product, pid).path = inside
    restore["frame"][0].write_bytes(restore["frame"][1])
    restore["cal"][0].write_bytes(restore["cal"][1])
    restore["live"].unlink()
    rc, out = _cli(capsys)
    assert rc == 0 and "clean" in out, out


def test_a_failed_product_is_made_again_by_the_next_plan(store):
    """The repair's point: a product failed by fsck is re-planned and written again."""
    from backend.db import session_scope
    from backend.worker.processing import calibrate_product, plan_product

    settings, ids = store
    before = _rows(ids)[ids[0]]
    Path(before[2]).unlink()
    assert _fsck(settings, repair=True).clean
    with session_scope() as s:
        prod = s.get(Product, ids[0])
        again, new = plan_product(s, prod.frame, pinned=None, options={}, job_id=None)
        assert new and again.id == ids[0] and again.state == ProductState.planned
    with session_scope() as s:
        assert calibrate_product(s, ids[0], settings).state == ProductState.written
    after = _rows(ids)[ids[0]]
    assert after[0] == ProductState.written and after[1] is None and after[2] == before[2]  # the same file name
    assert _fsck(settings).findings == []


def test_files_of_products_being_written_are_reported_not_repaired(store):
    """A product ``writing`` within the lease, or a file changed within it, may be a live
    write: reported, left alone; the same once the lease has passed is repaired."""
    from backend.db import session_scope
    from backend.state import move_product

    settings, ids = store
    rows = _rows(ids)
    writing, replanned = ids[0], ids[1]
    with session_scope() as s:
        for pid in (writing, replanned):
            move_product(s.get(Product, pid), ProductState.failed, "test")
        move_product(s.get(Product, writing), ProductState.writing)
        move_product(s.get(Product, replanned), ProductState.planned)
    # the planned product's files were just written (young); the writing one's are old
    for k in (2, 3):
        _age(Path(rows[writing][k]), OLD_S)
    report = _fsck(settings, repair=True)
    got = {(f.kind, f.path): (f.action, f.repaired) for f in report.findings}
    assert got[("in_progress", rows[writing][2])] == (None, False)
    action, repaired = got[("unwritten_file", rows[replanned][2])]
    assert not repaired and action.startswith("left alone: modified") and "a worker may be writing it" in action
    assert all(Path(rows[pid][k]).exists() for pid in (writing, replanned) for k in (2, 3))
    assert not report.clean and len(report.remaining) == 2  # the planned product's FITS and PNG

    # an hour later: the writing product is lost (the reaper's business: its files are
    # quarantined), the planned product's files are old enough to move
    later = dt.datetime.now(dt.UTC) + dt.timedelta(hours=2)
    report = _fsck(settings, repair=True, now=later)
    assert {f.kind for f in report.findings} == {"unwritten_file"} and len(report.findings) == 4
    assert all(f.repaired for f in report.findings), [f.action for f in report.findings]
    assert not any(Path(rows[pid][k]).exists() for pid in (writing, replanned) for k in (2, 3))
    assert _fsck(settings, now=later).clean


def test_an_empty_store_fails_no_product(store, capsys):
    """Every product file gone (an unmounted PRODUCT_DIR looks like that): reported, and no
    product is failed, which would recompute them all."""
    settings, ids = store
    before = _rows(ids)
    for r in before.values():
        for k in (2, 3):
            Path(r[k]).unlink()
    rc, out = _cli(capsys, "--repair")
    assert rc == 1 and f"{N_FRAMES} problem(s): 0 repaired, {N_FRAMES} remain" in out
    assert "is it mounted (PRODUCT_DIR)?" in out
    assert _rows(ids) == before


def test_without_checksums_only_presence_is_checked(store, capsys):
    settings, ids = store
    rows = _rows(ids)
    flipped = Path(rows[ids[0]][2])
    raw = bytearray(flipped.read_bytes())
    raw[-100] ^= 0xFF
    flipped.write_bytes(bytes(raw))
    Path(rows[ids[1]][2]).unlink()
    quick = _fsck(settings, checksums=False)
    assert _found(quick) == {("missing_file", f"product {ids[1]}")} and quick.bytes_hashed == 0
    rc, out = _cli(capsys, "--no-checksums", "--json")
    assert rc == 1 and json.loads(out)["checksums"] is False
    assert _found(_fsck(settings)) == {("missing_file", f"product {ids[1]}"), ("checksum_mismatch", f"product {ids[0]}")}


@pytest.mark.postgres
def test_rows_without_files_on_postgresql(db_session, settings_env, tmp_path):
    """The queries on PostgreSQL (aware timestamps): a written product and a frame with no
    file, a product being written now with its file there."""
    import hashlib
    import uuid

    from backend.services.fsck import check_store

    settings = settings_env()
    key = uuid.uuid4().hex
    frame = Frame(channel_code="SDI", date_obs=dt.datetime(2024, 5, 14, 16, tzinfo=dt.UTC), exposure_s=1.0,
                  naxis1=64, naxis2=64, path=f"/nonexistent/{key}.fits", original_name="x.fits",
                  sha256=hashlib.sha256(key.encode()).hexdigest(), size_bytes=1, header={})
    db_session.add(frame)
    db_session.flush()
    lost = Product(frame_id=frame.id, version=1, calibration_key="k1", params_hash="h", software_version="t",
                   state=ProductState.written, path=str(settings.products / "SDI" / "a.fits"), sha256="0" * 64)
    busy = Product(frame_id=frame.id, version=2, calibration_key="k2", params_hash="h", software_version="t",
                   state=ProductState.writing)
    db_session.add_all([lost, busy])
    db_session.flush()
    busy_file = settings.products / "SDI" / f"lst_sdi_l2_20240514T160000_f{frame.id}_v2.fits"
    busy_file.parent.mkdir(parents=True)
    busy_file.write_bytes(b"")
    report = check_store(db_session, settings)
    mine = {f"product {lost.id}", f"product {busy.id}", str(busy_file), f"frame {frame.id}"}
    assert {x for x in _found(report) if x[1] in mine} == {("missing_file", f"product {lost.id}"), ("in_progress", str(busy_file)),
                              ("frame_missing", f"frame {frame.id}")}
