"""The storage node's side of vector indexes: loading shards and answering searches.

The router sends `LoadIndexShard` (where the index lies on this node's disk, which
shard); the shard is loaded, remembered in `control/indexes.json` (so a restarted node
loads it again) and published in this node's membership record, where workers find
which storage nodes hold which shards. `SearchIndex` answers a whole batch of queries
with one matrix product (`index_shard.py`).
"""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path

import numpy as np
import orjson

from shoal.nodes.storage.index_shard import IndexShard
from shoal.nodes.storage.input_store import write_atomic
from shoal.protocol.codec import Message, encode
from shoal.protocol.errors import ProtocolError
from shoal.vector_index import IndexFileError

log = logging.getLogger(__name__)


def index_id(folder: str | Path) -> str:
    """An index's identity: its manifest's content (which holds a digest of every shard's
    vectors and ids, and when it was built)."""
    return hashlib.blake2b((Path(folder) / "index.json").read_bytes(), digest_size=8).hexdigest()


def _search_setting(p) -> bool:
    """One query's approximate search setting: {}, {"nprobe": n} or {"ef": n}, n > 0."""
    return isinstance(p, dict) and set(p) <= {"nprobe", "ef"} and all(
        isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in p.values())


class IndexService:
    def __init__(self, data_dir: Path, counters, data_roots=None):
        self.data_roots = data_roots  # where an index to load may be
        self.record = data_dir / "control" / "indexes.json"
        self.counters = counters
        self.publish = None  # set by the node: publishes `indexes` in its membership record
        self.loaded: dict[str, dict] = {}  # name -> {"path", "index_id", "meta", "shards": {i: IndexShard}}
        if self.record.exists():
            for name, rec in orjson.loads(self.record.read_bytes()).items():
                for shard in rec["shards"]:
                    try:
                        self._load(name, rec["path"], shard)
                    except Exception as e:  # a vanished or corrupt index must not keep the node down
                        log.error("[index] %s shard %d at %s not reloaded: %s", name, shard, rec["path"], e)

    def handlers(self) -> dict:
        return {"LoadIndexShard": self.on_load_shard, "SearchIndex": self.on_search}

    def published(self) -> dict:
        """What workers need to route a search: per index, its id, encoder, dimension,
        size, shard count and the shards held here."""
        return {name: {"index_id": rec["index_id"], "encoder": rec["meta"]["encoder"], "dim": rec["meta"]["dim"],
                       "rows": rec["meta"]["rows"], "shards_total": len(rec["meta"]["shards"]),
                       "built_at": rec["meta"].get("built_at", 0.0), "shards": sorted(rec["shards"])}
                for name, rec in self.loaded.items() if rec["shards"]}

    def _load(self, name: str, path: str, shard: int) -> IndexShard:
        iid = index_id(path)
        rec = self.loaded.get(name)
        if rec is not None and rec["index_id"] == iid and rec["path"] == path and shard in rec["shards"]:
            return rec["shards"][shard]
        loaded = IndexShard(path, shard)  # first: a shard that fails to load changes nothing here
        if rec is None or rec["index_id"] != iid or rec["path"] != path:  # another index under this name replaces it
            if rec is not None:
                log.info("[index] %s: replacing index %s (%s) with %s (%s)", name, rec["index_id"], rec["path"], iid, path)
            rec = self.loaded[name] = {"path": path, "index_id": iid, "meta": loaded.meta, "shards": {}}
        rec["shards"][shard] = loaded
        log.info("[index] %s shard %d loaded from %s: %d passages", name, shard, path, loaded.rows)
        return loaded

    def on_load_shard(self, msg: Message):
        if self.data_roots is not None:
            self.data_roots.check(msg["path"], "index")
        path = str(Path(msg["path"]).resolve())
        try:
            shard = self._load(msg["name"], path, msg["shard"])
        except Exception as e:  # a missing or corrupt file: refused by name, nothing changes here
            raise ProtocolError(ProtocolError.BAD_INPUT, f"index {msg['name']!r} shard {msg['shard']}: "
                                f"{e if isinstance(e, (IndexFileError, OSError)) else f'{type(e).__name__}: {e}'}") from None
        write_atomic(self.record, orjson.dumps({n: {"path": r["path"], "shards": sorted(r["shards"])}
                                                for n, r in self.loaded.items()}))
        if self.publish:
            self.publish(self.published())
        self.counters["index.shards_loaded"] += 1
        return encode("IndexShardLoaded", {"name": msg["name"], "index_id": self.loaded[msg["name"]]["index_id"],
                                           "shard": msg["shard"], "rows": shard.rows}, reply_to=msg.id)

    def on_search(self, msg: Message):
        rec = self.loaded.get(msg["name"])
        shard = rec["shards"].get(msg["shard"]) if rec else None
        if shard is None:
            raise ProtocolError(ProtocolError.UNKNOWN_INDEX, f"storage holds no shard {msg['shard']} of index {msg['name']!r}")
        if msg["index_id"] and msg["index_id"] != rec["index_id"]:
            raise ProtocolError(ProtocolError.UNKNOWN_INDEX, f"index {msg['name']!r} here is {rec['index_id']}, "
                                f"not {msg['index_id']}")
        dim, count = shard.meta["dim"], msg["count"]
        blob = msg.blobs["queries"]
        if count < 0 or len(blob) != count * dim * 4:
            raise ProtocolError(ProtocolError.INVALID_FIELD, f"queries blob of {len(blob)} bytes is not {count} "
                                f"float32 vectors of dimension {dim}")
        if msg["k"] < 1:
            raise ProtocolError(ProtocolError.INVALID_FIELD, f"k must be at least 1, got {msg['k']}")
        params = msg["params"]
        if params and (len(params) != count or not all(map(_search_setting, params))):
            raise ProtocolError(ProtocolError.INVALID_FIELD, f"params must be empty or one {{nprobe | ef: positive "
                                f"integer}} per query ({count}), got {params[:3]!r}...")
        queries = np.frombuffer(bytes(blob), np.float32).reshape(count, dim)
        hits = shard.search(queries, msg["k"], params or None)
        self.counters["index.searches"] += 1
        self.counters["index.queries"] += count
        return encode("SearchResults", {"name": msg["name"], "shard": msg["shard"], "hits": hits}, reply_to=msg.id)
