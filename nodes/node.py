"""What every node shares: a ROUTER socket, a message-type → handler table, the
hello/ready handshake, Error replies for anything malformed, counters, and membership.

A node never dies of a bad message: decoding errors and handler exceptions become
`Error` replies to the sender and are counted and logged.
"""

from __future__ import annotations

import argparse
import collections
import logging
import signal
import threading
import time

import zmq

from shoal.transport import sockets
from shoal.nodes.process_memory import freeze_startup_heap
from shoal.protocol.codec import Message, decode, encode, error_reply
from shoal.protocol.errors import ProtocolError

log = logging.getLogger(__name__)


class Node:
    role = "node"
    # Past its own lease deadline (etcd away, or this node cut off from it) a node takes
    # no requests: the cluster may already count it gone and have given its work to
    # others. A role whose every effect is safe to repeat anyway serves on.
    serves_without_lease = False

    def __init__(self, node_id: str, bind: str = "tcp://127.0.0.1:0", etcd: str | None = None,
                 cluster: str = "default", advertise: str | None = None, model: str = "",
                 max_message_bytes: int = 64 << 20, info: dict | None = None):
        self.node_id = node_id
        self.model = model
        self.ctx = self.make_context()
        self.sock, self.address = sockets.router(self.ctx, bind)
        self.advertise = advertise or self.address
        self.max_message_bytes = max_message_bytes
        self.counters: collections.Counter = collections.Counter()
        self.started = time.time()
        self.outbox = None  # an `Outbox` for requests this node sends without waiting
        self.received_at = 0.0  # when the batch of requests being handled arrived
        self._poller = None
        self.handlers = {"Hello": self.on_hello, "Ping": self.on_ping, "StatsQuery": self.on_stats,
                         **self.handler_table()}
        self._stop = threading.Event()
        self.exit_code = 0  # a node that stops itself (e.g. a worker's watchdog) sets it
        self.registration = None
        if etcd:
            from shoal.nodes.membership import Registration

            self.registration = Registration(etcd, cluster, self.role, node_id,
                                             {"address": self.advertise, "model": model, **(info or {})}).start()
        self.etcd, self.cluster = etcd, cluster

    def handler_table(self) -> dict:
        """Message type -> method(Message) returning reply frames or None. One place to
        see all a node answers."""
        return {}

    def make_context(self) -> zmq.Context:
        return zmq.Context()

    # -- built-in handlers ---------------------------------------------------------------

    def on_hello(self, msg: Message):
        if self.model and msg["model"] and msg["model"] != self.model:
            raise ProtocolError(ProtocolError.INVALID_FIELD,
                                f"peer runs model {msg['model']}, this {self.role} runs {self.model}")
        return encode("Ready", {"role": self.role, "node_id": self.node_id, "model": self.model}, reply_to=msg.id)

    def on_ping(self, msg: Message):
        return encode("Pong", {"sent_at": msg["sent_at"]}, reply_to=msg.id)

    def stats(self) -> dict:
        """What `shoal nodes` and the metrics endpoint show; roles add their own."""
        out = {"counters": dict(self.counters), "uptime_s": time.time() - self.started, "address": self.advertise}
        if sockets.fault_plan() is not None:  # faults injected by this process's sockets
            from shoal.transport.faults import INJECTED

            out["faults_injected"] = dict(INJECTED)
        return out

    def on_stats(self, msg: Message):
        return encode("Stats", {"role": self.role, "node_id": self.node_id, "stats": self.stats()}, reply_to=msg.id)

    def serve_metrics(self, port: int, host: str = "127.0.0.1") -> None:
        """Prometheus endpoint: every counter, plus the role's numeric stats."""
        from shoal.nodes.metrics import start_metrics_server

        start_metrics_server(self, port, host)

    # -- the loop ------------------------------------------------------------------------

    def route(self, frames: list) -> tuple[Message | None, list | None]:
        """Decodes a request: (message, None) when its handler should run, else
        (None, the Error reply) for a bad message or a type this node does not handle."""
        try:
            msg = decode(frames, self.max_message_bytes)
        except ProtocolError as e:
            self.counters[f"errors.{e.code}"] += 1
            log.warning("[%s %s] bad message: %s", self.role, self.node_id, e)
            return None, error_reply(e)
        self.counters[f"messages.{msg.type}"] += 1
        if msg.type not in self.handlers:
            self.counters["errors.unhandled"] += 1
            return None, error_reply(ProtocolError(ProtocolError.UNKNOWN_TYPE, f"a {self.role} does not handle {msg.type}"),
                                     about=msg.type, reply_to=msg.id)
        return msg, None

    def failed(self, msg: Message, e: Exception) -> list:
        """The Error reply for a handler that raised."""
        if isinstance(e, ProtocolError):
            self.counters[f"errors.{e.code}"] += 1
            return error_reply(e, about=msg.type, reply_to=msg.id)
        self.counters["errors.internal"] += 1  # a handler bug fails the request, not the node
        log.error("[%s %s] %s failed", self.role, self.node_id, msg.type, exc_info=e)
        return error_reply(ProtocolError(ProtocolError.INTERNAL, f"{type(e).__name__}: {e}"), about=msg.type, reply_to=msg.id)

    def dispatch(self, frames: list) -> list | None:
        """Reply frames for one request (without the routing identity)."""
        msg, err = self.route(frames)
        if msg is None:
            return err
        try:
            return self.handlers[msg.type](msg)
        except Exception as e:
            return self.failed(msg, e)

    def poll_once(self, timeout_ms: int) -> list[tuple[bytes, list]]:
        """Receives every request waiting now (after up to timeout_ms for the first).
        A node with an outbox (requests it sent without waiting) takes their replies
        here too, and sends again what timed out."""
        if self.outbox is not None:
            return self._poll_with_outbox(timeout_ms)
        got = []
        if self.sock.poll(timeout_ms):
            self.received_at = time.monotonic()
            while True:
                try:
                    frames = self.sock.recv_multipart(zmq.NOBLOCK, copy=False)
                except zmq.Again:
                    break
                got.append((frames[0].bytes, [f.buffer for f in frames[1:]]))
        return got

    def _poll_with_outbox(self, timeout_ms: int) -> list[tuple[bytes, list]]:
        own = sockets.raw(self.sock)
        if self._poller is None:
            self._poller = zmq.Poller()
            self._poller.register(own, zmq.POLLIN)
        for sock in self.outbox.new_sockets:
            self._poller.register(sockets.raw(sock), zmq.POLLIN)
        self.outbox.new_sockets.clear()
        ready = dict(self._poller.poll(timeout_ms))
        for sock in ready:
            if sock is not own:
                self.outbox.take_replies(sock)
        self.outbox.resend_due(time.monotonic())
        if own not in ready:
            return []
        self.received_at = time.monotonic()
        got = []
        while True:
            try:
                frames = self.sock.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return got
            got.append((frames[0].bytes, [f.buffer for f in frames[1:]]))

    def send(self, identity: bytes, frames: list) -> None:
        try:
            self.sock.send_multipart([identity, *frames])
        except zmq.ZMQError as e:  # ROUTER_MANDATORY: the peer is gone
            self.counters["errors.unroutable"] += 1
            log.info("[%s %s] reply to a vanished peer dropped: %s", self.role, self.node_id, e)

    def handle_batch(self, batch: list[tuple[bytes, list]]) -> None:
        for identity, frames in batch:
            reply = self.dispatch(frames)
            if reply is not None:
                self.send(identity, reply)

    def serve_forever(self) -> None:
        log.info("[start] %s %s serving on %s", self.role, self.node_id, self.address)
        while not self._stop.is_set():
            if self.registration is not None and not self.serves_without_lease and not self.registration.alive():
                self.counters["lease_lost"] += 1
                time.sleep(0.1)  # past our own lease deadline: take no work
                continue
            batch = self.poll_once(self.poll_timeout_ms())
            if batch:
                self.handle_batch(batch)
            try:
                self.tick()
            except Exception:  # a bug in periodic work must not take the node down
                self.counters["errors.tick"] += 1
                log.exception("[tick] failed")
                self._stop.wait(0.5)
        self.close()

    def tick(self) -> None:
        """Called every loop turn (at least every 100 ms): periodic work of a role."""

    def poll_timeout_ms(self) -> int:
        """How long the loop waits for a request before its next turn."""
        return 100

    def stop(self) -> None:
        self._stop.set()

    def close(self) -> None:
        if self.registration is not None:
            self.registration.stop()
        # destroy, not term: it also closes the clients a role opened to its peers,
        # which would otherwise keep term() waiting forever.
        sockets.close_context(self.ctx)
        log.info("[shutdown] %s %s", self.role, self.node_id)


def node_arg_parser(role: str, etcd_required: bool = False) -> argparse.ArgumentParser:
    """The options every `shoal node ROLE` takes; a role adds its own."""
    ap = argparse.ArgumentParser(prog=f"shoal node {role}")
    ap.add_argument("--bind", default="tcp://127.0.0.1:0", help="tcp://HOST:PORT (port 0: a free one)")
    ap.add_argument("--advertise", help="the address peers should use, if not the bound one")
    ap.add_argument("--etcd", required=etcd_required, help="HOST:PORT of the cluster's etcd")
    ap.add_argument("--cluster", default="default")
    ap.add_argument("--node-id")
    ap.add_argument("--metrics-port", type=int, help="serve Prometheus metrics on this port")
    ap.add_argument("--metrics-host", default="127.0.0.1",
                    help="the interface metrics listen on (default loopback); beyond loopback only where the node's "
                         "own ports may listen there (CURVE keys or --insecure): metrics are plain HTTP, unauthenticated")
    ap.add_argument("--insecure", action="store_true",
                    help="listen beyond loopback without CURVE keys (only on a network trusted as a whole)")
    return ap


def parse_node_args(ap: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """The role's options, refused (exit 2, with the reason) where the node would listen
    beyond loopback without CURVE keys and without --insecure (`exposure.py`)."""
    from shoal.nodes.exposure import ExposureError, check_listen

    args = ap.parse_args(argv)
    keys = sockets.resolve_keys(sockets.FROM_ENV) is not None
    try:
        check_listen(args.bind, keys, args.insecure)
        if args.metrics_port:
            check_listen(f"tcp://{args.metrics_host}:{args.metrics_port}", keys, args.insecure)
    except ExposureError as e:
        ap.error(str(e))
    return args


def add_data_root_arg(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--data-root", action="append", default=None,
                    help="a folder whose files requests may name (input files, corpora, embedding outputs, "
                         "indexes); repeat for more. Default: / on a loopback address, none beyond it")


def data_roots_of(args: argparse.Namespace) -> list[str]:
    return args.data_root if args.data_root is not None else (["/"] if open_by_default(args) else [])


def open_by_default(args: argparse.Namespace) -> bool:
    """A node on loopback trusts this machine's users (any program, any path); beyond
    it, only what --allow-programs and --data-root grant."""
    from shoal.nodes.exposure import is_loopback

    return is_loopback(args.bind)


def lasting_node_id(data_dir: str, role: str, given: str | None) -> str:
    """A node with a data directory keeps its id across restarts (the id is written
    there on first start): peers find it again by id, even at a new address."""
    import os
    import uuid
    from pathlib import Path

    path = Path(data_dir) / "node_id"
    if given:
        node_id = given
    elif path.exists():
        node_id = path.read_text().strip()
    else:
        node_id = f"{role}-{uuid.uuid4().hex[:8]}"
    if not path.exists() or path.read_text().strip() != node_id:
        os.makedirs(data_dir, exist_ok=True)
        path.write_text(node_id + "\n")
    return node_id


def start_logging(role: str, node_id: str) -> None:
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s {role} {node_id} %(levelname)s %(name)s: %(message)s")


def run_node(node: Node, metrics_port: int | None = None, metrics_host: str = "127.0.0.1") -> int:
    """The thin process entry: metrics, signals, the address line the launcher reads,
    then the loop until SIGTERM or SIGINT."""
    if metrics_port:
        node.serve_metrics(metrics_port, metrics_host)
    signal.signal(signal.SIGTERM, lambda *_: node.stop())
    signal.signal(signal.SIGINT, lambda *_: node.stop())
    freeze_startup_heap()
    print(f"{node.role}: {node.address}", flush=True)
    node.serve_forever()
    return node.exit_code
