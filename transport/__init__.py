"""How nodes and clients talk: ZeroMQ sockets (high-water marks, heartbeats, ROUTER
mandatory), CURVE keys, injected network faults for tests, and request/reply clients
(blocking, asyncio, and the non-blocking outbox of an event loop). It imports nothing of
Shoal but `protocol/`."""
