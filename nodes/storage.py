"""The storage node: job results on local disk, written through a WAL with group
commit, first writer wins, served back from resumable offsets.

Durability domain: this node's disk. A WriteAck is sent only after the fsync that
covers its records, so an acknowledged result survives a crash of any process.
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path

from shoal.nodes.node import Node, node_arg_parser, run_node, start_logging
from shoal.nodes.result_log import ResultLog
from shoal.protocol.codec import Message, encode
from shoal.protocol.errors import ProtocolError

log = logging.getLogger(__name__)

READ_LIMIT = 1000  # records per ResultBatch
_JOB_ID = re.compile(r"^[A-Za-z0-9._-]{1,128}$")


class StorageNode(Node):
    role = "storage"

    def __init__(self, node_id: str, data_dir: str | Path, **kw):
        self.dir = Path(data_dir)
        self.logs: dict[str, ResultLog] = {}
        super().__init__(node_id, **kw)

    def handler_table(self) -> dict:
        return {"WriteResults": self.on_write_results, "Subscribe": self.on_subscribe}

    def _log(self, job_id: str) -> ResultLog:
        if not _JOB_ID.match(job_id):
            raise ProtocolError(ProtocolError.INVALID_FIELD, f"job_id {job_id!r} is not a valid id")
        if job_id not in self.logs:
            self.logs[job_id] = ResultLog(self.dir / "jobs" / job_id / "results.wal")
        return self.logs[job_id]

    def on_write_results(self, msg: Message):
        records = msg["records"]
        bad = next((r for r in records if not isinstance(r, dict) or "id" not in r), None)
        if bad is not None:
            raise ProtocolError(ProtocolError.INVALID_FIELD, f"result record without an id: {str(bad)[:60]}")
        written, dup = self._log(msg["job_id"]).append(records)
        self.counters["records.written"] += written
        self.counters["records.duplicate"] += dup
        return encode("WriteAck", {"job_id": msg["job_id"], "written": written, "duplicates": dup}, reply_to=msg.id)

    def on_subscribe(self, msg: Message):
        if msg["offset"] < 0:
            raise ProtocolError(ProtocolError.INVALID_FIELD, "offset must be >= 0")
        rl = self._log(msg["job_id"])
        records = rl.read(msg["offset"], READ_LIMIT)
        return encode("ResultBatch", {"job_id": msg["job_id"], "offset": msg["offset"], "records": records,
                                      "final": False}, reply_to=msg.id)

    def handle_batch(self, batch) -> None:
        """Group commit: every WriteResults that arrived together shares one fsync per
        job log, and their acks go out only after it."""
        replies = [(identity, self.dispatch(frames)) for identity, frames in batch]
        for rl in self.logs.values():
            rl.commit()
        for identity, reply in replies:
            if reply is not None:
                self.send(identity, reply)

    def close(self) -> None:
        for rl in self.logs.values():
            rl.close()
        super().close()


def main(argv: list[str] | None = None) -> int:
    ap = node_arg_parser("storage")
    ap.add_argument("--dir", required=True, help="the node's data directory")
    args = ap.parse_args(argv)
    node_id = args.node_id or f"storage-{os.getpid()}"
    start_logging("storage", node_id)
    node = StorageNode(node_id, args.dir, bind=args.bind, etcd=args.etcd, cluster=args.cluster, advertise=args.advertise)
    return run_node(node, args.metrics_port)

if __name__ == "__main__":
    raise SystemExit(main())
