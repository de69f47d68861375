"""How large the engine's steps are: the token budget from the device calibration, and,
when weights are streamed, as many sequences and tokens per step as make a step's
compute cover the copy of its weights.

Run once at engine start, after the policy has its calibration; `size_steps` rebuilds
the planner when it changed anything.
"""

from __future__ import annotations

import logging
from dataclasses import replace

from shoal.nodes.worker.policy import rebuild_planner

log = logging.getLogger(__name__)

MAX_FETCH_STEP = 8192  # the most tokens (or sequences) per step weight streaming asks for


def size_steps(engine, cost_model, auto_budget: bool) -> None:
    cm = calibration_of(engine, cost_model)
    resized = auto_budget and budget_from_calibration(engine, cm)
    if engine.streamer is not None:
        resized = size_for_fetches(engine, cm, auto_budget) or resized
    if resized:
        rebuild_planner(engine)


def calibration_of(engine, cost_model):
    """The calibration the policy loaded, or under MB a cached one (MB never measures
    at start), or None."""
    cm = cost_model or engine.cost_model
    if cm is None:
        from shoal.nodes.worker import calibration
        from shoal.scheduler.cost_model import CalibrationError

        try:
            cm = calibration.load_cached(engine)
        except CalibrationError:
            cm = None
    return cm


def budget_from_calibration(engine, cm) -> bool:
    """Takes the step budget from the calibration; whether it changed anything."""
    budget = cm.step_budget() if cm is not None else None
    if not budget:
        return False
    engine.config = replace(engine.config, max_num_batched_tokens=budget)
    engine.budget_reason = "from the device calibration: 90% of the best prefill throughput probed"
    return True


def size_for_fetches(engine, cm, auto_budget: bool = True) -> bool:
    """With streamed weights every step pays their copy whatever it carries: steps grow
    until their compute (the calibration's cost per token and per decoding sequence)
    takes at least as long as the fetch (`FetchCost.rows_to_cover`), as far as the KV
    cache allows. Then the copies hide behind compute, or, where they share the
    compute's memory bandwidth (a CPU), cost at most as much again."""
    fetch = engine.streamer.fetch_cost
    why = ("no device calibration" if cm is None else
           "the calibration's costs per token are not positive" if min(cm.beta_d, cm.beta_p) <= 0 else
           "no copy bandwidth measured" if fetch.bandwidth <= 0 else None)
    if why:
        engine.fetch_sizing = f"{why}: steps not sized by the weight fetch"
        log.info("[stream] %s", engine.fetch_sizing)
        return False
    c, blocks = engine.config, engine.blocks.num_blocks
    # Each running sequence holds at least one block; a step's activations bound its
    # tokens: on a GPU, to the step its memory was sized for.
    most_tokens, most_seqs = engine.setup.largest_step or (MAX_FETCH_STEP, MAX_FETCH_STEP)
    seqs = fetch.rows_to_cover(cm.beta_d, most=min(blocks, MAX_FETCH_STEP, most_seqs))
    tokens = fetch.rows_to_cover(cm.beta_p, most=min(blocks * c.block_size, MAX_FETCH_STEP, most_tokens))
    # A budget the user set stays; else it takes at least a decode step of `seqs`.
    budget = c.max_num_batched_tokens if not auto_budget else max(c.max_num_batched_tokens, tokens, seqs)
    engine.config = replace(c, max_num_seqs=max(c.max_num_seqs, seqs), max_num_batched_tokens=budget)
    engine.fetch_sizing = (f"a step fetches {fetch.bytes_per_step(seqs) / 1e6:.0f} MB at {fetch.bandwidth / 1e9:.1f} "
                           f"GB/s ({1e3 * fetch.fetch_time(seqs):.0f} ms): decode steps of {seqs} sequences and "
                           f"prefill steps of {tokens} tokens cover it")
    if budget != c.max_num_batched_tokens:
        engine.budget_reason = "sized by the weight fetch"
    log.info("[stream] %s; up to %d sequences, %d tokens per step", engine.fetch_sizing,
             engine.config.max_num_seqs, engine.config.max_num_batched_tokens)
    return engine.config != c
