"""The router node: the cluster's front door for clients.

It validates a job, hands it to the scheduler leader (which is idempotent on the job
key), records the key → job id durably in its own directory, and answers status and
result reads (results come from storage by offset, so a client resumes where it was).
It runs on an event loop (`async_node.py`): every client request is its own task, so
one slow forward never holds up the other clients.
"""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path

import orjson

from shoal.transport.async_rpc import AsyncRpcClient
from shoal.nodes.process_memory import map_large_buffers_apart
from shoal.nodes.async_node import AsyncNode
from shoal.nodes.leader import LeaderView
from shoal.nodes.address_book import AddressBook
from shoal.nodes.data_roots import DataRoots
from shoal.nodes.membership import MemberView
from shoal.nodes.storage.parked_reads import MAX_WAIT_S
from shoal.nodes.scheduler_node import INGEST_TIMEOUT_S
from shoal.nodes.node import add_data_root_arg, data_roots_of, node_arg_parser, parse_node_args, run_node, start_logging
from shoal.protocol.codec import Message, encode
from shoal.protocol.errors import ProtocolError
from shoal.transport.rpc import DEFAULT_TIMEOUT_S, RemoteError

log = logging.getLogger(__name__)

DONE_POLL_S = 0.02  # how often a read that found every result stored asks whether the job is done
# How long a read waits for the scheduler's word on whether its job is over (an answer
# from memory); past it the read is served from storage, not over.
STATUS_TIMEOUT_S = min(DEFAULT_TIMEOUT_S, 2.0)


class RouterNode(AsyncNode):
    role = "router"
    # The router holds no work: it forwards each request to the node that answers it
    # (which refuses what it may not do), so clients keep reading results through an
    # etcd outage.
    serves_without_lease = True

    def __init__(self, node_id: str, data_dir: str | Path, etcd: str, cluster: str = "default",
                 data_roots: list[str] | None = None, http_port: int = 0, http_host: str = "127.0.0.1", **kw):
        """`data_roots`: where an index to load may be (the router reads its manifest).
        `http_port`: serve the status page there (0: no page; `status_page.py`)."""
        super().__init__(node_id, etcd=etcd, cluster=cluster, **kw)
        self.data_roots = DataRoots(data_roots or [])
        self.view = MemberView(etcd, cluster).start()
        self.addresses = AddressBook(self.view)  # to name a node that does not answer
        self.leader = LeaderView(etcd, cluster, client=self.view.client).start()  # who leads, from a watch
        self.dir = Path(data_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.keys_path = self.dir / "job_keys.jsonl"
        self.keys: dict[str, str] = {}
        if self.keys_path.exists():
            for line in self.keys_path.read_bytes().splitlines():
                try:
                    rec = orjson.loads(line)
                    self.keys[rec["key"]] = rec["job_id"]
                except (orjson.JSONDecodeError, KeyError):
                    break  # a torn last line
        self.keys_file = open(self.keys_path, "ab")
        self.clients: dict[str, AsyncRpcClient] = {}
        self.status_page = None
        if http_port:
            from shoal.nodes.status_page import StatusPage

            self.status_page = StatusPage(self, http_port, http_host)

    async def serve(self) -> None:
        if self.status_page is not None:
            await self.status_page.start()
        await super().serve()

    def handler_table(self) -> dict:
        return {"SubmitJob": self.on_submit, "JobStatusQuery": self.on_status,
                "Subscribe": self.on_subscribe, "CancelJob": self.on_cancel,
                "UploadChunk": self.on_upload_chunk, "DrainNode": self.on_ops, "MigrateRequest": self.on_ops,
                "ClusterInfoQuery": self.on_cluster_info, "LoadIndex": self.on_load_index}

    async def on_cluster_info(self, msg: Message):
        """Every member and what it published (address, model, encoder and its cost
        terms, calibration): what a client needs to predict a job before running it."""
        members = [{"node_id": m.node_id, "role": m.role, "info": m.info}
                   for m in sorted(self.view.snapshot().values(), key=lambda m: (m.role, m.node_id))]
        return encode("ClusterInfo", {"members": members}, reply_to=msg.id)

    async def on_load_index(self, msg: Message):
        """Loads an index's shards onto storage nodes (`replicas` each, placed by
        `scheduler/shard_placement.py`), all at once; replies when every one is loaded
        and published, so a job submitted next finds them."""
        from shoal.scheduler.shard_placement import PlacementError, place_shards
        from shoal.vector_index import IndexFileError, read_manifest

        self.data_roots.check(msg["path"], "index")
        try:
            meta = await asyncio.to_thread(read_manifest, msg["path"])
        except IndexFileError as e:
            raise ProtocolError(ProtocolError.BAD_INPUT, str(e)) from None
        storage = self.view.snapshot("storage")
        load = {n: sum(len(i.get("shards", ())) for i in m.info.get("indexes", {}).values()) for n, m in storage.items()}
        held: dict[int, set] = {}
        for n, m in storage.items():
            for shard in m.info.get("indexes", {}).get(msg["name"], {}).get("shards", ()):
                held.setdefault(shard, set()).add(n)
        try:
            placement = place_shards(len(meta["shards"]), sorted(storage), msg["replicas"], load, held)
        except PlacementError as e:
            raise ProtocolError(ProtocolError.INVALID_FIELD, str(e)) from None
        loads = [(n, shard) for shard, nodes in enumerate(placement) for n in nodes]
        replies = await asyncio.gather(*(self._forward(storage[n].info["address"], Message(
            "LoadIndexShard", {"name": msg["name"], "path": msg["path"], "shard": shard}), timeout=INGEST_TIMEOUT_S)
            for n, shard in loads))
        ids = {r["index_id"] for r in replies}
        log.info("[index] %s loaded from %s: %d shards on %s", msg["name"], msg["path"], len(placement), placement)
        return encode("IndexLoaded", {"name": msg["name"], "index_id": ids.pop() if len(ids) == 1 else "",
                                      "placement": placement, "rows": meta["rows"], "dim": meta["dim"],
                                      "encoder": meta["encoder"]}, reply_to=msg.id)

    def _client(self, address: str) -> AsyncRpcClient:
        if address not in self.clients:
            self.clients[address] = AsyncRpcClient(address, self.ctx)
        return self.clients[address]

    async def _forward(self, address: str, msg: Message, timeout: float = DEFAULT_TIMEOUT_S) -> Message:
        try:
            # Every request a router forwards is idempotent: one lost message is re-sent.
            return await self._client(address).request(msg.type, msg.fields, msg.blobs, timeout=timeout, retries=1)
        except RemoteError as e:
            if e.code == ProtocolError.NOT_LEADER:  # etcd still names a leader that has stepped down
                raise ProtocolError(ProtocolError.UNAVAILABLE, "the scheduler leadership is changing; retry") from None
            raise ProtocolError(e.code, e.message) from None
        except TimeoutError:
            raise ProtocolError(ProtocolError.UNAVAILABLE, f"{self.addresses.name(address)} did not answer {msg.type}") from None

    async def _scheduler(self) -> str:
        leader, _ = self.leader.current()
        member = self.view.snapshot("scheduler").get(leader) if leader else None
        if member is None:
            if not self.view.snapshot("scheduler"):
                raise ProtocolError(ProtocolError.UNAVAILABLE, "no scheduler node in the cluster")
            raise ProtocolError(ProtocolError.UNAVAILABLE, "no scheduler leader right now (an election is under way)")
        return member.info["address"]

    def _storage(self) -> str:
        address = self.view.storage_address()
        if address is None:
            raise ProtocolError(ProtocolError.UNAVAILABLE, "no storage node in the cluster")
        return address

    async def on_submit(self, msg: Message):
        if not msg["job_key"]:
            raise ProtocolError(ProtocolError.INVALID_FIELD, "job_key must not be empty")
        if msg.blobs:
            raise ProtocolError(ProtocolError.INVALID_FIELD, "send a large input as UploadChunk messages, then submit its upload_id")
        large = msg["upload_id"] or msg["input_path"] or msg["program"] == "embed"  # storage reads it before the reply
        reply = await self._forward(await self._scheduler(), msg,
                                    timeout=INGEST_TIMEOUT_S + 10 if large else DEFAULT_TIMEOUT_S)
        if msg["job_key"] not in self.keys:
            self.keys[msg["job_key"]] = reply["job_id"]
            self.keys_file.write(orjson.dumps({"key": msg["job_key"], "job_id": reply["job_id"]}) + b"\n")
            self.keys_file.flush()
            os.fsync(self.keys_file.fileno())
        return encode("JobAccepted", reply.fields, reply_to=msg.id)

    async def on_upload_chunk(self, msg: Message):
        return encode("UploadAck", (await self._forward(self._storage(), msg)).fields, reply_to=msg.id)

    async def on_status(self, msg: Message):
        return encode("JobStatus", await self._status(msg["job_id"]), reply_to=msg.id)

    async def _status(self, job_id: str) -> dict:
        """The scheduler's view of the job, with its counts from storage: the results
        stored are the job's progress, whichever scheduler placed them."""
        status, counts = await asyncio.gather(
            self._forward(await self._scheduler(), Message("JobStatusQuery", {"job_id": job_id})),
            self._forward(self._storage(), Message("ResultCountQuery", {"job_id": job_id})))
        fields = dict(status.fields)
        fields["done"], fields["failed"] = counts["records"], counts["failed"]
        return fields

    async def on_ops(self, msg: Message):
        """Draining a worker and moving sequences are the scheduler's to carry out."""
        return encode("OpsAck", (await self._forward(await self._scheduler(), msg)).fields, reply_to=msg.id)

    async def on_cancel(self, msg: Message):
        return encode("JobStatus", (await self._forward(await self._scheduler(), msg)).fields, reply_to=msg.id)

    async def _over(self, job_id: str) -> bool:
        """Whether the scheduler says the job is over. One that does not answer soon (etcd
        away, a takeover under way) leaves it not over: the results stored are served
        all the same, and only the end waits for the scheduler."""
        try:
            status = await self._forward(await self._scheduler(), Message("JobStatusQuery", {"job_id": job_id}),
                                         timeout=STATUS_TIMEOUT_S)
        except ProtocolError as e:
            if e.code != ProtocolError.UNAVAILABLE:
                raise
            return False
        return status["state"] in ("done", "cancelled")

    async def on_subscribe(self, msg: Message):
        # Status first: if the job is done then, every result was stored before this read.
        over = await self._over(msg["job_id"])
        # A read that may wait on storage (`wait_ms`) is given that long beyond the usual
        # timeout; a finished job's read has nothing to wait for.
        wait_s = 0.0 if over else min(max(msg["wait_ms"], 0) / 1000, MAX_WAIT_S)
        read = Message("Subscribe", {**msg.fields, "wait_ms": int(wait_s * 1000)})
        fields = dict((await self._forward(self._storage(), read, timeout=DEFAULT_TIMEOUT_S + wait_s)).fields)
        if fields["final"] and not over:
            # Storage holds every item's result and this read reached the end; the
            # scheduler marks the job done a moment later (its workers' progress reports,
            # then its own count). Final still means done, so that a client that has read
            # everything finds the job done: wait for that, for at most the read's wait.
            over = await self._done_within(msg["job_id"], wait_s)
        # Done means every item's result is stored: reading to the end of the log is all of them.
        fields["final"] = over and msg["offset"] + len(fields["records"]) >= fields["available"]
        return encode("ResultBatch", fields, reply_to=msg.id)

    async def _done_within(self, job_id: str, seconds: float) -> bool:
        end = asyncio.get_running_loop().time() + seconds
        while asyncio.get_running_loop().time() < end:
            await asyncio.sleep(DONE_POLL_S)
            if await self._over(job_id):
                return True
        return False

    def close(self) -> None:
        if self.status_page is not None:
            self.status_page.close()
        self.keys_file.close()
        self.view.stop()
        self.leader.stop()
        super().close()


def main(argv: list[str] | None = None) -> int:
    ap = node_arg_parser("router", etcd_required=True)
    ap.add_argument("--dir", required=True, help="where job keys are kept")
    ap.add_argument("--http-port", type=int, default=0, help="serve the status page on this port (default: none)")
    ap.add_argument("--http-host", default="127.0.0.1", help="the status page's address (it shows jobs and nodes "
                                                           "to anyone who can reach it)")
    add_data_root_arg(ap)
    args = parse_node_args(ap, argv)
    node_id = args.node_id or f"router-{os.getpid()}"
    start_logging("router", node_id)
    map_large_buffers_apart()
    node = RouterNode(node_id, args.dir, args.etcd, args.cluster, data_roots=data_roots_of(args), bind=args.bind,
                      advertise=args.advertise, http_port=args.http_port, http_host=args.http_host)
    return run_node(node, args.metrics_port, args.metrics_host)

if __name__ == "__main__":
    raise SystemExit(main())
