"""The router's status page (`shoal node router --http-port N`): a small web page that
shows the jobs (progress, throughput over time, ETA, failed items) and the nodes (role,
state, counters; each worker's batching mode and when it last switched), refreshed live.

One sampler task on the router's event loop asks the scheduler, storage and every node
every `every_s` seconds and keeps the latest snapshot and each job's recent history;
the page (`status_page.html`) polls `/api/status`, so any number of viewers cost the
cluster nothing more. HTTP is served with asyncio streams: GET only, one request per
connection.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from pathlib import Path

import orjson

from shoal.protocol.codec import Message

log = logging.getLogger(__name__)

PAGE = Path(__file__).with_name("status_page.html")
RECENT_JOBS = 20  # the newest jobs submitted through this router
HISTORY_POINTS = 300  # per job: ten minutes at one sample every two seconds
RATE_WINDOW_S = 30.0  # the throughput an ETA is computed from
FINAL_STATES = ("done", "cancelled")  # a job's row no longer changes: it is not asked again


class JobHistory:
    """(time, done) samples of one job: its throughput over time and its ETA."""

    def __init__(self):
        self.points: deque = deque(maxlen=HISTORY_POINTS)

    def add(self, t: float, done: int) -> None:
        if not self.points or done != self.points[-1][1] or t - self.points[-1][0] >= 2.0:
            self.points.append((t, done))

    def rate(self) -> float:
        """Items per second over the last RATE_WINDOW_S."""
        if len(self.points) < 2:
            return 0.0
        t1, d1 = self.points[-1]
        t0, d0 = next(((t, d) for t, d in self.points if t1 - t <= RATE_WINDOW_S), self.points[0])
        return (d1 - d0) / (t1 - t0) if t1 > t0 else 0.0

    def series(self) -> list[list[float]]:
        """[seconds since the first sample, items/s since the previous sample] per sample."""
        pts = list(self.points)
        if len(pts) < 2:
            return []
        return [[round(b[0] - pts[0][0], 2), round((b[1] - a[1]) / (b[0] - a[0]), 3) if b[0] > a[0] else 0.0]
                for a, b in zip(pts, pts[1:])]


def _node_row(member, stats: dict | None, error: str | None, leader: str | None) -> dict:
    row = {"node_id": member.node_id, "role": member.role, "address": member.info.get("address", ""),
           "state": "unreachable" if stats is None else "up"}
    if stats is None:
        row["error"] = error
        return row
    counters = stats.get("counters", {})
    row["messages"] = sum(v for k, v in counters.items() if k.startswith("messages."))
    row["errors"] = sum(v for k, v in counters.items() if k.startswith("errors."))
    if member.role == "scheduler":
        row["state"] = "leader" if member.node_id == leader else "standby"
        row["jobs"] = len(stats.get("jobs", ()))
    engine = stats.get("engine")
    if engine:
        planner = engine.get("planner", {})
        row.update(mode=planner.get("mode"), policy=planner.get("policy"), switched_at=planner.get("switched_at"),
                   switches=planner.get("switches", 0), running=engine.get("running", 0),
                   waiting=engine.get("waiting", 0), kv_used=engine.get("kv_blocks_used", 0),
                   kv_total=engine.get("kv_blocks_total", 0), generated=engine.get("generated_tokens", 0))
        if stats.get("draining"):
            row["state"] = "draining"
    return row


class StatusPage:
    def __init__(self, router, port: int, host: str = "127.0.0.1", every_s: float = 2.0):
        self.router, self.port, self.host, self.every_s = router, port, host, every_s
        self.history: dict[str, JobHistory] = {}
        self.finished: dict[str, dict] = {}  # job_id -> its last row, once in a final state
        self.snapshot: dict = {"jobs": [], "nodes": [], "at": 0.0}
        self.server = None
        self._tasks: set = set()

    async def start(self) -> None:
        self.server = await asyncio.start_server(self._serve, self.host, self.port)
        self.port = self.server.sockets[0].getsockname()[1]
        task = asyncio.create_task(self._sample_forever())
        self._tasks.add(task)
        log.info("[status] page on http://%s:%d/", self.host, self.port)

    async def _sample_forever(self) -> None:
        while True:
            try:
                await self.sample()
            except Exception:  # a page must never take the router down
                log.exception("[status] sampling failed")
            await asyncio.sleep(self.every_s)

    async def sample(self) -> None:
        jobs, nodes = await asyncio.gather(self._jobs(), self._nodes())
        self.snapshot = {"jobs": jobs, "nodes": nodes, "at": time.time()}

    async def _jobs(self) -> list[dict]:
        ids = list(dict.fromkeys(reversed(list(self.router.keys.values()))))[:RECENT_JOBS]
        now = time.time()

        async def one(job_id: str) -> dict:
            if job_id in self.finished:
                return self.finished[job_id]
            try:
                st = await self.router._status(job_id)
            except Exception as e:
                return {"job_id": job_id, "state": "unknown", "error": str(e)}
            history = self.history.setdefault(job_id, JobHistory())
            history.add(now, st["done"])
            rate = history.rate() if st["state"] == "running" else 0.0
            left = st["total"] - st["done"]
            detail = st.get("detail") or {}
            row = {"job_id": job_id, "state": st["state"], "total": st["total"], "done": st["done"],
                   "failed": st["failed"], "rate": round(rate, 3), "eta_s": round(left / rate, 1) if rate > 0 else None,
                   "tokens_per_s": st.get("tokens_per_s", 0.0), "program": detail.get("program", ""),
                   "throughput": history.series()}
            if st["state"] in FINAL_STATES:
                self.finished[job_id] = row
                self.history.pop(job_id, None)
            return row

        out = await asyncio.gather(*(one(j) for j in ids))
        for table in (self.history, self.finished):
            for gone in set(table) - set(ids):
                del table[gone]
        return list(out)

    async def _nodes(self) -> list[dict]:
        members = sorted(self.router.view.snapshot().values(), key=lambda m: (m.role, m.node_id))
        leader, _ = self.router.leader.current()

        async def one(m) -> dict:
            try:
                reply = await self.router._forward(m.info["address"], Message("StatsQuery", {}), timeout=1.5)
                return _node_row(m, reply["stats"], None, leader)
            except Exception as e:
                return _node_row(m, None, str(e), leader)

        return list(await asyncio.gather(*(one(m) for m in members)))

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5.0)
            method, path, *_ = request.split(b"\r\n", 1)[0].decode("latin-1").split(" ")
            if method != "GET":
                status, ctype, body = "405 Method Not Allowed", "text/plain", b"GET only\n"
            elif path.split("?")[0] == "/":
                status, ctype, body = "200 OK", "text/html; charset=utf-8", PAGE.read_bytes()
            elif path.split("?")[0] == "/api/status":
                status, ctype, body = "200 OK", "application/json", orjson.dumps(self.snapshot)
            else:
                status, ctype, body = "404 Not Found", "text/plain", b"not found\n"
            writer.write(f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\n"
                         f"Cache-Control: no-store\r\nConnection: close\r\n\r\n".encode() + body)
            await writer.drain()
        except (asyncio.TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError, ValueError):
            pass  # a client that sent no complete request, or went away
        finally:
            writer.close()

    def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        if self.server is not None:
            self.server.close()
