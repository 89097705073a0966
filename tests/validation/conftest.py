"""The campaign suite: tests of :mod:`validation` (simulated worlds with known truth, the
calibration gates and the blind campaigns), marked ``validation``.

Every test collected from this folder gets the marker, so ``pytest -m validation`` runs the
campaigns alone and ``pytest -m "not validation"`` the everyday suite; plain ``pytest`` (and
``make test``) runs both.
"""

from __future__ import annotations

from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark every test of ``tests/validation/`` ``validation`` (only those: the hook sees the
    whole session's items)."""
    for item in items:
        if HERE in Path(str(item.path)).resolve().parents:
            item.add_marker(pytest.mark.validation)
