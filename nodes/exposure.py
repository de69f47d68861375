"""Who can reach a node, and what that lets them do.

On a loopback address only this machine's users reach a node, and a cluster trusts
them: no keys needed, any user program, any readable path. Beyond loopback a node is
reachable by whoever can route to it, so it listens only with CURVE keys (encryption
and client authentication), runs only built-in programs unless `--allow-programs`
says otherwise, and storage opens only paths under `--data-root`. `--insecure` lets a
node listen beyond loopback without keys, for a network trusted as a whole.
docs/threat-model.md says what each of these protects against.
"""

from __future__ import annotations

import ipaddress

from shoal.protocol.errors import ShoalError


def host_of(address: str) -> str:
    """The host of tcp://HOST:PORT (brackets of an IPv6 host removed)."""
    rest = address.split("://", 1)[-1]
    host = rest.rsplit(":", 1)[0] if ":" in rest else rest
    return host.strip("[]")


def is_loopback(address: str) -> bool:
    host = host_of(address)
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name, or * (every interface): reachable from elsewhere
        return False


class ExposureError(ShoalError, RuntimeError):
    """A node would listen beyond loopback without what that requires."""


def check_listen(address: str, has_keys: bool, insecure: bool) -> None:
    if is_loopback(address) or has_keys or insecure:
        return
    raise ExposureError(
        f"refusing to listen on {address} without CURVE keys: anyone who can reach it could read and change every "
        "job. Give the cluster's keys (SHOAL_CURVE_KEYS=DIR; make them with `shoal keys generate DIR`), listen on "
        "loopback, or pass --insecure on a network you trust as a whole")
