"""The default torch thread count: the affinity mask, capped by a cgroup CPU quota."""

from shoal.nodes.worker.cpu_threads import cgroup_cpus, pick_threads, quota_cpus


def test_quota_caps_the_affinity_mask():
    assert pick_threads(64, 2.0) == (2, "the cgroup CPU quota (2 CPUs)")
    assert pick_threads(64, 1.5)[0] == 1  # a thread per whole CPU of quota
    assert pick_threads(64, 0.5)[0] == 1


def test_no_quota_or_a_larger_one_keeps_the_mask():
    assert pick_threads(2, None) == (2, "the CPU affinity mask")
    assert pick_threads(2, 8.0) == (2, "the CPU affinity mask")


def test_cgroup_files(tmp_path):
    v2 = tmp_path / "cpu.max"
    v2.write_text("200000 100000\n")
    assert cgroup_cpus(v2, tmp_path / "none") == 2.0
    v2.write_text("max 100000\n")
    assert cgroup_cpus(v2, tmp_path / "none") is None
    v1 = tmp_path / "v1"
    v1.mkdir()
    (v1 / "cpu.cfs_quota_us").write_text("-1\n")
    (v1 / "cpu.cfs_period_us").write_text("100000\n")
    assert cgroup_cpus(tmp_path / "missing", v1) is None
    (v1 / "cpu.cfs_quota_us").write_text("300000\n")
    assert cgroup_cpus(tmp_path / "missing", v1) == 3.0
    assert quota_cpus("junk", "100000") is None
