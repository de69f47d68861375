"""The prediction runs the engine's own planner: on the same sequences it takes the same
steps as the engine, with each step's prefill tokens and decodes the engine's, so a
step's predicted time is the calibration's for the step the engine takes."""

from __future__ import annotations

import random

import pytest

from shoal.nodes.worker.engine import EngineConfig, LLMEngine
from shoal.sampling import SamplingParams
from shoal.scheduler.cost_model import CostModel
from shoal.scheduler.generation_prediction import WorkerShape, simulate_worker

pytestmark = pytest.mark.timeout(300)

COST = CostModel(alpha_p=0.01, beta_p=0.001, alpha_d=0.02, beta_d=0.0005, mb_a=0.001, mb_b=0.0, mb_c=0.0)


def test_the_simulated_job_steps_as_the_engine_steps(tiny_model):
    eng = LLMEngine(tiny_model, EngineConfig(policy="mb", max_num_batched_tokens=96, max_num_seqs=8))
    r = random.Random(5)
    items = [([r.randrange(511) for _ in range(r.randint(1, 70))], r.randint(1, 12)) for _ in range(20)]
    work = []  # (prefill tokens, decodes) of every step the engine took
    orig = eng.runner.run

    def run(chunks, sample_mask, carry=None):
        work.append((sum(n for s, n in chunks if s.num_computed < s.num_prompt_tokens),
                     sum(1 for s, n in chunks if s.num_computed >= s.num_prompt_tokens)))
        return orig(chunks, sample_mask, carry)

    eng.runner.run = run
    outs = eng.generate([p for p, _ in items], [SamplingParams(max_tokens=m, ignore_eos=True) for _, m in items])
    assert [len(o.token_ids) for o in outs] == [m for _, m in items]
    shape = WorkerShape(COST, "mb", 96, 8, eng.blocks.num_blocks * eng.config.block_size, eng.config.block_size)
    seconds, steps = simulate_worker(shape, [(len(p), m) for p, m in items])
    assert steps == len(work), f"the simulation took {steps} steps, the engine {len(work)}"
    assert seconds == pytest.approx(sum(COST.step_time(p, d) for p, d in work))
