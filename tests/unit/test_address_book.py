"""The AddressBook follows a node id to its current address, by the role asked for."""

from __future__ import annotations

from shoal.nodes.address_book import AddressBook
from shoal.nodes.membership import Member


class View:
    """What the book reads of a MemberView: snapshots, one member, change callbacks."""

    def __init__(self):
        self.members: dict[str, Member] = {}
        self.listeners = []

    def snapshot(self, role=None):
        return {k: m for k, m in self.members.items() if role is None or m.role == role}

    def member(self, role, node_id):
        m = self.members.get(node_id)
        return m if m is not None and m.role == role else None

    def put(self, role, node_id, address):
        self.members[node_id] = Member(role, node_id, {"address": address})
        for fn in self.listeners:
            fn(self.snapshot())

    def drop(self, node_id):
        del self.members[node_id]
        for fn in self.listeners:
            fn(self.snapshot())


def test_a_restarted_node_is_found_at_its_new_address():
    view = View()
    view.put("storage", "storage-0", "tcp://h:1")
    book = AddressBook(view)
    assert book.current("tcp://h:1", "storage") == "tcp://h:1"
    view.drop("storage-0")  # killed: until it is back, retries keep the old address
    assert book.current("tcp://h:1", "storage") == "tcp://h:1"
    view.put("storage", "storage-0", "tcp://h:2")  # the same id on a new port
    assert book.current("tcp://h:1", "storage") == "tcp://h:2" == book.current("tcp://h:1")
    assert book.current("tcp://elsewhere:9") == "tcp://elsewhere:9"  # never seen: unchanged
    assert book.name("tcp://h:1") == "storage storage-0 (tcp://h:1)"


def test_a_port_taken_by_another_kind_of_node_does_not_mislead():
    view = View()
    book = AddressBook(view)
    view.put("storage", "storage-0", "tcp://h:1")
    view.drop("storage-0")
    view.put("worker", "worker-7", "tcp://h:1")  # the dead storage node's port, reused
    assert book.current("tcp://h:1", "storage") == "tcp://h:1"  # still where storage was
    view.put("storage", "storage-0", "tcp://h:3")
    assert book.current("tcp://h:1", "storage") == "tcp://h:3"
    assert book.current("tcp://h:1", "worker") == "tcp://h:1"
