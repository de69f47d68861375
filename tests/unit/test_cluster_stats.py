"""How the benchmarks' cluster_stats (scripts/) tell the engine's compute threads from a
process's other threads, and sum what the kernel counted for each over a job."""

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

from cluster_stats import compute_threads, thread_clocks  # noqa: E402


def test_the_busiest_threads_are_the_compute_threads_and_the_rest_are_summed_apart():
    before = {1: (10.0, 0.5, 100), 2: (9.0, 0.4, 90), 3: (0.1, 0.0, 5)}
    # Thread 4 started during the job; thread 3 moved bytes; 1 and 2 computed.
    after = {1: (20.0, 1.0, 300), 2: (19.5, 0.9, 250), 3: (0.4, 0.1, 50), 4: (0.2, 0.0, 10)}
    got = compute_threads(before, after, threads=2)
    assert got["compute_cpu"] == 10.0 + 10.5
    assert abs(got["compute_wait"] - (0.5 + 0.5)) < 1e-9
    assert got["compute_runs"] == 200 + 160
    assert abs(got["other_threads_cpu"] - (0.3 + 0.2)) < 1e-9


def test_a_thread_that_ran_most_before_the_job_is_not_taken_for_a_compute_thread():
    before = {1: (100.0, 0.0, 10), 2: (0.0, 0.0, 0)}  # 1 loaded the model, then idled
    after = {1: (100.1, 0.0, 12), 2: (5.0, 0.2, 40)}
    got = compute_threads(before, after, threads=1)
    assert got["compute_cpu"] == 5.0 and abs(got["other_threads_cpu"] - 0.1) < 1e-6


def test_this_process_clocks_are_read_for_every_thread():
    clocks = thread_clocks(os.getpid())
    assert os.getpid() in clocks  # the main thread's id is the process's
    cpu, wait, runs = clocks[os.getpid()]
    assert cpu > 0 and wait >= 0 and runs > 0
