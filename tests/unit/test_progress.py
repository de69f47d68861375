"""Progress in a log: tqdm's count, rate and ETA as plain lines, at most one per interval."""

from __future__ import annotations

import io
import time

from shoal.cli.progress import Progress


def test_progress_in_a_log_writes_lines_with_count_and_rate():
    buf = io.StringIO()
    p = Progress(100, "texts", stream=buf, log_every=0.05)
    for i in range(10):
        time.sleep(0.02)
        p.advance(10, f"{i} tok/s")
    p.close()
    lines = buf.getvalue().splitlines()
    assert "\r" not in buf.getvalue() and 2 <= len(lines) <= 8  # throttled: not one per advance
    assert lines[-1].startswith("100%") and "100/100" in lines[-1] and "texts/s" in lines[-1]
    assert "9 tok/s" in lines[-1] and p.done == 100
