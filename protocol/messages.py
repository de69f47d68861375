"""Every message type on the wire, declared once (see `version.py` for the evolution
rule). A message is `[header, blob...]`; the fields below travel in the header, the
blobs as raw frames (tensors as safetensors bytes, tables as Arrow IPC)."""

from __future__ import annotations

from shoal.protocol.schema import Field as F
from shoal.protocol.schema import MessageType as M

MESSAGES: dict[str, M] = {}


def _declare(m: M) -> M:
    if m.name in MESSAGES:
        raise ValueError(f"message type {m.name} declared twice")
    MESSAGES[m.name] = m
    return m


# -- handshake and control ---------------------------------------------------------------
HELLO = _declare(M("Hello", "A peer introduces itself; answered by Ready or Error.", (
    F("role", "str"), F("node_id", "str"), F("model", "str", ""), F("capabilities", "dict", dict))))
READY = _declare(M("Ready", "The handshake succeeded: the receiver's own identity.", (
    F("role", "str"), F("node_id", "str"), F("model", "str", ""))))
ERROR = _declare(M("Error", "A request failed; `code` is machine-readable, `message` names the problem.", (
    F("code", "str"), F("message", "str"), F("about", "str", ""))))
PING = _declare(M("Ping", "Liveness and control-latency probe; answered by Pong.", (F("sent_at", "float", 0.0),)))
PONG = _declare(M("Pong", "Reply to Ping, echoing its send time.", (F("sent_at", "float", 0.0),)))

# -- jobs: client <-> router -------------------------------------------------------------
SUBMIT_JOB = _declare(M("SubmitJob", "Run a program over items; idempotent on job_key. `params` are the "
                        "program's arguments; those of a generation program (generate, openai_request) are its "
                        "settings, the fields of `protocol/generation_settings.py` (1.9), each item's own fields "
                        "winning over them: an unknown or bad one is refused with `invalid_field`, naming it.", (
    F("job_key", "str"), F("program", "str"), F("params", "dict", dict),
    F("items", "list", list), F("input_path", "str", "", nullable=True), F("upload_id", "str", "")),
    blobs=("items_jsonl",)))
UPLOAD_CHUNK = _declare(M("UploadChunk", "One chunk of a large job input (JSONL bytes), stored on storage; re-sending a chunk is harmless.", (
    F("upload_id", "str"), F("index", "int")), blobs=("data",), required_blobs=("data",)))
UPLOAD_ACK = _declare(M("UploadAck", "The chunk is on storage's disk.", (
    F("upload_id", "str"), F("index", "int"), F("bytes", "int", 0))))
JOB_ACCEPTED = _declare(M("JobAccepted", "The job is durably recorded; duplicate=True if the key was seen before.", (
    F("job_id", "str"), F("job_key", "str"), F("total", "int", 0), F("duplicate", "bool", False),
    F("detail", "dict", dict))))
JOB_STATUS_QUERY = _declare(M("JobStatusQuery", "Ask for a job's status.", (F("job_id", "str"),)))
JOB_STATUS = _declare(M("JobStatus", "A job's state and counts.", (
    F("job_id", "str"), F("state", "str"), F("total", "int", 0), F("done", "int", 0), F("failed", "int", 0),
    F("tokens_per_s", "float", 0.0), F("detail", "dict", dict))))
SUBSCRIBE = _declare(M("Subscribe", "Stream a job's results from an offset (resumable). With `wait_ms` (1.8) "
                       "storage holds the answer up to that long (at most 10 s) unless every item's result is "
                       "stored or a full batch is ready: a client that has read all there is asks once per "
                       "wait and learns at once that the job is complete.", (
    F("job_id", "str"), F("offset", "int", 0), F("wait_ms", "int", 0))))
RESULT_BATCH = _declare(M("ResultBatch", "Result records of a job, starting at `offset` in its result log; "
                          "`final`: the job is over and these are its last records; `available`: how many are "
                          "stored; `disk_full` (1.10): why storage takes no more results now (its disk is full, "
                          "named with its free bytes), empty while it takes them.", (
    F("job_id", "str"), F("offset", "int"), F("records", "list"), F("final", "bool", False),
    F("available", "int", 0), F("disk_full", "str", ""))))
CANCEL_JOB = _declare(M("CancelJob", "Stop a job; finished results are kept.", (F("job_id", "str"),)))

# -- placement: scheduler <-> worker -------------------------------------------------------
ASSIGN = _declare(M("AssignSequences", "Sequences ({seq_id, item}) for a worker to run as coroutines of the job's "
                    "program; carries the leader's epoch.", (
    F("epoch", "int"), F("job_id", "str"), F("sequences", "list[dict]", keys=("seq_id",)), F("report_to", "str", ""),
    F("storage", "str", ""), F("program", "str", "generate"), F("args", "dict", dict))))
ASSIGN_ACK = _declare(M("AssignAck", "Which assigned sequences a worker took; refused ones carry their error.", (
    F("job_id", "str"), F("accepted", "int"), F("refused", "list", list))))
STATS_QUERY = _declare(M("StatsQuery", "Ask a node for its counters.", ()))
STATS = _declare(M("Stats", "A node's counters, queue depths and engine state.", (
    F("role", "str"), F("node_id", "str"), F("stats", "dict"))))
PROGRESS = _declare(M("ProgressReport", "A worker's batched progress: finished ids (stored), counters, load, and "
                      "sequences it moved to other workers ([seq_id, node_id] pairs).", (
    F("node_id", "str"), F("finished", "list[id]", list), F("stats", "dict", dict), F("job_id", "str", ""),
    F("failed", "list[id]", list), F("tokens", "int", 0), F("moved", "list[pair]", list))))
PROGRESS_ACK = _declare(M("ProgressAck", "The scheduler took a ProgressReport.", (F("epoch", "int", 0),)))
SEQUENCE_STATE = _declare(M("SequenceState", "A sequence's exported state (protocol/sequence_state.py), KV optional.", (
    F("state", "dict"),), blobs=("kv",)))

# -- inputs: scheduler <-> storage ----------------------------------------------------------
INGEST_INPUT = _declare(M("IngestInput", "Check and store a job's input (inline items, an upload, or a path storage reads).", (
    F("job_id", "str"), F("items", "list", list), F("upload_id", "str", ""), F("input_path", "str", ""),
    F("epoch", "int", 0), F("program", "str", "generate"))))
INPUT_READY = _declare(M("InputReady", "A job's input is checked and durable.", (F("job_id", "str"), F("total", "int"))))
READ_INPUT = _declare(M("ReadInput", "Read a page of a job's stored items, in input order; pending_only skips items with results.", (
    F("job_id", "str"), F("offset", "int"), F("limit", "int", 512), F("pending_only", "bool", False))))
INPUT_BATCH = _declare(M("InputBatch", "A page of a job's items from `offset`; read on from next_offset. With "
                         "pending_only, `checkpoints` holds each item's last sequence state (or null).", (
    F("job_id", "str"), F("offset", "int"), F("items", "list"), F("next_offset", "int", 0),
    F("checkpoints", "list", list))))
LOG_JOB = _declare(M("LogJob", "Record a job's state in the durable job log on storage (the leader's epoch fences it).", (
    F("epoch", "int"), F("job", "dict"))))
JOB_LOGGED = _declare(M("JobLogged", "The job record is durable.", (F("job_id", "str"), F("state", "str"))))
LIST_JOBS = _declare(M("ListJobs", "A new leader reads the job log (and fences older epochs off).", (F("epoch", "int"),)))
JOB_LIST = _declare(M("JobList", "Every logged job, its latest record, with its result counts.", (F("jobs", "list"),)))
RESULT_COUNT_QUERY = _declare(M("ResultCountQuery", "How many results a job has on storage.", (F("job_id", "str"),)))
RESULT_COUNT = _declare(M("ResultCount", "A job's stored results and how many of them failed.", (
    F("job_id", "str"), F("records", "int"), F("failed", "int", 0))))

# -- recovery: a new leader asks each worker what it holds -------------------------------------
HOLDING_QUERY = _declare(M("HoldingQuery", "A new leader asks what a worker holds, and where to report from now on.", (
    F("epoch", "int"), F("report_to", "str"))))
HOLDING = _declare(M("Holding", "The sequences a worker holds (queued, running, or finished but not yet stored), by job.", (
    F("node_id", "str"), F("jobs", "dict[list]"))))

# -- moving sequences: scheduler -> worker, worker -> worker -------------------------------
MIGRATE = _declare(M("MigrateSequences", "Move sequences of a job to another worker: the listed seq_ids, or `count` "
                     "of the source's choosing (queued ones first); count < 0 means all.", (
    F("epoch", "int"), F("job_id", "str"), F("to_node", "str"), F("to_address", "str"),
    F("seq_ids", "list[id]", list), F("count", "int", 0))))
MIGRATE_ACK = _declare(M("MigrateAck", "The source will move up to `accepted` sequences (reported as moved when done).", (
    F("job_id", "str"), F("accepted", "int"))))
IMPORT_CHUNK = _declare(M("ImportChunk", "One chunk of a moving sequence's KV blob; re-sending a chunk is harmless.", (
    F("transfer_id", "str"), F("index", "int")), blobs=("data",), required_blobs=("data",)))
IMPORT_CHUNK_ACK = _declare(M("ImportChunkAck", "The chunk is held for the transfer.", (
    F("transfer_id", "str"), F("index", "int"))))
IMPORT_SEQUENCE = _declare(M("ImportSequence", "Take over a sequence ({seq_id, item, state}) whose KV came in `chunks` "
                             "ImportChunks of this transfer (0: none); idempotent on the seq id.", (
    F("transfer_id", "str"), F("job_id", "str"), F("program", "str"), F("args", "dict", dict),
    F("sequence", "dict", keys=("seq_id", "item")), F("chunks", "int", 0), F("storage", "str", ""),
    F("report_to", "str", ""))))
IMPORT_ACK = _declare(M("ImportAck", "The target holds the sequence now (the source may free it).", (
    F("job_id", "str"), F("seq_id", "any"))))
DRAIN = _declare(M("DrainWorker", "Stop admitting work, let the scheduler move what is held, then leave and exit.", (
    F("epoch", "int"),)))
DROP_JOB = _declare(M("DropJob", "A cancelled job: stop its sequences where they are and let them go (results already "
                                 "finished are still stored); carries the leader's epoch; answered by OpsAck.", (
    F("epoch", "int"), F("job_id", "str"))))
DRAIN_NODE = _declare(M("DrainNode", "Ask the scheduler to drain a worker (from a client, through the router).", (
    F("node_id", "str"),)))
MIGRATE_REQUEST = _declare(M("MigrateRequest", "Ask the scheduler to move a job's sequences (all, or seq_ids) to a worker.", (
    F("job_id", "str"), F("to_node", "str"), F("seq_ids", "list[id]", list))))
OPS_ACK = _declare(M("OpsAck", "What an ops request set in motion.", (F("detail", "dict", dict),)))

# -- results: worker -> storage ------------------------------------------------------------
WRITE_CHECKPOINTS = _declare(M("WriteCheckpoints", "Sequence states without KV ({id, state}) to restart from if their "
                               "worker dies; storage keeps a state only if it is ahead of the one it has.", (
    F("job_id", "str"), F("checkpoints", "list[dict]", keys=("id", "state")))))
CHECKPOINT_ACK = _declare(M("CheckpointAck", "The checkpoints are on disk (`kept` of them were new).", (
    F("job_id", "str"), F("kept", "int"))))
WRITE_RESULTS = _declare(M("WriteResults", "Result records to persist; first writer wins per item id.", (
    F("job_id", "str"), F("records", "list[dict]", keys=("id",)))))
WRITE_ACK = _declare(M("WriteAck", "Records are durable (after group commit).", (
    F("job_id", "str"), F("written", "int"), F("duplicates", "int", 0))))

# -- bulk embedding: SuperBatches (protocol 1.4) ----------------------------------------------
INGEST_CORPUS = _declare(M("IngestCorpus", "Read and store an embedding job's corpus (files storage can read) and open its "
                           "output directory, whose manifest must match `header` (encoder, dim, dtype).", (
    F("epoch", "int"), F("job_id", "str"), F("corpus", "dict"), F("output", "str"), F("header", "dict"))))
CORPUS_READY = _declare(M("CorpusReady", "The corpus is stored: texts, partitions, bad rows skipped (the first few "
                          "named), empty partitions, and texts the output already holds.", (
    F("job_id", "str"), F("total", "int"), F("partitions", "int"), F("skipped", "int", 0),
    F("errors", "list", list), F("empty", "list", list), F("done", "int", 0))))
READ_PARTITIONS = _declare(M("ReadPartitions", "A page of an embedding job's partition list ([name, size], stored order).", (
    F("job_id", "str"), F("offset", "int", 0), F("limit", "int", 4096))))
PARTITION_PAGE = _declare(M("PartitionPage", "Partitions from `offset`; read on from next_offset until it reaches total.", (
    F("job_id", "str"), F("partitions", "list"), F("next_offset", "int"), F("total", "int"))))
READ_MANIFEST = _declare(M("ReadManifest", "A page of the SuperBatch ids an embedding job's output holds.", (
    F("job_id", "str"), F("offset", "int", 0), F("limit", "int", 8192))))
MANIFEST_PAGE = _declare(M("ManifestPage", "SuperBatch ids from `offset` in manifest order.", (
    F("job_id", "str"), F("ids", "list[str]"), F("next_offset", "int"), F("total", "int"))))
ASSIGN_SUPERBATCHES = _declare(M("AssignSuperBatches", "SuperBatches ({id, slices: [[partition, start, end]]}) for a "
                                 "worker to embed; texts come from `storage`; idempotent on the ids.", (
    F("epoch", "int"), F("job_id", "str"), F("superbatches", "list[dict]", keys=("id", "slices")), F("storage", "str"), F("report_to", "str", ""),
    F("encoder", "str"), F("vector_dtype", "str", "float32"))))
READ_TEXTS = _declare(M("ReadTexts", "The texts of an embedding job's rows, slice by slice ([[partition, start, end]]).", (
    F("job_id", "str"), F("slices", "list"))))
TEXTS = _declare(M("Texts", "Rows as an Arrow IPC table (id, text), in slice order.", (
    F("job_id", "str"), F("count", "int")), blobs=("table",), required_blobs=("table",)))
WRITE_EMBEDDINGS = _declare(M("WriteEmbeddings", "One SuperBatch's vectors as an Arrow IPC table (id, partition, row, "
                              "vector); storage writes it atomically and records it in the manifest, once.", (
    F("job_id", "str"), F("superbatch", "dict"), F("encoder", "str"), F("truncated", "int", 0)),
    blobs=("table",), required_blobs=("table",)))
EMBEDDINGS_ACK = _declare(M("EmbeddingsAck", "The SuperBatch is in the output (`written` false: it was already).", (
    F("job_id", "str"), F("id", "str"), F("written", "bool"))))
CLUSTER_INFO_QUERY = _declare(M("ClusterInfoQuery", "Ask the router for every member of the cluster.", ()))
CLUSTER_INFO = _declare(M("ClusterInfo", "Every member: {node_id, role, info} (what it published: address, model, "
                          "encoder, its cost terms).", (F("members", "list"),)))

# -- vector indexes (1.5): client -> router -> storage; worker -> storage ------------------
LOAD_INDEX = _declare(M("LoadIndex", "Load an index (`shoal index build` output at `path`, readable by the storage "
                        "nodes) under `name`, each shard on `replicas` storage nodes.", (
    F("name", "str"), F("path", "str"), F("replicas", "int", 1))))
INDEX_LOADED = _declare(M("IndexLoaded", "Where each shard of the index is loaded: placement[shard] = [node_id, ...].", (
    F("name", "str"), F("index_id", "str"), F("placement", "list"), F("rows", "int"), F("dim", "int"),
    F("encoder", "str"))))
LOAD_INDEX_SHARD = _declare(M("LoadIndexShard", "Load shard `shard` of the index at `path` under `name`; idempotent.", (
    F("name", "str"), F("path", "str"), F("shard", "int"))))
INDEX_SHARD_LOADED = _declare(M("IndexShardLoaded", "The shard is loaded and published in this node's membership.", (
    F("name", "str"), F("index_id", "str"), F("shard", "int"), F("rows", "int"))))
SEARCH_INDEX = _declare(M("SearchIndex", "Top-k of one shard for a batch of queries (blob: float32 [count, dim], "
                          "row-major); `index_id` guards against another version loaded under the same name; "
                          "`params`: empty, or per query its approximate search setting ({} | {nprobe} | {ef}).", (
    F("name", "str"), F("index_id", "str"), F("shard", "int"), F("k", "int"), F("count", "int"),
    F("params", "list[dict]", list)),
    blobs=("queries",), required_blobs=("queries",)))
SEARCH_RESULTS = _declare(M("SearchResults", "Per query, up to k hits {id, score, text}, best first (score, then id).", (
    F("name", "str"), F("shard", "int"), F("hits", "list"))))
