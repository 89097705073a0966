"""A short job across the rig (issue 28): a worker host killed whole and started again under
the same name, another partitioned then healed, on the S3 store. Nothing may be lost or
duplicated, and ``lstdp fsck`` must find no orphan. Minutes long: opt-in (conftest)."""

import pytest

pytestmark = pytest.mark.cluster


def test_job_survives_host_kill_and_partition(capsys):
    from benchmarks import cluster as C

    args = C.parser().parse_args(["--frames", "18", "--faults", "host_kill,same_name_restart,partition",
                                  "--partition-s", "20", "--frame-delay", "3"])
    out = C.run(args)
    assert out["faults"][:2] == ["host_kill", "same_name_restart"]  # the job outlasts them (frame delay)
    assert out["frames"] == 18
    assert out["lost"] == 0, out["details"]
    assert out["duplicated"] == 0, out["details"]
    assert out["orphans"] == 0 and out["fsck_rc"] == 0, capsys.readouterr().out[-3000:]
