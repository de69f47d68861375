"""The cluster file: which host runs which nodes (TOML).

    cluster = "prod"                 # etcd namespace: /shoal/<cluster>/
    etcd = ["10.0.0.1:2379"]         # endpoints of the cluster's etcd
    model = "/models/qwen3-8b"       # workers' model folder (same path on every host)
    encoder = "/models/minilm"       # optional: a sentence-transformers folder the workers host
                                     # too (Embed and Retrieve, embedding jobs; same path everywhere)
    state_dir = "/var/lib/shoal"     # per host: <state_dir>/<host name>/
    dtype = "bfloat16"               # optional, workers' dtype (default auto: the checkpoint's
                                     # where the device computes it natively, else float32)
    device = "auto"                  # optional, workers' device: auto (a GPU where torch sees
                                     # one), cpu, cuda or cuda:N
    curve_keys = "/etc/shoal/keys"   # CURVE-encrypt and authenticate every connection (same
                                     # keys on every host). Hosts with a non-loopback address need
                                     # keys: by default <state_dir>/keys, made by the cluster-up of
                                     # the host running the scheduler or storage; copy that folder
                                     # to the other hosts (or share it) before their cluster-up
    insecure = false                 # true: no keys beyond loopback (a network trusted as a whole)
    data_roots = ["/data"]           # folders whose files jobs may name (input files, corpora,
                                     # embedding outputs, indexes); default: none beyond loopback
    allow_programs = ["mypkg.*"]     # user programs workers may import; default: none beyond loopback

    [[hosts]]
    name = "head"
    address = "10.0.0.1"             # nodes bind and advertise this address
    roles = ["router", "scheduler", "storage"]

    [[hosts]]
    name = "gpu-1"
    address = "10.0.0.2"
    roles = ["worker"]
    gpus = [0, 1, 2, 3]              # optional: the GPUs its workers use (default: all it has)
    workers = 4                      # optional: worker processes (default: one per GPU, else 1);
                                     # worker i sees GPU gpus[i mod len(gpus)] alone

Every node binds a free port on its host's address and publishes it in etcd, so no
port needs to be written down; the router's address is printed and written to
<state_dir>/<host>/router.txt.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path

from shoal.protocol.errors import ShoalError

ROLES = ("router", "scheduler", "storage", "worker")


class ClusterFileError(ShoalError, ValueError):
    """A cluster file that cannot be used; the message names the field."""


@dataclass(frozen=True)
class Host:
    name: str
    address: str
    roles: tuple[str, ...]
    workers: int | None = None  # None: one per GPU (`cluster_up.worker_envs`), else 1
    gpus: tuple[str, ...] | None = None  # None: every GPU the host has at cluster-up


@dataclass(frozen=True)
class ClusterFile:
    cluster: str
    etcd: tuple[str, ...]
    model: str
    state_dir: Path
    dtype: str
    hosts: tuple[Host, ...]
    curve_keys: Path | None = None
    insecure: bool = False
    data_roots: tuple[str, ...] = ()
    allow_programs: tuple[str, ...] = ()
    device: str = "auto"
    encoder: str = ""

    def host(self, name: str) -> Host:
        for h in self.hosts:
            if h.name == name:
                return h
        raise ClusterFileError(f"no host {name!r} in the cluster file (hosts: {', '.join(h.name for h in self.hosts)})")


def load_cluster_file(path: str | Path) -> ClusterFile:
    path = Path(path)
    try:
        raw = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise ClusterFileError(f"cluster file {path} does not exist") from None
    except tomllib.TOMLDecodeError as e:
        raise ClusterFileError(f"{path}: {e}") from None

    def need(d: dict, key: str, where: str):
        if key not in d:
            raise ClusterFileError(f"{path}: {where} lacks {key!r}")
        return d[key]

    def strings(d: dict, key: str) -> tuple[str, ...]:
        value = d.get(key, [])
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ClusterFileError(f"{path}: {key} must be a list of strings")
        return tuple(value)

    hosts = []
    for i, h in enumerate(need(raw, "hosts", "the file")):
        where = f"hosts[{i}]"
        roles = tuple(need(h, "roles", where))
        bad = [r for r in roles if r not in ROLES]
        if bad:
            raise ClusterFileError(f"{path}: {where} has unknown role {bad[0]!r} (roles: {', '.join(ROLES)})")
        gpus = h.get("gpus")
        if gpus is not None and (not isinstance(gpus, list) or not all(isinstance(g, int) and g >= 0 for g in gpus)):
            raise ClusterFileError(f"{path}: {where}.gpus must be a list of GPU indices (0, 1, ...)")
        workers = h.get("workers")
        if workers is not None and (not isinstance(workers, int) or workers < 1):
            raise ClusterFileError(f"{path}: {where}.workers must be a positive number")
        hosts.append(Host(need(h, "name", where), need(h, "address", where), roles, workers,
                          None if gpus is None else tuple(str(g) for g in gpus)))
    names = [h.name for h in hosts]
    if len(set(names)) != len(names):
        raise ClusterFileError(f"{path}: host names must be unique")
    for role in ("router", "scheduler", "storage", "worker"):
        if not any(role in h.roles for h in hosts):
            raise ClusterFileError(f"{path}: no host runs a {role}")
    etcd = need(raw, "etcd", "the file")
    from shoal.nodes.worker.device_choice import DeviceError, check_device_name

    try:
        device = check_device_name(str(raw.get("device", "auto")))
    except DeviceError as e:
        raise ClusterFileError(f"{path}: {e}") from None
    return ClusterFile(need(raw, "cluster", "the file"), tuple([etcd] if isinstance(etcd, str) else etcd),
                       need(raw, "model", "the file"), Path(need(raw, "state_dir", "the file")),
                       raw.get("dtype", "auto"), tuple(hosts),
                       Path(raw["curve_keys"]) if raw.get("curve_keys") else None, bool(raw.get("insecure", False)),
                       strings(raw, "data_roots"), strings(raw, "allow_programs"), device,
                       str(raw.get("encoder", "")))
