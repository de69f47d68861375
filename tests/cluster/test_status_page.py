"""The router's status page, loaded in a real headless browser (Debian's `chromium`)
during a running job and after it is cancelled: the job's progress, failed items and
ETA, the throughput chart, and every node with its role, state and each worker's
batching mode."""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request

import pytest

import shoal


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def api(port: int) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/status", timeout=5) as r:
        return json.loads(r.read())


def browse(port: int) -> str:
    """The page's DOM after its script ran (virtual time lets its fetch and timer fire)."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    assert chromium, "the status page test needs Debian's chromium package (make install puts it there)"
    out = subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--virtual-time-budget=3000",
                          "--dump-dom", f"http://127.0.0.1:{port}/"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout


def row(dom: str, attr: str, value: str) -> dict[str, str]:
    """Cell texts of the table row whose `data-<attr>` is `value`, by cell class."""
    m = re.search(rf'<tr data-{attr}="{re.escape(value)}"[^>]*>(.*?)</tr>', dom, re.S)
    assert m, f"no row data-{attr}={value} on the page"
    cells = {}
    for cls, inner in re.findall(r'<td class="([^"]*)"[^>]*>(.*?)</td>', m.group(1), re.S):
        cells[cls.split()[0]] = inner if "<svg" in inner else re.sub(r"<[^>]+>|\s+", " ", inner).strip()
    return cells


@pytest.mark.timeout(300)
def test_status_page_in_headless_chromium(tiny_model, tmp_path):
    port = free_port()
    with shoal.LocalCluster(tiny_model, workers=1, state_dir=tmp_path / "c", http_port=port) as c:
        client = shoal.Client(c.router)
        # Long enough on any machine to be watched running (it is cancelled afterwards).
        items = [{"id": f"bad{i}", "prompt_token_ids": [10 ** 6]} for i in range(3)]  # beyond the vocabulary
        items += [{"id": i, "prompt_token_ids": [5 + i % 50] * 8} for i in range(1000)]
        job = client.submit(items, params={"max_tokens": 1000, "ignore_eos": True})
        deadline = time.monotonic() + 120
        while True:  # until the page has seen the job move (a rate, so an ETA)
            jobs = {j["job_id"]: j for j in api(port)["jobs"]}
            if jobs.get(job.id, {}).get("rate", 0) > 0:
                break
            assert time.monotonic() < deadline, f"the page never saw {job.id} move: {jobs}"
            time.sleep(0.5)
        dom = browse(port)
        running = row(dom, "job", job.id)
        done, total = (int(x) for x in running["progress"].split(" / "))
        assert running["state"] == "running" and total == 1003 and 0 < done < total
        assert re.fullmatch(r"\d+(\.\d)? (s|min|h)", running["eta"]), running["eta"]
        assert float(running["rate"]) > 0
        nodes = {n: row(dom, "node", n) for n in ("router-0", "scheduler-0", "storage-0", "worker-0")}
        assert nodes["scheduler-0"]["state"] == "leader" and nodes["scheduler-0"]["role"] == "scheduler"
        assert nodes["storage-0"]["state"] == "up" and int(nodes["router-0"]["messages"]) > 0
        assert nodes["worker-0"]["mode"].split()[0] in ("mb", "eb") and nodes["worker-0"]["switched"]
        assert int(nodes["worker-0"]["kv"].split(" / ")[1]) > 0

        job.cancel()
        time.sleep(2.5)  # one more sample
        finished = row(browse(port), "job", job.id)
        assert finished["state"] == "cancelled" and finished["progress"].endswith(" / 1003")
        assert finished["failed-count"] == "3" and finished["eta"] == "–"
        assert "<polyline" in finished["throughput"]  # throughput over time, from the samples
        assert http_status(port, "/nope") == 404 and http_status(port, "/") == 200


def http_status(port: int, path: str) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5):
            return 200
    except urllib.error.HTTPError as e:
        return e.code
