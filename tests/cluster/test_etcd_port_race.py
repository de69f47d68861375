"""etcd starts even when the port picked for it is taken before it binds (another test's
process won the race): it starts again on new ports."""

import socket

from shoal.cluster.etcd_server import EtcdServer


def test_a_port_taken_before_etcd_binds_it(tmp_path):
    server = EtcdServer(tmp_path / "etcd")
    taken = server.port
    with socket.socket() as blocker:
        blocker.bind(("127.0.0.1", taken))
        blocker.listen()
        server.start()
        try:
            assert server.port != taken
            import etcd3

            assert etcd3.client("127.0.0.1", server.port, timeout=2).status().version
        finally:
            server.stop()
