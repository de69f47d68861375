"""Which CURVE keys `cluster-up` gives a host's nodes, and exposure rules."""

from __future__ import annotations

import pytest

from shoal.cluster.cluster_file import ClusterFile, Host
from shoal.cluster.cluster_up import cluster_keys
from shoal.nodes.exposure import ExposureError, check_listen, is_loopback
from shoal.program import ProgramError, program_allowed, resolve_program


def cf(tmp_path, **kw) -> ClusterFile:
    return ClusterFile("c", ("127.0.0.1:2379",), "m", tmp_path / "state", "float32",
                       (Host("head", "10.0.0.1", ("scheduler", "storage", "router")), Host("gpu", "10.0.0.2", ("worker",))),
                       **kw)


def test_keys_beyond_loopback_are_made_on_the_head_and_copied_elsewhere(tmp_path):
    f = cf(tmp_path)
    with pytest.raises(RuntimeError, match="copy that folder from host 'head'"):
        cluster_keys(f, f.host("gpu"))
    keys = cluster_keys(f, f.host("head"))
    assert keys == tmp_path / "state" / "keys" and (keys / "cluster.key_secret").exists()
    assert cluster_keys(f, f.host("gpu")) == keys  # now there (a shared or copied folder)
    assert cluster_keys(cf(tmp_path / "i", insecure=True), f.host("gpu")) is None
    local = Host("lo", "127.0.0.2", ("worker",))
    assert cluster_keys(cf(tmp_path / "l"), local) is None
    with pytest.raises(FileNotFoundError, match="no CURVE keypair"):  # a named folder must hold keys
        cluster_keys(cf(tmp_path / "n", curve_keys=tmp_path / "nowhere"), f.host("head"))


def test_loopback_and_listening_rules():
    assert is_loopback("tcp://127.0.0.1:5") and is_loopback("tcp://127.3.0.1:0") and is_loopback("tcp://[::1]:7")
    assert is_loopback("tcp://localhost:1")
    assert not is_loopback("tcp://10.0.0.1:5") and not is_loopback("tcp://*:5") and not is_loopback("tcp://0.0.0.0:1")
    assert not is_loopback("tcp://gpu-1:5")
    check_listen("tcp://127.0.0.1:0", False, False)
    check_listen("tcp://10.0.0.1:0", True, False)
    check_listen("tcp://10.0.0.1:0", False, True)
    with pytest.raises(ExposureError, match="without CURVE keys"):
        check_listen("tcp://*:5555", False, False)


def test_allowed_programs_are_matched_before_import():
    assert program_allowed("mypkg.progs:run", ("mypkg.*",))
    assert program_allowed("mypkg.progs:run", ("mypkg.progs:r*",))
    assert not program_allowed("mypkg.progs:run", ("mypkg.progs:other",))
    assert not program_allowed("os:system", ("mypkg.*",))
    assert resolve_program("generate", ()).name == "generate"  # built-ins always
    with pytest.raises(ProgramError, match="not allowed on this worker"):
        resolve_program("no_such_module_anywhere:f", ())  # refused before any import is tried
    with pytest.raises(ProgramError, match="does not import"):
        resolve_program("no_such_module_anywhere:f", ("no_such_*",))
