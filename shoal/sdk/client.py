"""The Python SDK: submit jobs to a Shoal cluster's router and stream their results.

    client = shoal.Client("tcp://127.0.0.1:5555")
    job = client.submit([{"id": 1, "prompt": "Hello"}], params={"max_tokens": 32})
    for record in job.results():
        print(record["id"], record["text"])

No torch here: the SDK installs with `pip install shoal`.
"""

from __future__ import annotations

import hashlib
import logging
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import orjson

from shoal.protocol.errors import ProtocolError
from shoal.transport.rpc import DEFAULT_TIMEOUT_S, RemoteError, RpcClient

log = logging.getLogger(__name__)


# How long a read that has caught up with a job's results may wait on storage for more:
# `Job.results()` (what the CLIs stream to their output and progress line) and
# `Job.wait()`, which uses nothing before the end. Storage answers at once when the job
# completes or a full batch is stored, so the end is seen without delay either way. Each
# read wakes the router, the scheduler (the job's status) and storage, on the cores a
# local cluster's worker computes on: over a W1 job through a local cluster on 2 cores,
# reads every 0.2 s cost those processes and the client ~190 ms more CPU than reads
# every 2 s. Longer would only delay noticing a storage node that died with the read in
# hand (and, against storage older than protocol 1.8, which answers at once, the end).
RESULTS_POLL_S = 1.0
WAIT_POLL_S = 2.0


class Job:
    def __init__(self, client: "Client", job_id: str, total: int | None = None):
        self.client = client
        self.id = job_id
        self.total = total
        self.detail: dict = {}  # what the cluster found in the input (an embedding job's bad rows, ...)

    def status(self) -> dict:
        return self.client._request("JobStatusQuery", {"job_id": self.id}).fields

    def results(self, offset: int = 0, poll: float = RESULTS_POLL_S, timeout: float | None = None) -> Iterator[dict]:
        """Result records as they are stored, from `offset` (resumable), until the job
        is done and every result has been read. Having read all there is, the client
        asks storage to hold its next read up to `poll` seconds (answered at once when
        the job completes), so it learns of the end without polling for it."""
        end = None if timeout is None else time.monotonic() + timeout

        def caught_up_wait() -> float:  # no longer than the timeout has left
            return poll if end is None else max(0.0, min(poll, end - time.monotonic()))

        wait = caught_up_wait()
        said = ""
        while True:
            asked, sent = time.monotonic(), wait
            batch = self.client._request("Subscribe", {"job_id": self.id, "offset": offset,
                                                       "wait_ms": int(1000 * sent)},
                                         reply_timeout=self.client.reply_timeout + sent)
            full = batch.get("disk_full", "")
            if full != said:  # said once when it fills, once when it has room again
                if full:
                    log.warning("job %s waits: %s", self.id, full)
                else:
                    log.warning("job %s: storage takes results again", self.id)
                said = full
            yield from batch["records"]
            offset += len(batch["records"])
            if batch["final"]:
                return
            if not batch["records"] and end is not None and time.monotonic() >= end:
                raise TimeoutError(f"job {self.id}: {offset} results after {timeout}s")
            wait = caught_up_wait() if offset >= batch["available"] else 0.0  # behind the log: read on at once
            # Caught up, yet answered before the wait this read asked for was over (storage
            # older than protocol 1.8 does not wait): pause for the rest of it. Asking again
            # at once would wake the router, scheduler and storage for every result as they
            # trickle in. A read that asked for no wait (behind the log) is no reason to pause:
            # the next one waits on storage, which answers the moment the job completes.
            left = min(wait, sent) - (time.monotonic() - asked)
            if wait and left > 0.001:
                time.sleep(left)

    def wait(self, timeout: float | None = None) -> list[dict]:
        """Every result, once the job is done. Nothing reads the results before the end,
        so each read may wait WAIT_POLL_S on storage (answered at once when the job
        completes or a full batch is stored): half the reads `results()` makes."""
        return list(self.results(poll=WAIT_POLL_S, timeout=timeout))

    def cancel(self) -> dict:
        return self.client._request("CancelJob", {"job_id": self.id}).fields

    def wait_until_done(self, poll: float = 0.5, timeout: float | None = None, on_status=None) -> dict:
        """Polls the job's status until it is no longer running (an embedding job has
        no result stream: its output is the directory); `on_status(status)` sees each."""
        end = None if timeout is None else time.monotonic() + timeout
        while True:
            st = self.status()
            if on_status is not None:
                on_status(st)
            if st["state"] != "running":
                return st
            if end is not None and time.monotonic() > end:
                raise TimeoutError(f"job {self.id}: {st['done']} of {st['total']} after {timeout}s")
            time.sleep(poll)


INLINE_BYTES = 1 << 20  # a larger input is uploaded in chunks, never sent as one message
# A chunk is what the router and storage hold of an upload at once (twice: received and
# forwarded), whatever the input's size.
CHUNK_BYTES = 1 << 20


DEFAULT_CLIENT_TIMEOUT_S = 120.0


class Client:
    """Every request is idempotent (a job key, an upload chunk index, an offset), so a
    request whose reply does not come within `reply_timeout` is sent again, and one
    answered 'unavailable' (no leader yet, a takeover under way, a node down) is retried
    after a pause, each until `timeout` seconds have passed since the call began; then
    the call raises a TimeoutError that names what did not answer. What it waits for
    is logged (logger `shoal.sdk.client`) as it changes."""

    def __init__(self, router: str, timeout: float = DEFAULT_CLIENT_TIMEOUT_S, curve_keys=None,
                 reply_timeout: float = DEFAULT_TIMEOUT_S):
        """`curve_keys`: the cluster's key directory when it uses CURVE (default:
        $SHOAL_CURVE_KEYS, if set)."""
        if timeout <= 0 or reply_timeout <= 0:
            raise ValueError(f"timeouts must be positive, got timeout={timeout}, reply_timeout={reply_timeout}")
        self.router = router
        kw = {"curve_keys": curve_keys} if curve_keys else {}
        self.rpc = RpcClient(router, watch_handshake=True, **kw)
        self.timeout, self.reply_timeout = timeout, reply_timeout

    def close(self) -> None:
        """Closes the connection to the router (also on leaving a `with Client(...)` block)."""
        self.rpc.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def submit(self, items: list[dict] | None = None, program: str = "generate", params: dict | None = None,
               job_key: str | None = None, input_path: str | None = None) -> Job:
        """Submits a job; the same job_key submitted again returns the same job.

        Give the items, or `input_path`: a JSONL or Parquet file the storage node reads
        itself (on its own disk or a shared one). Items are checked on storage before
        the job is accepted; a bad one fails the submit with its place named. A
        generation job's `params` are its settings (docs/requests.md): a bad one raises
        `SettingsError` naming its field, before anything is sent."""
        if (items is None) == (input_path is None):
            raise ValueError("give items or input_path")
        from shoal.protocol.generation_settings import GENERATION_PROGRAMS

        if program in GENERATION_PROGRAMS:  # refused here, before anything is sent (and on the scheduler)
            from shoal.request_settings import GenerationSettings

            GenerationSettings.from_wire(params)
        key = job_key or uuid.uuid4().hex
        fields = {"job_key": key, "program": program, "params": params or {}}
        if input_path is not None:
            fields["input_path"] = str(Path(input_path).resolve())
        else:
            # One upload per call: a call that failed part-way (an item that cannot be
            # encoded, the client killed) must leave no chunk that a later call with the
            # same key, and a shorter input, would read as its own.
            upload_id = "u-" + hashlib.blake2b(f"{key}:{uuid.uuid4().hex}".encode(), digest_size=8).hexdigest()
            if self._upload(upload_id, items):
                fields["upload_id"] = upload_id
            else:
                fields["items"] = items
        # Storage checks a large input before the reply: give it time (a re-send is harmless).
        large = "input_path" in fields or "upload_id" in fields
        reply = self._request("SubmitJob", fields, reply_timeout=600.0 if large else None)
        return Job(self, reply["job_id"], reply["total"])

    def _upload(self, upload_id: str, items: list[dict]) -> bool:
        """Sends the items as JSON lines in chunks of about CHUNK_BYTES, encoding as it
        goes (never the whole input at once); False, sending nothing, where they come
        to INLINE_BYTES or less (they then travel in the submit itself)."""
        buf, index, uploading = bytearray(), 0, False
        for it in items:
            buf += orjson.dumps(it)
            buf += b"\n"
            uploading = uploading or len(buf) > INLINE_BYTES
            if uploading and len(buf) >= CHUNK_BYTES:
                self._request("UploadChunk", {"upload_id": upload_id, "index": index}, blobs={"data": bytes(buf)})
                buf.clear()
                index += 1
        if not uploading:
            return False
        if buf:
            self._request("UploadChunk", {"upload_id": upload_id, "index": index}, blobs={"data": bytes(buf)})
        return True

    def _request(self, msg_type: str, fields: dict, blobs: dict | None = None, reply_timeout: float | None = None):
        """One call: re-sent while no reply comes, retried while the cluster answers
        'unavailable', until `timeout` (or a long operation's own `reply_timeout`)."""
        wait = reply_timeout or min(self.reply_timeout, self.timeout)
        t0 = time.monotonic()
        deadline = t0 + max(self.timeout, wait)
        said, pause = None, 0.2
        while True:
            try:
                # Each try may run a moment past the deadline: the last one is a real try.
                return self.rpc.request(msg_type, fields, blobs, timeout=wait, retries=1 << 30,
                                        deadline=max(deadline, time.monotonic() + min(wait, 1.0)))
            except RemoteError as e:
                if e.code != ProtocolError.UNAVAILABLE:
                    raise
                why = e.message
            except TimeoutError as e:
                why = f"the router {self.router} does not answer ({e})"
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"gave up on {msg_type} after {time.monotonic() - t0:.0f} s: {why}")
            if why != said:  # say what we wait for, once per reason
                log.warning("waiting for the cluster (%s): %s", msg_type, why)
                said = why
            time.sleep(min(pause, left))
            pause = min(pause * 2, 2.0)

    def embed(self, inputs: list[str], output: str, encoder: str | dict, partition_by: str = "", b_min: int = 1024,
              n_max: int = 1024, vector_dtype: str = "float32", on_error: str = "fail", text_field: str = "text",
              id_field: str = "id", job_key: str | None = None) -> Job:
        """Embeds a corpus: JSONL or Parquet files the storage node can read, one
        partition per file or per value of `partition_by`, into Parquet files under
        `output` (one per SuperBatch, with a manifest; read them with
        `shoal.sdk.embeddings.EmbeddingSet`). `encoder` is the encoder's folder (or
        `describe_encoder` of it): the workers must host the same one.

        The job key defaults to one derived from the inputs, output, encoder and
        settings, so the same call again continues the same job, and a new job over the
        same output skips every SuperBatch it already holds."""
        from shoal.corpus_reader import CorpusSpec
        from shoal.encoder_config import describe_encoder

        info = encoder if isinstance(encoder, dict) else describe_encoder(encoder)
        corpus = CorpusSpec(tuple(str(Path(p).resolve()) for p in inputs), partition_by, text_field, id_field,
                            on_error).to_dict()
        params = {"corpus": corpus, "output": str(Path(output).resolve()), "b_min": b_min, "n_max": n_max,
                  "vector_dtype": vector_dtype,
                  "encoder": {k: info[k] for k in ("name", "dim", "fingerprint")}}
        key = job_key or "embed-" + hashlib.blake2b(orjson.dumps(params, option=orjson.OPT_SORT_KEYS),
                                                    digest_size=10).hexdigest()
        reply = self._request("SubmitJob", {"job_key": key, "program": "embed", "params": params},
                              reply_timeout=600.0)
        job = Job(self, reply["job_id"], reply["total"])
        job.detail = reply["detail"]
        return job

    def load_index(self, path: str, name: str = "default", replicas: int = 1) -> dict:
        """Loads an index (`shoal index build` output; the storage nodes read it at
        `path`) under `name`, each shard on `replicas` storage nodes; returns
        {name, index_id, placement, rows, dim, encoder} once every shard is loaded.
        Loading the same index again is a no-op; another one under the name replaces it."""
        return self._request("LoadIndex", {"name": name, "path": str(Path(path).resolve()), "replicas": replicas},
                             reply_timeout=600.0).fields

    def cluster_info(self) -> list[dict]:
        """Every member of the cluster: {node_id, role, info} as it published them."""
        return self._request("ClusterInfoQuery", {})["members"]

    def drain(self, node_id: str) -> dict:
        """Empties a worker: it takes no new work, its sequences move to the others,
        then it leaves the cluster and exits. Returns what the scheduler set in motion."""
        return self._request("DrainNode", {"node_id": node_id})["detail"]

    def migrate(self, job_id: str, to_node: str, seq_ids: list | None = None) -> dict:
        """Moves a job's sequences (all, or `seq_ids`) to worker `to_node`, mid-generation."""
        return self._request("MigrateRequest", {"job_id": job_id, "to_node": to_node,
                                                "seq_ids": list(seq_ids or [])})["detail"]

    def job(self, job_id: str) -> Job:
        """Reattach to a job by id."""
        return Job(self, job_id)
