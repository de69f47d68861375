"""Tables on the wire: a pyarrow Table as an Arrow IPC stream blob, and back.

One place for both directions, so every sender and receiver of a table blob (texts to
a worker, vectors to storage) agrees on the framing; pyarrow is imported only here,
when a table is actually sent or received.
"""

from __future__ import annotations

from shoal.protocol.errors import ProtocolError


def table_to_ipc(table) -> bytes:
    import pyarrow as pa

    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def table_from_ipc(data):
    """The table in a blob; a blob that is not an Arrow IPC stream is a protocol error."""
    import pyarrow as pa

    try:
        return pa.ipc.open_stream(pa.py_buffer(data)).read_all()
    except Exception as e:  # pyarrow raises several kinds for bytes that are not a stream
        raise ProtocolError(ProtocolError.INVALID_FIELD, f"table blob is not an Arrow IPC stream ({e})") from None
