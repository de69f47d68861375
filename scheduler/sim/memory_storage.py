"""Storage as the scheduler core needs it, in memory: a job's input, its results, the
SuperBatch manifest. It answers the core's storage commands the way the storage node
does (a page read with pending_only skips items that have results; the first result of
an item is the one kept), so the cluster simulator and the core's tests run the same
core the node runs, with no processes."""

from __future__ import annotations

from shoal.scheduler import commands as cmd


class MemoryStorage:
    def __init__(self):
        self.inputs: dict[str, list[dict]] = {}  # job_id -> items, each with its "id"
        self.results: dict[str, dict] = {}  # job_id -> {seq_id: result}
        self.partitions: dict[str, list] = {}  # embedding job_id -> [(name, size)]
        self.manifest: dict[str, set] = {}  # embedding job_id -> SuperBatch ids written

    def add_input(self, job_id: str, items: list[dict]) -> int:
        self.inputs[job_id] = list(items)
        self.results.setdefault(job_id, {})
        return len(items)

    def add_corpus(self, job_id: str, partitions: list) -> int:
        self.partitions[job_id] = list(partitions)
        self.manifest.setdefault(job_id, set())
        return sum(size for _, size in partitions)

    def store(self, job_id: str, seq_id, result=True) -> bool:
        """Keeps the first result of an item; False for a duplicate."""
        results = self.results.setdefault(job_id, {})
        if seq_id in results:
            return False
        results[seq_id] = result
        return True

    def answer(self, core, c) -> list:
        """Carries out a storage command against `core`; returns the core's next commands."""
        if isinstance(c, cmd.ReadInput):
            items = self.inputs.get(c.job_id, [])
            done = self.results.get(c.job_id, {})
            end = min(len(items), c.offset + c.limit)
            page = [it for it in items[c.offset:end] if it["id"] not in done]
            return core.input_read(c.job_id, page, None, end, c.offset)
        if isinstance(c, cmd.ReadSuperBatchPlan):
            parts = self.partitions.get(c.job_id, []) if c.partitions else None
            return core.superbatch_state(c.job_id, parts, sorted(self.manifest.get(c.job_id, ())))
        if isinstance(c, cmd.CountResults):
            job = core.jobs.get(c.job_id)
            if job is not None and job.embedding:  # texts written: the SuperBatches in the manifest
                records = sum(job.superbatches[s]["size"] for s in self.manifest.get(c.job_id, ()))
            else:
                records = len(self.results.get(c.job_id, {}))
            return core.results_counted(c.job_id, records, core.now)
        if isinstance(c, cmd.LogJob):
            return []
        raise TypeError(f"not a storage command: {c!r}")
