"""The multi-host rig's tests (marker ``cluster``): root and the rig's tools needed, and only
when asked (``LSTDP_CLUSTER=1`` or ``-m cluster``), so ``make test`` does not run them;
``benchmarks/cluster.py`` runs the rig with its services and faults."""

import os

import pytest

from tests.cluster.rig import missing_tools


def pytest_collection_modifyitems(config, items):
    asked = os.environ.get("LSTDP_CLUSTER") == "1" or "cluster" in (config.getoption("-m") or "")
    why = None
    if os.geteuid() != 0:
        why = "the rig needs root"
    elif missing_tools():
        why = f"missing {missing_tools()}: scripts/ensure-rig.sh"
    for item in items:
        if "tests/cluster/" in str(item.fspath):
            item.add_marker(pytest.mark.cluster)
            # the rig's own network, faults and teardown (about 11 s) run in every suite that can
            # make namespaces; the multi-minute job through the rig only when asked
            job = "test_cluster_job" in str(item.fspath)
            skip = why or (None if asked or not job else
                           "the job through the rig (minutes) runs only when asked: LSTDP_CLUSTER=1 or -m cluster")
            if skip:
                item.add_marker(pytest.mark.skip(reason=skip))
