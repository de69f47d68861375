"""The Python SDK: submit jobs to a Shoal cluster's router and stream their results.

    client = shoal.Client("tcp://127.0.0.1:5555")
    job = client.submit([{"id": 1, "prompt": "Hello"}], params={"max_tokens": 32})
    for record in job.results():
        print(record["id"], record["text"])

No torch here: the SDK installs with `pip install shoal`.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

from shoal.rpc import RemoteError, RpcClient


class Job:
    def __init__(self, client: "Client", job_id: str, total: int | None = None):
        self.client = client
        self.id = job_id
        self.total = total

    def status(self) -> dict:
        return self.client.rpc.request("JobStatusQuery", {"job_id": self.id}).fields

    def results(self, offset: int = 0, poll: float = 0.2, timeout: float | None = None) -> Iterator[dict]:
        """Result records as they are stored, from `offset` (resumable), until the job
        is done and every result has been read."""
        end = None if timeout is None else time.monotonic() + timeout
        while True:
            batch = self.client.rpc.request("Subscribe", {"job_id": self.id, "offset": offset})
            yield from batch["records"]
            offset += len(batch["records"])
            if batch["final"]:
                return
            if not batch["records"]:
                if end is not None and time.monotonic() > end:
                    raise TimeoutError(f"job {self.id}: {offset} results after {timeout}s")
                time.sleep(poll)

    def wait(self, timeout: float | None = None) -> list[dict]:
        return list(self.results(timeout=timeout))

    def cancel(self) -> dict:
        return self.client.rpc.request("CancelJob", {"job_id": self.id}).fields


class Client:
    def __init__(self, router: str):
        self.router = router
        self.rpc = RpcClient(router)

    def submit(self, items: list[dict], program: str = "generate", params: dict | None = None,
               job_key: str | None = None, retries: int = 50) -> Job:
        """Submits a job; the same job_key submitted again returns the same job."""
        key = job_key or uuid.uuid4().hex
        for attempt in range(retries):
            try:
                reply = self.rpc.request("SubmitJob", {"job_key": key, "program": program, "params": params or {},
                                                       "items": items})
                return Job(self, reply["job_id"], reply["total"])
            except RemoteError as e:
                if e.code != "unavailable" or attempt == retries - 1:
                    raise
                time.sleep(0.2)  # e.g. no leader yet while the cluster starts
        raise AssertionError("unreachable")

    def job(self, job_id: str) -> Job:
        """Reattach to a job by id."""
        return Job(self, job_id)
