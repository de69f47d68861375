"""The KV cache's default size: a share of the memory available, capped by memory cgroups."""

import pytest

from shoal.nodes.worker.kv_cache_size import (MIN_BYTES, cgroup_headroom, check_share, choose_kv_cache_bytes,
                                              default_kv_cache_bytes, meminfo_available, own_cgroups)

GiB = 1 << 30


def test_the_default_is_a_share_of_what_is_available():
    assert default_kv_cache_bytes(20 * GiB) == (10 * GiB, "50% of the 20.0 GiB available at start")
    size, why = default_kv_cache_bytes(20 * GiB, share=0.25)  # one of a local cluster's two workers
    assert size == 5 * GiB and why.startswith("25% ")


def test_a_small_or_unknown_machine_still_gets_a_cache():
    assert default_kv_cache_bytes(100 << 20)[0] == MIN_BYTES
    size, why = default_kv_cache_bytes(None)
    assert size == 4 * GiB and "unknown" in why
    assert default_kv_cache_bytes(None, share=0.125)[0] == 1 * GiB  # one of four workers: a quarter of it


@pytest.mark.parametrize("share", [0, -0.5, 1.5])
def test_a_share_outside_zero_to_one_is_refused(share):
    with pytest.raises(ValueError, match="share of available memory"):
        default_kv_cache_bytes(8 * GiB, share)
    with pytest.raises(ValueError, match="share of available memory"):
        check_share(share)


def test_an_explicit_size_wins_and_must_be_positive():
    assert choose_kv_cache_bytes(3 * GiB, share=0.1) == (3 * GiB, "as set (kv_cache_bytes / --kv-cache-bytes)")
    with pytest.raises(ValueError, match="positive size"):
        choose_kv_cache_bytes(0)
    size, why = choose_kv_cache_bytes(None)
    assert size >= MIN_BYTES and why.startswith("auto: ")


def test_meminfo(tmp_path):
    f = tmp_path / "meminfo"
    f.write_text("MemTotal:       24000000 kB\nMemFree:         1000 kB\nMemAvailable:   20000000 kB\n")
    assert meminfo_available(f) == 20000000 * 1024
    f.write_text("MemTotal:       24000000 kB\n")
    assert meminfo_available(f) is None
    assert meminfo_available(tmp_path / "missing") is None


def test_own_cgroups(tmp_path):
    f = tmp_path / "cgroup"
    f.write_text("9:name=systemd:/\n4:memory:/jobs/a\n1:cpu,cpuacct:/\n0::/user.slice/w\n")
    assert own_cgroups(f) == ("/user.slice/w", "/jobs/a")
    f.write_text("0::/\n")
    assert own_cgroups(f) == ("/", None)
    assert own_cgroups(tmp_path / "missing") == (None, None)


def write(folder, **files):
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (folder / name.replace("_", ".", 1)).write_text(text)


def test_cgroup_v2_takes_the_tightest_of_the_process_cgroup_and_its_ancestors(tmp_path):
    root, proc = tmp_path / "v2", tmp_path / "cgroup"
    proc.write_text("0::/pod/box\n")
    none = tmp_path / "no-v1"
    write(root / "pod" / "box", memory_max="max\n", memory_current="0\n")
    assert cgroup_headroom(proc, root, none) is None  # no limit anywhere
    # The pod (an ancestor) has 8 GiB; 5 GiB in use, 2 GiB of it reclaimable page cache.
    write(root / "pod", memory_max=f"{8 * GiB}\n", memory_current=f"{5 * GiB}\n",
          memory_stat=f"anon 1\ninactive_file {2 * GiB}\n")
    assert cgroup_headroom(proc, root, none) == 5 * GiB
    write(root / "pod" / "box", memory_max=f"{4 * GiB}\n", memory_current=f"{1 * GiB}\n")
    assert cgroup_headroom(proc, root, none) == 3 * GiB
    write(root / "pod" / "box", memory_current=f"{5 * GiB}\n")
    assert cgroup_headroom(proc, root, none) == 0


def test_cgroup_v1_reads_the_hierarchical_limit(tmp_path):
    root, proc = tmp_path / "v1", tmp_path / "cgroup"
    proc.write_text("4:memory:/jobs/a\n0::/\n")
    none = tmp_path / "no-v2"
    write(root / "jobs" / "a", memory_stat=f"hierarchical_memory_limit {(1 << 63) - 4096}\ntotal_inactive_file 0\n",
          memory_limit_in_bytes=f"{(1 << 63) - 4096}\n", memory_usage_in_bytes="1\n")
    assert cgroup_headroom(proc, none, root) is None  # v1's "no limit"
    write(root / "jobs" / "a", memory_stat=f"hierarchical_memory_limit {6 * GiB}\ntotal_inactive_file {GiB}\n",
          memory_usage_in_bytes=f"{3 * GiB}\n")
    assert cgroup_headroom(proc, none, root) == 4 * GiB
    # A container's namespace: its own cgroup is the mount's root, and the path is not there.
    proc.write_text("4:memory:/docker/abc\n")
    write(root, memory_limit_in_bytes=f"{2 * GiB}\n", memory_usage_in_bytes="0\n")
    assert cgroup_headroom(proc, none, root) == 2 * GiB
