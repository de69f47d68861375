"""The scheduler core driven directly: events in, commands out, storage in memory."""

from shoal.scheduler import commands as cmd
from shoal.scheduler.core import SchedulerCore
from shoal.scheduler.job import Job
from shoal.scheduler.sim.memory_storage import MemoryStorage
from shoal.scheduler.worker_info import WorkerInfo


def worker(wid, max_seqs=4, incarnation=1, **kw):
    return WorkerInfo(wid, incarnation, max_seqs=max_seqs, **kw)


class Harness:
    """The core with in-memory storage; worker commands are collected, not carried out."""

    def __init__(self, n_items=10, workers=("w0", "w1"), max_seqs=4, **core_kw):
        self.core = SchedulerCore(**core_kw)
        self.storage = MemoryStorage()
        items = [{"id": i, "prompt_token_ids": [1, 2, 3], "max_tokens": 8} for i in range(n_items)]
        self.storage.add_input("j", items)
        self.core.add_job(Job("j", "key", "generate", {}, n_items, "mem"))
        self.core.update_workers({w: worker(w, max_seqs) for w in workers})
        self.now = 0.0
        self.sent = []  # worker commands, in order

    @property
    def job(self):
        return self.core.jobs["j"]

    def tick(self, dt=1.0) -> list:
        self.now += dt
        return self.run(self.core.tick(self.now))

    def run(self, todo) -> list:
        out, todo = [], list(todo)
        while todo:
            c = todo.pop(0)
            if isinstance(c, (cmd.ReadInput, cmd.ReadSuperBatchPlan, cmd.CountResults, cmd.LogJob)):
                out.append(c)
                todo += self.storage.answer(self.core, c)
            else:
                out.append(c)
                self.sent.append(c)
        return out

    def placed_on(self, wid) -> list:
        return sorted(s for s, w in self.job.placed.items() if w == wid)

    def finish(self, wid, sids, held=0):
        for s in sids:
            self.storage.store("j", s)
        self.core.progress(wid, "j", list(sids), [], held, tokens=8 * len(sids))


def of(kind, commands):
    return [c for c in commands if isinstance(c, kind)]


def test_a_job_is_read_placed_and_finished():
    h = Harness(n_items=20)
    out = h.tick()
    assert of(cmd.ReadInput, out) == [cmd.ReadInput("j", 0, 512)]
    assigns = of(cmd.AssignSequences, out)
    assert {a.worker for a in assigns} == {"w0", "w1"}
    assert sum(len(a.assignments) for a in assigns) == 16  # each holds twice its batch of 4
    assert len(h.job.pending) == 4 and h.job.fully_read
    h.finish("w0", h.placed_on("w0"), held=0)
    out = h.tick()  # room again: the four pending go out, to the worker with room
    assert [(a.worker, len(a.assignments)) for a in of(cmd.AssignSequences, out)] == [("w0", 4)]
    h.finish("w0", h.placed_on("w0"))
    h.finish("w1", h.placed_on("w1"))
    out = h.tick()
    assert of(cmd.CountResults, out) and of(cmd.LogJob, out)
    assert h.job.state == "done" and h.job.done == 20
    assert h.core.cancel("j") == [] and h.job.state == "done"  # a finished job stays finished


def test_a_re_sent_report_counts_once():
    h = Harness(n_items=4)
    h.tick()
    sids = h.placed_on("w0")
    h.finish("w0", sids)
    h.core.progress("w0", "j", sids, [], 0, tokens=99)
    assert h.job.done == len(sids)
    assert h.job.tokens == 8 * len(sids)


def test_a_failed_assignment_is_placed_again():
    h = Harness(n_items=4)
    out = h.tick()
    failed = of(cmd.AssignSequences, out)[0]
    h.core.assign_failed(failed)
    assert {a["seq_id"] for a in failed.assignments} <= h.job.pending_ids
    assert h.core.held[failed.worker] == 0
    again = of(cmd.AssignSequences, h.tick())
    assert sorted(s["seq_id"] for a in again for s in a.assignments) == sorted(a["seq_id"] for a in failed.assignments)


def test_a_departed_worker_s_sequences_are_found_again_by_a_rescan():
    h = Harness(n_items=6)
    h.tick()
    lost = h.placed_on("w1")
    assert lost
    h.core.update_workers({"w0": worker("w0")})
    assert not h.placed_on("w1") and h.job.cursor == 0
    out = h.tick()
    assert of(cmd.ReadInput, out)[0].offset == 0
    # Only w0 is left: what it already holds is not placed twice.
    assert all(c.worker == "w0" for c in of(cmd.AssignSequences, out))
    assert sorted(h.placed_on("w0")) == list(range(6))


def test_a_worker_back_under_a_new_lease_holds_nothing():
    h = Harness(n_items=4)
    h.tick()
    assert h.placed_on("w1")
    h.core.update_workers({"w0": worker("w0"), "w1": worker("w1", incarnation=2)})
    assert not h.placed_on("w1") and h.core.held["w1"] == 0
    h.tick()
    assert len(h.job.placed) == 4


def test_takeover_rebuilds_placement_from_what_workers_hold():
    h = Harness(n_items=10)
    h.tick()
    held = {w: h.placed_on(w) for w in ("w0", "w1")}
    h.finish("w0", held["w0"][:1])  # one result stored before the old leader died
    old = h.job
    h.core.reset()
    assert h.core.jobs == {}
    h.core.add_job(Job("j", "key", "generate", {}, 10, "mem", done=old.done))
    h.core.holding(worker("w0"), {"j": held["w0"][1:]})
    h.core.holding(worker("w1"), {"j": held["w1"]})
    out = h.tick()
    # The rescan reads from the start; items with results or held by a worker stay where they are.
    assert of(cmd.ReadInput, out)[0].offset == 0
    new = sorted(s["seq_id"] for a in of(cmd.AssignSequences, out) for s in a.assignments)
    assert set(new).isdisjoint(held["w0"] + held["w1"])
    assert len(h.job.placed) + len(h.job.pending) == 9


def test_a_takeover_drops_what_workers_still_hold_of_a_cancelled_job():
    h = Harness(n_items=10)
    h.tick()
    held = h.placed_on("w0")
    h.core.reset()
    h.core.add_job(Job("j", "key", "generate", {}, 10, "mem", "cancelled"))  # as the job log has it
    assert h.core.holding(worker("w0"), {"j": held}) == [cmd.DropJob("w0", "j")]
    assert not h.job.placed and h.core.held["w0"] == 0
    assert h.core.holding(worker("w1"), {}) == []


def test_stealing_moves_half_the_gap_once_nothing_is_pending():
    h = Harness(n_items=16, workers=("w0", "w1"), max_seqs=8)
    h.tick()
    h.finish("w1", h.placed_on("w1"))
    out = h.tick()
    moves = of(cmd.MigrateSequences, out)
    assert moves == [cmd.MigrateSequences("w0", "w1", "j", count=4)]
    assert not of(cmd.MigrateSequences, h.tick())  # both sides are busy until the move is reported


def test_a_worker_lost_mid_move_loses_nothing():
    h = Harness(n_items=16, workers=("w0", "w1"), max_seqs=8)
    h.tick()
    h.finish("w1", h.placed_on("w1"))
    h.tick()  # w0 -> w1, 4 sequences
    moving = h.placed_on("w0")[:4]
    h.core.progress("w0", "j", [], [[s, "w1"] for s in moving], 4, 0)
    h.core.update_workers({"w0": worker("w0")})  # the target died with them
    out = h.tick()
    # w0 had the even items; the four it moved are read again and placed back on it.
    assert of(cmd.ReadInput, out) and sorted(h.placed_on("w0")) == list(range(0, 16, 2))
    assert set(moving) <= set(h.placed_on("w0"))


def test_drain_comes_before_stealing_and_the_drained_worker_gets_nothing_new():
    h = Harness(n_items=12, workers=("w0", "w1", "w2"), max_seqs=2)
    h.tick()  # 4 each
    assert h.core.drain("w0") == 4
    h.finish("w2", h.placed_on("w2"))
    out = h.tick()
    moves = of(cmd.MigrateSequences, out)
    assert moves and all(m.source == "w0" for m in moves)
    assert all(a.worker != "w0" for a in of(cmd.AssignSequences, out))
    assert sum(m.count for m in moves) <= 4


def test_a_job_cancelled_mid_move_gets_no_more_commands():
    h = Harness(n_items=20, workers=("w0", "w1"), max_seqs=4)
    h.tick()
    h.finish("w1", h.placed_on("w1"))
    h.tick()
    moving = h.placed_on("w0")[:2]
    held, placed = dict(h.core.held), dict(h.job.placed.per_worker)
    drops = h.core.cancel("j")
    assert h.job.state == "cancelled" and not h.job.pending
    # Every worker is told to drop the job's sequences (one may be on its way to a worker
    # that held none), the table lets go of them, and the workers' counts lose them at once.
    assert [(d.worker, d.job_id) for d in drops] == [("w0", "j"), ("w1", "j")]
    assert placed["w0"] and all(h.core.held[w] == held[w] - placed[w] for w in placed)
    assert not h.job.placed and h.core.cancel("nope") == []
    h.core.progress("w0", "j", [], [[s, "w1"] for s in moving], 6, 0)  # the move completes after all
    out = h.tick()
    assert not of(cmd.AssignSequences, out) and not of(cmd.ReadInput, out) and not of(cmd.CountResults, out)
    assert h.job.state == "cancelled"


def test_a_result_count_short_of_the_total_rescans():
    h = Harness(n_items=3, workers=("w0",))
    h.tick()
    sids = h.placed_on("w0")
    h.core.progress("w0", "j", sids, [], 0, 0)  # reported finished, but one result never reached storage
    for s in sids[1:]:
        h.storage.store("j", s)
    h.tick()  # counted short: a rescan
    assert h.job.state == "running" and h.job.cursor == 0
    out = h.tick()
    assert sorted(h.placed_on("w0")) == [sids[0]]
    assert of(cmd.AssignSequences, out)


def test_superbatches_are_packed_once_and_bounded_per_worker():
    core, storage = SchedulerCore(superbatches_in_flight=2), MemoryStorage()
    total = storage.add_corpus("e", [("p0", 5), ("p1", 5), ("p2", 5), ("p3", 5)])
    core.add_job(Job("e", "key", "embed", {"b_min": 5, "n_max": 5, "encoder": {"fingerprint": "f"}}, total, "mem"))
    core.update_workers({"w0": worker("w0", encoder="f"), "w1": worker("w1", encoder="other")})
    todo, sent = core.tick(1.0), []
    while todo:
        c = todo.pop(0)
        if isinstance(c, cmd.AssignSuperBatches):
            sent.append(c)
        else:
            todo += storage.answer(core, c)
    assert [(c.worker, len(c.superbatches)) for c in sent] == [("w0", 2)]  # only the encoder's host; 2 in flight
    assert len(core.jobs["e"].superbatches) == 4 and len(core.jobs["e"].pending) == 2


def test_a_slower_worker_queues_fewer_sequences():
    """The queue behind a worker's batch holds the same seconds of work everywhere: a card
    at half the speed queues half as many, so it is not left with a full queue at the end."""
    h = Harness(n_items=40, workers=())
    h.core.update_workers({"fast": worker("fast", max_seqs=8, speed=2.0), "slow": worker("slow", max_seqs=8, speed=1.0)})
    h.tick()
    assert len(h.placed_on("fast")) == 16  # batch 8 + queue 8
    assert len(h.placed_on("slow")) == 12  # batch 8 + queue 4
    h.core.update_workers({"a": worker("a", max_seqs=8), "b": worker("b", max_seqs=8)})  # uncalibrated: full queues
    assert h.core._capacity(h.core.workers["a"]) == 16


def test_a_move_reported_after_its_target_left_is_placed_again():
    h = Harness(n_items=16, workers=("w0", "w1"), max_seqs=8)
    h.tick()
    h.finish("w1", h.placed_on("w1"))
    h.tick()  # w0 -> w1
    h.core.update_workers({"w0": worker("w0")})  # the target leaves first...
    moving = h.placed_on("w0")[:4]
    h.core.progress("w0", "j", [], [[s, "w1"] for s in moving], 4, 0)  # ...then the move is reported
    h.core.update_workers({"w0": worker("w0")})  # the same members: still the holders are checked
    assert not h.placed_on("w1") and h.job.cursor == 0
    h.tick()
    assert set(moving) <= set(h.placed_on("w0"))


def test_placed_table_counts_follow_every_change():
    from shoal.scheduler.placed_table import PlacedTable

    t = PlacedTable([("a", "w1"), ("b", "w1")])
    t["c"] = "w2"
    t["a"] = "w2"  # moved
    t.update({"d": "w3"})
    assert t.pop("b") == "w1" and t.pop("zz", None) is None
    del t["d"]
    assert dict(t.per_worker) == {"w2": 2}
    counted = {}
    for w in t.values():
        counted[w] = counted.get(w, 0) + 1
    assert counted == dict(t.per_worker)
    t.clear()
    assert not t.per_worker


def test_a_read_in_flight_is_not_asked_again_and_a_stale_page_is_ignored():
    """The node reads input without waiting: one ReadInput per job is out at a time, a
    failed one is asked again, and a page read from a cursor the job has left (a rescan
    meanwhile) changes nothing."""
    core = SchedulerCore(input_page=4)
    core.add_job(Job("j", "key", "generate", {}, 20, "mem"))
    core.update_workers({"w0": worker("w0", 4)})
    first = of(cmd.ReadInput, core.tick(1.0))
    assert [(c.offset, c.limit) for c in first] == [(0, 4)]
    assert of(cmd.ReadInput, core.tick(2.0)) == []  # still out
    core.read_failed("j", 0)
    assert [c.offset for c in of(cmd.ReadInput, core.tick(3.0))] == [0]  # asked again
    items = [{"id": i} for i in range(4)]
    placed = of(cmd.AssignSequences, core.input_read("j", items, None, 4, offset=0))
    assert sum(len(a.assignments) for a in placed) == 4 and core.jobs["j"].cursor == 4
    core.jobs["j"].rescan()  # e.g. a worker was lost: read again from the start
    assert core.input_read("j", [{"id": 9}], None, 8, offset=4) == []  # answers the old cursor
    assert core.jobs["j"].cursor == 0 and 9 not in core.jobs["j"].pending_ids
