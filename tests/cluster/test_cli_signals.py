"""`shoal generate` with its own local cluster leaves nothing running when it is
stopped: SIGTERM and SIGHUP stop the cluster on the way out, and even SIGKILL (no way
out) takes etcd and every node with it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest


def children(pid: int) -> set[int]:
    out = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.add(int(stat.parent.name))
    return out


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGKILL], ids=["TERM", "HUP", "KILL"])
def test_a_stopped_generate_leaves_no_process_behind(tiny_model, tmp_path, sig):
    inp = tmp_path / "in.jsonl"
    inp.write_bytes(b"".join(orjson.dumps({"id": i, "prompt_token_ids": [1 + i % 400, 2], "max_tokens": 1500}) + b"\n"
                             for i in range(64)))
    cli = subprocess.Popen([sys.executable, "-m", "shoal.cli", "generate", "--model", str(tiny_model), "--input",
                            str(inp), "--output", str(tmp_path / "out.jsonl")],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        end = time.monotonic() + 120
        while len(kids := children(cli.pid)) < 5:  # etcd, storage, scheduler, router, worker
            assert cli.poll() is None and time.monotonic() < end, cli.stderr.read()[-2000:] if cli.poll() else kids
            time.sleep(0.2)
        time.sleep(1.0)  # the job is under way
        cli.send_signal(sig)
        cli.wait(timeout=60)
        end = time.monotonic() + 20
        while any(alive(p) for p in kids) and time.monotonic() < end:
            time.sleep(0.2)
        left = {p: Path(f"/proc/{p}/cmdline").read_text().replace("\0", " ")[:120] for p in kids if alive(p)}
        assert not left, f"left running after {sig.name}: {left}"
        if sig != signal.SIGKILL:
            assert cli.returncode == 130 and "interrupted" in cli.stderr.read()
    finally:
        for p in children(cli.pid) | {cli.pid}:
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass
