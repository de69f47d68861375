"""ZeroMQ CURVE: encryption and authentication of every connection in a cluster.

A cluster's key directory holds one keypair (`cluster.key`, `cluster.key_secret`,
made by `shoal keys generate DIR`) and, optionally, more public keys (`*.key`) of
clients allowed in. Every node serves with the cluster keypair and admits only
connections whose client key is in the directory; every node and SDK client connects
with the cluster's public key as the server key and its keypair as its own. A peer
without the right key cannot complete the handshake: it is never answered, and the
server's authenticator logs the refusal. Off unless `SHOAL_CURVE_KEYS` (or the cluster
file's `curve_keys`) names a directory; loopback-only clusters may do without.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import zmq
import zmq.auth
from zmq.auth.thread import ThreadAuthenticator

ENV = "SHOAL_CURVE_KEYS"


@dataclass(frozen=True)
class CurveKeys:
    directory: Path
    public: bytes
    secret: bytes

    @classmethod
    def load(cls, directory: str | Path) -> "CurveKeys":
        d = Path(directory)
        secret_file = d / "cluster.key_secret"
        if not secret_file.exists():
            raise FileNotFoundError(f"no CURVE keypair in {d} (expected cluster.key_secret; make one with `shoal keys generate {d}`)")
        public, secret = zmq.auth.load_certificate(str(secret_file))
        return cls(d, public, secret)

    @classmethod
    def from_env(cls) -> "CurveKeys | None":
        d = os.environ.get(ENV)
        return cls.load(d) if d else None


def generate(directory: str | Path) -> Path:
    """A new cluster keypair in `directory` (refuses to overwrite one)."""
    d = Path(directory)
    if (d / "cluster.key_secret").exists():
        raise FileExistsError(f"{d} already holds a cluster keypair")
    d.mkdir(parents=True, exist_ok=True)
    old = os.umask(0o077)  # the secret key is never readable by others, not even for a moment
    try:
        zmq.auth.create_certificates(str(d), "cluster")
    finally:
        os.umask(old)
    os.chmod(d / "cluster.key_secret", 0o600)
    os.chmod(d / "cluster.key", 0o644)  # the public key may be read by anyone
    return d


_authenticators: dict[int, ThreadAuthenticator] = {}


def serve_with(sock: zmq.Socket, ctx: zmq.Context, keys: CurveKeys) -> None:
    """Makes `sock` a CURVE server admitting only the directory's client keys (one
    authenticator thread per context)."""
    key = id(ctx)
    if key not in _authenticators:
        sync_ctx = ctx if type(ctx) is zmq.Context else zmq.Context.shadow(ctx.underlying)  # asyncio contexts too
        auth = ThreadAuthenticator(sync_ctx)
        auth.start()
        auth.configure_curve(domain="*", location=str(keys.directory))
        _authenticators[key] = auth
    sock.curve_secretkey = keys.secret
    sock.curve_publickey = keys.public
    sock.curve_server = True


def connect_with(sock: zmq.Socket, keys: CurveKeys) -> None:
    sock.curve_serverkey = keys.public
    sock.curve_publickey = keys.public
    sock.curve_secretkey = keys.secret


def release(ctx: zmq.Context) -> None:
    """Stops the context's authenticator (before the context is destroyed)."""
    auth = _authenticators.pop(id(ctx), None)
    if auth is not None:
        auth.stop()
