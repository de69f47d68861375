"""The commands that start, stop, watch and steer a cluster: `shoal up`, `down`,
`cluster-up`, `cluster-down`, `nodes`, `drain`, `migrate`, `status` and `keys`."""

from __future__ import annotations

import argparse
import sys
import time

import orjson

from shoal.sdk.client import DEFAULT_CLIENT_TIMEOUT_S
from shoal.cli.generate import DTYPE_HELP
from shoal.nodes.worker.device_choice import add_device_arg


def add_parsers(sub: argparse._SubParsersAction) -> None:
    k = sub.add_parser("keys", help="CURVE keys for a cluster")
    k.add_argument("action", choices=["generate"])
    k.add_argument("dir", help="directory for the cluster keypair")
    k.set_defaults(fn=cmd_keys)

    u = sub.add_parser("up", help="start a local cluster: etcd and every node as processes on this machine")
    u.add_argument("--model", required=True)
    add_device_arg(u)
    u.add_argument("--workers", type=int, default=1)
    u.add_argument("--dir", help="state directory (default: a new temporary one)")
    u.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16"],
                   help=DTYPE_HELP)
    u.add_argument("--detach", action="store_true", help="return once it is up; stop it with `shoal down --dir`")
    u.add_argument("--host", default="127.0.0.1",
                   help="address every node listens on; beyond loopback CURVE keys are made in DIR/keys")
    u.add_argument("--insecure", action="store_true", help="beyond loopback, listen without CURVE keys")
    u.add_argument("--http-port", type=int, default=0, help="the router serves a status page (jobs, nodes) on this port")
    u.set_defaults(fn=cmd_up)

    d = sub.add_parser("down", help="stop a cluster started with `shoal up --detach`")
    d.add_argument("--dir", required=True)
    d.set_defaults(fn=cmd_down)

    for name, fn, text in (("cluster-up", cmd_cluster_up, "start this host's nodes from a cluster file"),
                           ("cluster-down", cmd_cluster_down, "stop this host's nodes")):
        cu = sub.add_parser(name, help=text)
        cu.add_argument("--file", required=True, help="the cluster file (TOML; see shoal/cluster/cluster_file.py)")
        cu.add_argument("--host", required=True, help="this host's name in the file")
        cu.set_defaults(fn=fn)

    nd = sub.add_parser("nodes", help="every node of a cluster with its counters")
    nd.add_argument("--etcd")
    nd.add_argument("--cluster", default="default")
    nd.add_argument("--dir", help="state dir of a local cluster (shoal up)")
    nd.add_argument("--timeout", type=float, default=10.0, help="seconds to wait for etcd")
    nd.set_defaults(fn=cmd_nodes)

    dr = sub.add_parser("drain", help="move a worker's sequences to the others, then stop it")
    dr.add_argument("node")
    dr.add_argument("--router", required=True)
    dr.add_argument("--etcd", help="wait until the node has left (needs the cluster's etcd)")
    dr.add_argument("--cluster", default="default")
    dr.add_argument("--dir", help="state dir of a local cluster (shoal up): wait using its etcd")
    dr.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for the node to leave")
    dr.add_argument("--client-timeout", type=float, default=DEFAULT_CLIENT_TIMEOUT_S,
                    help="give up when the cluster has not answered for this many seconds")
    dr.set_defaults(fn=cmd_drain)

    mg = sub.add_parser("migrate", help="move a job's sequences (or some of them) to a worker, mid-generation")
    mg.add_argument("job")
    mg.add_argument("--to", required=True, help="the target worker's node id")
    mg.add_argument("--seq", action="append", help="a sequence id (repeat; default: all of the job's)")
    mg.add_argument("--router", required=True)
    mg.add_argument("--timeout", type=float, default=DEFAULT_CLIENT_TIMEOUT_S,
                    help="give up when the cluster has not answered for this many seconds")
    mg.set_defaults(fn=cmd_migrate)

    for name, what, fn in (("status", "a job's status", cmd_status),
                           ("cancel", "stop a job: nothing more of it is placed or run; its results are kept",
                            cmd_cancel)):
        job = sub.add_parser(name, help=what)
        job.add_argument("job")
        job.add_argument("--router", required=True)
        job.add_argument("--timeout", type=float, default=DEFAULT_CLIENT_TIMEOUT_S,
                         help="give up when the cluster has not answered for this many seconds")
        job.set_defaults(fn=fn)


def cmd_up(args) -> int:
    from shoal.cluster.local_cluster import LocalCluster

    cluster = LocalCluster(args.model, workers=args.workers, state_dir=args.dir, dtype=args.dtype,
                           die_with_parent=not args.detach, host=args.host, insecure=args.insecure,
                           http_port=args.http_port).start()
    print(f"router: {cluster.router}", flush=True)
    if args.http_port:
        print(f"status page: http://{args.host}:{args.http_port}/", flush=True)
    print(f"etcd: {cluster.etcd.endpoint}  state: {cluster.dir}", flush=True)
    if cluster.curve_keys:
        print(f"CURVE keys: {cluster.curve_keys}  (clients: SHOAL_CURVE_KEYS={cluster.curve_keys})", flush=True)
    if args.detach:
        return 0  # `shoal down --dir` stops it
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        cluster.stop()
    return 0


def cmd_down(args) -> int:
    from shoal.cluster.local_cluster import LocalCluster

    print(f"stopped {LocalCluster.stop_detached(args.dir)} processes")
    return 0


def cmd_cluster_up(args) -> int:
    from shoal.cluster.cluster_file import load_cluster_file
    from shoal.cluster.cluster_up import cluster_up

    cf = load_cluster_file(args.file)
    started = cluster_up(cf, args.host)
    for name, address in started["addresses"].items():
        print(f"{name}: {address}")
    return 0


def cmd_cluster_down(args) -> int:
    from shoal.cluster.cluster_file import load_cluster_file
    from shoal.cluster.cluster_up import cluster_down

    print(f"stopped {cluster_down(load_cluster_file(args.file), args.host)} nodes")
    return 0


def cmd_nodes(args) -> int:
    """Every node of a cluster with its counters (from etcd, then each node's Stats)."""
    import json as _json
    from pathlib import Path

    from shoal.transport.rpc import RpcClient

    from shoal.transport.sockets import FROM_ENV

    etcd, cluster, keys = args.etcd, args.cluster, FROM_ENV
    if args.dir:
        rec = _json.loads((Path(args.dir) / "cluster.json").read_text())
        etcd, cluster = rec["etcd"], rec["cluster"]
        keys = rec.get("curve_keys") or keys  # the local cluster's own keys
    if not etcd:
        raise ValueError("give --etcd HOST:PORT (and --cluster) or --dir of a local cluster")
    members = _members(etcd, cluster, args.timeout)
    for m in members:
        try:
            rpc = RpcClient(m.info["address"], curve_keys=keys, watch_handshake=True)
            try:
                st = rpc.request("StatsQuery", {}, timeout=min(args.timeout, 3))["stats"]
            finally:
                rpc.close()
        except Exception as e:
            print(f"{m.role:<10} {m.node_id:<20} {m.info['address']:<26} unreachable: {e}")
            continue
        c = st.get("counters", {})
        msgs = sum(v for k, v in c.items() if k.startswith("messages."))
        errs = sum(v for k, v in c.items() if k.startswith("errors."))
        extra = ""
        if "engine" in st:
            e = st["engine"]
            q = st.get("sequences", {})
            extra = (f" resident {q.get('resident', 0)} (running {e['running']}, waiting {e['waiting']},"
                     f" suspended on other ops {q.get('waiting_on_ops', 0)}, moving {q.get('moving', 0)},"
                     f" offloaded {q.get('offloaded', 0)}) kv {e['kv_blocks_used']}/{e['kv_blocks_total']} blocks"
                     + (f" ({e['kv_cache_bytes'] / 2**30:.1f} GiB {e.get('kv_cache_dtype')})" if e.get("kv_cache_bytes")
                        else "") +
                     f" generated {e['generated_tokens']} tokens, planner {e['planner'].get('mode')},"
                     f" device {e.get('device')} ({e.get('device_label')}), attention {e.get('attention')},"
                     f" dtype {e.get('dtype')}, budget {e.get('budget')} tokens/step"
                     + (" (rows padded)" if e.get("pad_rows") else "")
                     + (f", at most {e['step_cap']} sequences/step since steps failed" if e.get("step_cap") else "")
                     + (" DRAINING" if st.get("draining") else ""))
        if "disk" in st:  # a storage node
            d = st["disk"]
            extra = (f" disk {d['free_bytes'] / 2**30:.2f} GiB free in {d['dir']}"
                     + (f" FULL (writes wait for {d['reserve_bytes'] / 2**20:.0f} MiB free)" if d["full"] else ""))
        if "jobs" in st:
            extra = f" leader {st['leader']} epoch {st['epoch']} jobs {len(st['jobs'])}"
            if sum(st.get("decision_hist") or []):
                from shoal.nodes.latency_histogram import percentile

                p50, p99 = (1e3 * percentile(st["decision_hist"], q) for q in (50, 99))
                extra += f" decision latency p50 {p50:.1f} ms p99 {p99:.1f} ms"
        print(f"{m.role:<10} {m.node_id:<20} {m.info['address']:<26} messages {msgs} errors {errs}{extra}")
    return 0


def _members(etcd: str, cluster: str, timeout: float) -> list:
    """The cluster's members as etcd lists them; an etcd that does not answer within
    `timeout` is named in the error."""
    from shoal.nodes.membership import list_members

    try:
        members = list_members(etcd, cluster, timeout)
    except Exception as e:
        raise RuntimeError(f"etcd at {etcd} did not answer within {timeout:.0f} s ({type(e).__name__}: {e})") from None
    if not members:
        print(f"no members in cluster {cluster!r} at etcd {etcd}", file=sys.stderr)
    return sorted(members, key=lambda m: (m.role, m.node_id))


def _etcd_of(args) -> tuple[str | None, str]:
    import json as _json
    from pathlib import Path

    if getattr(args, "dir", None):
        rec = _json.loads((Path(args.dir) / "cluster.json").read_text())
        return rec["etcd"], rec["cluster"]
    return args.etcd, args.cluster


def cmd_drain(args) -> int:
    """Drains a worker; with the cluster's etcd (--etcd or --dir) waits until it left."""
    import time

    from shoal.sdk.client import Client

    detail = Client(args.router, timeout=args.client_timeout).drain(args.node)
    print(f"draining {args.node}: {detail.get('held', 0)} sequences to move", flush=True)
    etcd, cluster = _etcd_of(args)
    if not etcd:
        return 0
    from shoal.nodes.membership import MemberView

    view = MemberView(etcd, cluster).start()
    t = time.monotonic()
    try:
        if not view.wait_for(lambda m: args.node not in m, args.timeout):
            print(f"{args.node} still a member after {args.timeout:.0f} s", file=sys.stderr)
            return 1
    finally:
        view.stop()
    print(f"{args.node} drained and left in {time.monotonic() - t:.1f} s")
    return 0


def cmd_migrate(args) -> int:
    from shoal.sdk.client import Client

    detail = Client(args.router, timeout=args.timeout).migrate(args.job, args.to, args.seq)
    print(f"moving {detail['moving']} sequences of {args.job} to {args.to} (from {detail['from']})")
    return 0


def cmd_status(args) -> int:
    from shoal.sdk.client import Client

    print(orjson.dumps(Client(args.router, timeout=args.timeout).job(args.job).status(),
                       option=orjson.OPT_INDENT_2).decode())
    return 0


def cmd_cancel(args) -> int:
    from shoal.sdk.client import Client

    print(orjson.dumps(Client(args.router, timeout=args.timeout).job(args.job).cancel(),
                       option=orjson.OPT_INDENT_2).decode())
    return 0


def cmd_keys(args) -> int:
    from shoal.transport.curve import generate

    d = generate(args.dir)
    print(f"CURVE keypair: {d / 'cluster.key'} (public), {d / 'cluster.key_secret'} (secret, mode 600)")
    print("give the directory to every host (cluster file: curve_keys) and client (SHOAL_CURVE_KEYS)")
    return 0
