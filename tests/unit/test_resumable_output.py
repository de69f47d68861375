"""A results file that a rerun of the same job continues: what it keeps, what it cuts,
and what it refuses."""

from __future__ import annotations

import orjson
import pytest

from shoal.cli.resumable_output import ResumableOutput, job_fingerprint

JOB = job_fingerprint({"model": "m", "max_tokens": 8}, [{"id": i} for i in range(5)])


def interrupted_run(path, records, fingerprint=JOB):
    """A run that wrote `records` and died."""
    with pytest.raises(KeyboardInterrupt):
        with ResumableOutput(path, fingerprint) as out:
            for rec in records:
                out.write(rec)
            raise KeyboardInterrupt


def test_a_finished_run_leaves_its_results_and_no_marker(tmp_path):
    path = tmp_path / "out.jsonl"
    with ResumableOutput(path, JOB) as out:
        assert out.marker.exists()  # from before the first result
        out.write({"id": 0})
        out.write({"id": 1})
    assert [orjson.loads(x) for x in path.read_bytes().splitlines()] == [{"id": 0}, {"id": 1}]
    assert not out.marker.exists()
    again = ResumableOutput(path, JOB)  # a finished output is written over by a new run
    assert not again.resuming and list(again.earlier_results()) == []


def test_an_interrupted_run_is_continued_and_a_torn_line_cut(tmp_path, capsys):
    path = tmp_path / "out.jsonl"
    interrupted_run(path, [{"id": 0}, {"id": 1}])
    assert "2 results are kept" in capsys.readouterr().err
    with open(path, "ab") as fh:
        fh.write(b'{"id": 2, "te')  # the crash tore the last line
    out = ResumableOutput(path, JOB)
    assert out.resuming
    assert [r["id"] for r in out.earlier_results()] == [0, 1] and out.kept == 2
    with out:
        out.write({"id": 2})
    assert [orjson.loads(x)["id"] for x in path.read_bytes().splitlines()] == [0, 1, 2]
    assert not out.marker.exists()


def test_zeros_a_power_loss_leaves_are_cut(tmp_path):
    path = tmp_path / "out.jsonl"
    interrupted_run(path, [{"id": 0}])
    with open(path, "ab") as fh:
        fh.write(b"\0" * 100 + b"\n")
    out = ResumableOutput(path, JOB)
    assert [r["id"] for r in out.earlier_results()] == [0]
    with out:
        pass
    assert path.read_bytes() == b'{"id":0}\n'


def test_an_unfinished_run_of_another_job_is_refused_unless_overwritten(tmp_path):
    path = tmp_path / "out.jsonl"
    interrupted_run(path, [{"id": 0}])
    other = job_fingerprint({"model": "m", "max_tokens": 9}, [{"id": i} for i in range(5)])
    with pytest.raises(FileExistsError, match="unfinished run of another job.*--overwrite"):
        ResumableOutput(path, other)
    out = ResumableOutput(path, other, overwrite=True)
    assert not out.resuming
    with out:
        out.write({"id": 7})
    assert path.read_bytes() == b'{"id":7}\n'


def test_the_fingerprint_covers_settings_and_every_item():
    items = [{"id": i, "prompt": "p"} for i in range(3)]
    base = job_fingerprint({"a": 1, "b": 2}, items)
    assert job_fingerprint({"b": 2, "a": 1}, items) == base  # key order is not a difference
    assert job_fingerprint({"a": 1, "b": 3}, items) != base
    assert job_fingerprint({"a": 1, "b": 2}, items[:2]) != base
    assert job_fingerprint({"a": 1, "b": 2}, [*items[:2], {"id": 2, "prompt": "q"}]) != base


def test_another_job_s_marker_over_no_result_is_a_fresh_start(tmp_path):
    """A run that failed before its first result (a cluster that did not start) leaves
    nothing to protect: a corrected command starts over without --overwrite."""
    path = tmp_path / "out.jsonl"
    interrupted_run(path, [])
    other = job_fingerprint({"model": "m2"}, [])
    out = ResumableOutput(path, other)
    assert not out.resuming
    with out:
        out.write({"id": 1})
    assert path.read_bytes() == b'{"id":1}\n' and not out.marker.exists()


def test_results_left_unread_are_kept_all_the_same(tmp_path):
    path = tmp_path / "out.jsonl"
    interrupted_run(path, [{"id": i} for i in range(4)])
    out = ResumableOutput(path, JOB)
    first = next(out.earlier_results())  # a caller that stops reading early
    assert first == {"id": 0}
    with out:
        out.write({"id": 4})
    assert [orjson.loads(x)["id"] for x in path.read_bytes().splitlines()] == [0, 1, 2, 3, 4]
    assert out.kept == 4


def test_each_result_reaches_the_file_as_it_is_written(tmp_path):
    path = tmp_path / "out.jsonl"
    with ResumableOutput(path, JOB) as out:
        out.write({"id": 0})
        assert path.read_bytes() == b'{"id":0}\n'  # not held in a buffer until the next one
