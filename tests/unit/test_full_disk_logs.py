"""Storage's logs on a disk that fills up: a commit the disk has no room for is undone
(file, ids, counts), the re-sent records are taken once space is back, and a refused
job record is not known. A real tmpfs is filled (root: marked `mounts`)."""

from __future__ import annotations

import errno

import orjson
import pytest
from small_disk import SmallDisk

from shoal.nodes.storage.disk_space import DiskSpace
from shoal.nodes.storage.job_log import JobLog
from shoal.nodes.storage.result_log import ResultLog
from shoal.protocol.errors import ProtocolError

pytestmark = [pytest.mark.mounts, pytest.mark.timeout(60)]


def test_a_refused_commit_is_rolled_back_and_the_resent_records_taken(tmp_path):
    with SmallDisk(tmp_path / "disk", 1 << 20) as disk:
        log = ResultLog(disk.path / "r.wal")
        log.append([{"id": i, "text": "x" * 50} for i in range(1000)])  # the refused ones cross a kept offset (1024)
        log.commit()
        committed = log.path.stat().st_size
        disk.fill(leave=0)
        late = [{"id": i, "text": "y" * 3000, **({"finish_reason": "error"} if i == 1012 else {})}
                for i in range(998, 1100)]
        assert log.append(late) == (100, 2)  # ids 998 and 999 are duplicates of committed ones
        with pytest.raises(OSError) as e:
            log.commit()
        assert e.value.errno == errno.ENOSPC
        assert len(log) == 1000 and log.failed == 0 and 1015 not in log and 999 in log
        assert log.path.stat().st_size == committed  # cut back: no torn tail holds the space
        assert [r["id"] for r in log.read(0, 2000)] == list(range(1000))

        disk.free_up()
        assert log.append(late) == (100, 2)  # the refused ids are free again: taken, not duplicates
        log.commit()
        assert len(log) == 1100 and log.failed == 1
        assert [r["id"] for r in log.read(1020, 10)] == list(range(1020, 1030))  # past the kept offset
        log.close()
        again = ResultLog(log.path)
        recs = again.read(0, 2000)
        assert [r["id"] for r in recs] == list(range(1100)) and recs[1015]["text"] == "y" * 3000
        again.close()


def test_a_job_record_the_disk_refuses_is_not_known(tmp_path):
    with SmallDisk(tmp_path / "disk", 1 << 20) as disk:
        jobs = JobLog(disk.path / "jobs.jsonl")
        rec = {"job_id": "j-1", "job_key": "k", "program": "generate", "params": {"pad": "p" * 4000}, "total": 3,
               "state": "running"}
        disk.fill(leave=0)
        with pytest.raises(OSError):
            jobs.record(rec, epoch=1)
        assert "j-1" not in jobs.jobs  # a new leader listing jobs will not find a job nobody was told of
        disk.free_up()
        jobs.record(rec, epoch=1)
        jobs.close()
        lines = [orjson.loads(x) for x in (disk.path / "jobs.jsonl").read_bytes().splitlines()]
        assert [x.get("job_id") for x in lines if "job_id" in x] == ["j-1"]


def test_disk_space_refuses_below_its_reserve_naming_the_folder(tmp_path):
    with SmallDisk(tmp_path / "disk", 4 << 20) as disk:
        space = DiskSpace("storage-0", disk.path, reserve_bytes=1 << 20)
        space.check()  # 4 MiB free: writes are taken
        assert not space.state()["full"]
        disk.fill(leave=512 << 10)
        with pytest.raises(ProtocolError) as e:
            space.check()
        assert e.value.code == ProtocolError.DISK_FULL
        assert str(disk.path) in e.value.message and "storage-0" in e.value.message and "bytes free" in e.value.message
        assert space.state()["full"] and space.state()["free_bytes"] < 1 << 20
        disk.free_up()
        space.check()

        # Without a reserve, a write the kernel refused makes the disk full until more
        # is free than there was then.
        bare = DiskSpace("storage-0", disk.path, reserve_bytes=0)
        disk.fill(leave=0)
        err = bare.refused(OSError(errno.ENOSPC, "No space left on device"))
        assert err.code == ProtocolError.DISK_FULL and str(disk.path) in err.message
        with pytest.raises(ProtocolError):
            bare.check()
        disk.free_up()
        bare.check()
