"""A process hosting many simulated workers (`sim_worker_endpoint.py`): the load 128
GPU workers put on the control plane, made on a few cores, with no torch and no model.

Every endpoint registers in etcd as a worker under a lease of its own (one etcd client
for the process), with the `max_seqs` and calibration it claims; one loop polls every
endpoint's socket, the host's own (StatsQuery: the endpoints' counters and latency
histograms) and the outbox's, starts and finishes sequences on the host's clock, and
lets each endpoint deliver what finished. Used by `scripts/bench_control_plane.py`.

    python -m shoal.nodes.sim_worker_host --etcd HOST:PORT --cluster C --workers 32 --prefix h0-
"""

from __future__ import annotations

import collections
import heapq
import logging
import signal
import time

import zmq

from shoal.transport import sockets
from shoal.nodes.node import Node, node_arg_parser, parse_node_args, start_logging
from shoal.transport.outbox import Outbox
from shoal.nodes.sim_worker_endpoint import SimWorkerEndpoint

log = logging.getLogger(__name__)

H200_BETA_D = 1 / 9000  # decode sequence-steps per second a worker claims (only its relative speed matters)


class SimWorkerHost(Node):
    role = "simhost"

    def __init__(self, node_id: str, workers: int, prefix: str, etcd: str, cluster: str, max_seqs: int = 256,
                 report_every_s: float = 0.25, beta_d: float = H200_BETA_D, bind: str = "tcp://127.0.0.1:0"):
        super().__init__(node_id, bind=bind)
        self.shared_outbox = Outbox(self.ctx)
        self.endpoints = [SimWorkerEndpoint(f"{prefix}{i}", self.ctx, self.shared_outbox, max_seqs, report_every_s)
                          for i in range(workers)]
        self.finishing: list = []  # heap of (finish time, n, endpoint index, job_id, seq_id, tokens)
        self._n = 0
        from shoal.nodes.membership import Registration, connect

        self.etcd_client = connect(etcd)
        self.registrations = [
            Registration(etcd, cluster, "worker", ep.node_id,
                         {"address": ep.address, "model": "sim", "max_seqs": max_seqs,
                          "calibration": {"beta_d": beta_d}}, client=self.etcd_client).start()
            for ep in self.endpoints]

    def stats(self) -> dict:
        eps = self.endpoints
        totals = collections.Counter()
        for ep in eps:
            totals.update(ep.counters)
        decision = [sum(c) for c in zip(*(ep.decision.snapshot() for ep in eps))]
        report_ack = [sum(c) for c in zip(*(ep.report_ack.snapshot() for ep in eps))]
        return {**super().stats(), "workers": len(eps), "endpoint_counters": dict(totals),
                "running": sum(ep.running for ep in eps), "queued": sum(len(ep.queue) for ep in eps),
                "held": sum(ep.held_count() for ep in eps), "outbox": len(self.shared_outbox),
                "outbox_resent": self.shared_outbox.resent, "decision_hist": decision, "report_ack_hist": report_ack}

    def serve_forever(self) -> None:
        poller = zmq.Poller()
        owner: dict = {sockets.raw(self.sock): self}
        for ep in self.endpoints:
            owner[sockets.raw(ep.sock)] = ep
        for sock in owner:
            poller.register(sock, zmq.POLLIN)
        while not self._stop.is_set():
            for sock in self.shared_outbox.new_sockets:
                poller.register(sockets.raw(sock), zmq.POLLIN)
            self.shared_outbox.new_sockets.clear()
            now = time.monotonic()
            wait = min(0.05, max(0.0, self.finishing[0][0] - now)) if self.finishing else 0.05
            for sock, _ in poller.poll(int(wait * 1000)):
                node = owner.get(sock)
                if node is None:
                    self.shared_outbox.take_replies(sock)
                else:
                    node.handle_batch(node.poll_once(0))
            self._advance(time.monotonic())
        self.close()

    def _advance(self, now: float) -> None:
        """Finishes what is due, fills freed slots, lets endpoints deliver, re-sends."""
        while self.finishing and self.finishing[0][0] <= now:
            _, _, i, job_id, seq_id, tokens = heapq.heappop(self.finishing)
            self.endpoints[i].finished(job_id, seq_id, tokens)
        for i, ep in enumerate(self.endpoints):
            for seconds, job_id, seq_id, tokens in ep.start_queued():
                self._n += 1
                heapq.heappush(self.finishing, (now + seconds, self._n, i, job_id, seq_id, tokens))
            ep.flush(now)
        self.shared_outbox.resend_due(now)

    def close(self) -> None:
        for reg in self.registrations:
            reg.stop()
        self.shared_outbox.close()
        for ep in self.endpoints:
            ep.sock.close(0)
        super().close()


def main(argv: list[str] | None = None) -> int:
    ap = node_arg_parser("simhost", etcd_required=True)
    ap.add_argument("--workers", type=int, required=True, help="simulated workers in this process")
    ap.add_argument("--prefix", default="sim-", help="worker ids are PREFIX0, PREFIX1, ...")
    ap.add_argument("--max-seqs", type=int, default=256, help="sequences each worker runs at once")
    ap.add_argument("--report-every", type=float, default=0.25,
                    help="seconds between the starts of a worker's result deliveries")
    ap.add_argument("--beta-d", type=float, default=H200_BETA_D, help="the decode cost each worker publishes")
    args = parse_node_args(ap, argv)
    node_id = args.node_id or f"simhost-{args.prefix}"
    start_logging("simhost", node_id)
    host = SimWorkerHost(node_id, args.workers, args.prefix, args.etcd, args.cluster, args.max_seqs,
                         args.report_every, args.beta_d, bind=args.bind)
    signal.signal(signal.SIGTERM, lambda *_: host.stop())
    signal.signal(signal.SIGINT, lambda *_: host.stop())
    print(f"simhost: {host.address}", flush=True)
    host.serve_forever()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
