"""A node that comes back at a new address is found by id: kill -9 of storage mid-job,
then the same node (same id, same directory) on a new port. The job, run by
`shoal generate --router`, completes exactly once with the undisturbed output."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import orjson
from job_check import WORKER_ARGS, wait_for_progress, workload

import shoal
from shoal.output_compare import compare_outputs
from shoal.sampling import SamplingParams


def test_storage_restarted_on_a_new_port_gets_the_jobs_results(tiny_model, tmp_path):
    items = workload()
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    inp.write_bytes(b"".join(orjson.dumps(it) + b"\n" for it in items))
    with shoal.LocalCluster(tiny_model, state_dir=tmp_path / "c", policy="mb", worker_args=WORKER_ARGS,
                            env={"SHOAL_RPC_TIMEOUT_S": "2"}) as c:
        cli = subprocess.Popen([sys.executable, "-m", "shoal.cli", "generate", "--model", str(tiny_model),
                                "--input", str(inp), "--output", str(out), "--router", c.router, "--timeout", "120",
                                "--job-key", "moved"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            end = time.monotonic() + 120
            while not out.exists():  # the CLI has submitted: the same key finds its job
                assert cli.poll() is None and time.monotonic() < end, "the CLI did not submit"
                time.sleep(0.05)
            job = shoal.Client(c.router).submit(items, job_key="moved")
            assert wait_for_progress(job, 3) < len(items), "the job finished before the kill"
            old = c.nodes["storage-0"][2]
            c.process("storage-0").send_signal(signal.SIGKILL)
            time.sleep(4)  # past its lease: it is gone from membership, as after a host move
            new = c.restart("storage-0", new_address=True)
            assert new != old
            _, err = cli.communicate(timeout=150)
        finally:
            cli.kill()
        assert cli.returncode == 0, err[-3000:]
        assert c.nodes["worker-0"][0].poll() is None
    got = [orjson.loads(line) for line in out.read_bytes().splitlines()]
    ids = [r["id"] for r in got]
    assert sorted(ids) == sorted(it["id"] for it in items) and len(set(ids)) == len(ids)
    from shoal.nodes.worker.engine import EngineConfig, LLMEngine

    eng = LLMEngine(tiny_model, EngineConfig(policy="mb"))
    refs = eng.generate([it["prompt_token_ids"] for it in items],
                        [SamplingParams(max_tokens=it["max_tokens"], return_margins=True) for it in items])
    by_id = {r["id"]: r for r in got}
    for it, ref in zip(items, refs):
        cmp = compare_outputs(by_id[it["id"]]["token_ids"], ref.token_ids, [ref.margins])
        assert cmp, f"{it['id']}: {cmp.detail}"
