"""Where a step's time goes on W1: torch.profiler over engine steps, ops by category.

    python scripts/profile_engine.py --dtype float32 --sequences 128 --warm 70 --steps 10
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from step_profile import format_breakdown, profile_steps  # noqa: E402
from workloads import w1  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=".bench/model-small")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--sequences", type=int, default=128)
    ap.add_argument("--warm", type=int, default=20, help="steps before profiling")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--budget", type=int, default=None, help="default: from the device calibration")
    ap.add_argument("--policy", default="mb")
    args = ap.parse_args()
    from shoal.nodes.worker.engine import EngineConfig, LLMEngine
    from shoal.sampling import SamplingParams

    work = w1(sequences=args.sequences)
    eng = LLMEngine(args.model, EngineConfig(dtype=args.dtype, max_num_batched_tokens=args.budget, policy=args.policy))
    for i, (p, n) in enumerate(zip(work.prompts, work.output_lens)):
        eng.add_request(i, prompt_token_ids=p, params=SamplingParams(max_tokens=n, ignore_eos=True))
    for _ in range(args.warm):
        eng.step()
    print(format_breakdown(profile_steps(eng, args.steps)))


if __name__ == "__main__":
    main()
