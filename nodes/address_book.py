"""Where a node is now, given where it was.

Messages and job records name peers by address (a job's storage node, the leader its
progress goes to). A node that restarts with the same id at a new address — a storage
node on another port after a crash — must still be found by every loop that retries a
delivery to it. The book remembers which node id published each address it has seen in
membership, and answers a retry with that node's current address.
"""

from __future__ import annotations

import threading

from shoal.nodes.membership import Member, MemberView


class AddressBook:
    def __init__(self, view: MemberView):
        self.view = view
        self._owner: dict[str, str] = {}  # every address seen -> the node id that published it
        self._lock = threading.Lock()
        view.listeners.append(self._seen)
        self._seen(view.snapshot())

    def _seen(self, members: dict[str, Member]) -> None:
        with self._lock:
            for node_id, m in members.items():
                if m.info.get("address"):
                    self._owner[m.info["address"]] = node_id

    def current(self, address: str) -> str:
        """The address of the node that published `address`, as it is now (the same
        address if the node is not a member right now, or was never seen)."""
        with self._lock:
            node_id = self._owner.get(address)
        if node_id is None:
            return address
        member = self.view.snapshot().get(node_id)
        return member.info.get("address", address) if member is not None else address

    def name(self, address: str) -> str:
        """`role node-id (address)` for messages that say who did not answer."""
        with self._lock:
            node_id = self._owner.get(address)
        member = self.view.snapshot().get(node_id) if node_id else None
        if member is None:
            return f"{node_id} ({address})" if node_id else address
        return f"{member.role} {node_id} ({address})"
