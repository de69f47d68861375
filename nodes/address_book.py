"""Where a node is now, given where it was.

Messages and job records name peers by address (a job's storage node, the leader its
progress goes to). A node that restarts with the same id at a new address — a storage
node on another port after a crash — must still be found by every loop that retries a
delivery to it. The book remembers which node of each role published each address it
has seen in membership, and answers a retry with that node's current address. Asked
with the role it expects, it is not misled by another kind of node that later took the
same port.
"""

from __future__ import annotations

import threading

from shoal.nodes.membership import Member, MemberView


class AddressBook:
    def __init__(self, view: MemberView):
        self.view = view
        self._owner: dict[str, dict[str, str]] = {}  # address -> role -> the node id that last published it
        self._last: dict[str, tuple[str, str]] = {}  # address -> (role, node id) that last published it
        self._lock = threading.Lock()
        view.listeners.append(self._seen)
        self._seen(view.snapshot())

    def _seen(self, members: dict[str, Member]) -> None:
        with self._lock:
            for node_id, m in members.items():
                if m.info.get("address"):
                    self._owner.setdefault(m.info["address"], {})[m.role] = node_id
                    self._last[m.info["address"]] = (m.role, node_id)

    def _publisher(self, address: str, role: str | None) -> tuple[str, str] | None:
        """(role, node id) of the node that last published `address` (of `role`, if given)."""
        with self._lock:
            if role is None:
                return self._last.get(address)
            node_id = self._owner.get(address, {}).get(role)
            return (role, node_id) if node_id else None

    def current(self, address: str, role: str | None = None) -> str:
        """The address of the node (of `role`, if given) that published `address`, as it
        is now (the same address if that node is not a member now, or was never seen).
        Asked on every delivery and command: one lookup, no copy of the member view."""
        publisher = self._publisher(address, role)
        member = self.view.member(*publisher) if publisher else None
        return member.info.get("address", address) if member is not None else address

    def name(self, address: str) -> str:
        """`role node-id (address)` for messages that say who did not answer."""
        publisher = self._publisher(address, None)
        if publisher is None:
            return address
        role, node_id = publisher
        return f"{role} {node_id} ({address})" if self.view.member(role, node_id) else f"{node_id} ({address})"
