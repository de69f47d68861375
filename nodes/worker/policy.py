"""Choosing the engine's step planner, with the calibration EB and EB+ depend on."""

from __future__ import annotations

import fcntl
import logging
import time

from shoal.nodes.worker import calibration
from shoal.sampling import RequestError
from shoal.scheduler.adaptive_planner import AdaptivePlanner
from shoal.scheduler.cost_model import CalibrationError, CostModel
from shoal.scheduler.exclusive_planner import ExclusiveBatchPlanner
from shoal.scheduler.step_planner import MixedBatchPlanner

log = logging.getLogger(__name__)

POLICIES = ("mb", "eb", "ebplus")


CALIBRATION_TRIES = 2  # a fit that noise spoiled (another process busy on the cores) is measured once more


def obtain_cost_model(engine) -> CostModel:
    """The cached calibration for this model, dtype and device, or a fresh one. A fresh
    one that fails its checks is measured once more; what is cached then is kept, good
    or poor (a poor fit is still this device's measurement: the engine then decides the
    same way each start, the planner saying why it runs MB). Workers of one host that
    share the key measure once: the first holds a lock beside the cache and measures,
    the others wait and read what it saved (measured at once, each slows the other's
    steps: two CPU workers of a tiny model spoiled both fits under a loaded test run)."""
    cm = _cached(engine)
    if cm is not None:
        return cm
    path = calibration.cache_path(engine)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # (the kernel drops it if its holder dies)
        cm = _cached(engine)
        if cm is not None:
            return cm
        for attempt in range(1, CALIBRATION_TRIES + 1):
            log.info("[calibrate] measuring the step cost model on %s", calibration.engine_device(engine))
            cm = calibration.calibrate(engine)
            try:
                cm.validate()
                break
            except CalibrationError as e:
                log.warning("[calibrate] measurement %d of %d fails its checks: %s", attempt, CALIBRATION_TRIES, e)
        path = calibration.save(engine, cm)
    log.info("[calibrate] saved %s", path)
    return cm


def _cached(engine) -> CostModel | None:
    try:
        return calibration.load_cached(engine)
    except CalibrationError as e:
        log.warning("[calibrate] ignoring cached calibration: %s", e)
        return None


def build_planner(engine, policy: str, cost_model: CostModel | None = None):
    if policy not in POLICIES:
        raise ValueError(f"unknown policy {policy!r}; choose one of {', '.join(POLICIES)}")
    cfg = engine.planner_config()
    if policy == "mb":
        return MixedBatchPlanner(cfg)
    try:
        cm = cost_model or obtain_cost_model(engine)
        cm.validate(model=engine.fingerprint if cm.model else None)
    except (CalibrationError, RequestError, ValueError) as e:
        log.warning("[policy] %s refused (%s); falling back to MB (`shoal calibrate` measures again)", policy, e)
        engine.policy_fallback = str(e)
        return MixedBatchPlanner(cfg)
    engine.cost_model = cm
    return ExclusiveBatchPlanner(cfg, cm) if policy == "eb" else AdaptivePlanner(cfg, cm, clock=time.time)


def rebuild_planner(engine) -> None:
    """A planner for the engine's current config (its step budget or batch changed),
    with the calibration it already holds."""
    if engine.config.policy == "mb" or engine.cost_model is None:
        engine.planner = MixedBatchPlanner(engine.planner_config())
    else:
        engine.planner = build_planner(engine, engine.config.policy, engine.cost_model)
