"""A node's Prometheus endpoint: its counters and numeric stats, read at scrape time."""

from __future__ import annotations

from prometheus_client import start_http_server
from prometheus_client.core import REGISTRY, GaugeMetricFamily


def _numbers(prefix: str, d: dict):
    for k, v in d.items():
        name = f"{prefix}_{k}".replace(".", "_").replace("-", "_")
        if isinstance(v, bool):
            yield name, float(v)
        elif isinstance(v, (int, float)):
            yield name, float(v)
        elif isinstance(v, dict) and k not in ("jobs", "held"):
            yield from _numbers(name, v)


class NodeCollector:
    def __init__(self, node):
        self.node = node

    def collect(self):
        labels = ["role", "node_id"]
        for name, value in _numbers("shoal", self.node.stats()):
            g = GaugeMetricFamily(name, f"Shoal {name}", labels=labels)
            g.add_metric([self.node.role, self.node.node_id], value)
            yield g


def start_metrics_server(node, port: int, host: str = "127.0.0.1") -> None:
    """On `host` only: loopback unless the node was told otherwise (and may listen there,
    `node.parse_node_args`); never every interface by default."""
    REGISTRY.register(NodeCollector(node))
    start_http_server(port, addr=host)
