"""The multi-host rig's tests (marker ``cluster``): root and the rig's tools needed, and only
when asked (``LSTDP_CLUSTER=1`` or ``-m cluster``), so ``make test`` does not run them;
``benchmarks/cluster.py`` runs the rig with its services and faults."""

import os

import pytest

from tests.cluster.rig import missing_tools


def pytest_collection_modifyitems(config, items):
    asked = os.environ.get("LSTDP_CLUSTER") == "1" or "cluster" in (config.getoption("-m") or "")
    why = (None if asked else "the rig runs only when asked: LSTDP_CLUSTER=1 or -m cluster")
    if why is None and os.geteuid() != 0:
        why = "the rig needs root"
    if why is None and missing_tools():
        why = f"missing {missing_tools()}: scripts/ensure-rig.sh"
    for item in items:
        if "tests/cluster/" in str(item.fspath):
            item.add_marker(pytest.mark.cluster)
            if why:
                item.add_marker(pytest.mark.skip(reason=why))
