#!/usr/bin/env python3
"""Hyperparameter search (issue 49; see README.md here, "Search"), in one run:

The same objective, space and budget for every method: `val_loss(lr, width, epoch) =
(log10 lr + 2)^2 + (width - 0.5)^2 + 1/epoch` (optimum lr = 0.01, width = 0.5, lower
with more epochs), `lr` log-uniform in [1e-4, 1], `width` uniform in [0, 1]; 27 trials,
a budget of 1 to 27 epochs, reduction factor 3 (rungs 1, 3, 9, 27), two trials at once.

- drivetrain `search: {method: asha}`, `variant: promote` and `variant: stop`: each trial
  a `python3` process that resumes from its checkpoint and appends one metric line per
  epoch, run by the release binary with full containment;
- Optuna's `SuccessiveHalvingPruner` (`min_resource=1`, `reduction_factor=3`) with a
  `RandomSampler`, the objective in-process;
- Ray Tune's `ASHAScheduler` (`max_t=27`, `grace_period=1`, `reduction_factor=3`) with
  random search, the objective in-process in Ray's workers.

For each, over `--seeds` seeds: the epochs every trial trained in all (each epoch counted
once: drivetrain's trials resume from their checkpoints), against 27 x 27 = 729 for every
trial to the full budget (the grid of the same points); whether the best of those points
at the full budget (the grid's best) was reached within 1 %, and the epochs used when it
was (in the order they were reported). And the cost per trial: the wall time of the
search divided by its trials, drivetrain's against Optuna's in-process loop (and against
`python3 -c pass` started once per rung attempt, the floor of a trial that is a process).

  cargo build --release --bin drivetrain
  ~/.cache/drivetrain/venv/bin/pip install optuna 'ray[tune]'
  ~/.cache/drivetrain/venv/bin/python bench/search.py [--seeds 5] [--no-ray]
"""

import argparse
import json
import math
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TARGET = os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target"))
BIN = os.path.join(TARGET, "release", "drivetrain")

TRIALS, MAX, ETA = 27, 27, 3
# The interpreter a trial runs: the system's (a root engine's stages are host `nobody`,
# who cannot reach an interpreter under `/root`), also the floor measured.
PYTHON = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else "python3"


def loss(lr, width, epoch):
    return (math.log10(lr) + 2) ** 2 + (width - 0.5) ** 2 + 1.0 / epoch


TRAIN = """
import json, math, os, sys
lr, width, budget = float(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])
ck = os.path.join(os.environ["DRIVETRAIN_CHECKPOINTS"], "epoch")
done = int(open(ck).read()) if os.path.exists(ck) else 0
with open(os.environ["DRIVETRAIN_METRICS"], "a") as m:
    for epoch in range(done + 1, budget + 1):
        loss = (math.log10(lr) + 2) ** 2 + (width - 0.5) ** 2 + 1.0 / epoch
        m.write(json.dumps({"step": epoch, "val_loss": loss}) + "\\n")
open(ck, "w").write(str(budget))
open(os.path.join(os.environ["DRIVETRAIN_OUTPUT_MODEL"], "m"), "w").write(sys.argv[1])
"""

PIPELINE = """
version: 1
name: bench-search
stages:
  train:
    run:
      workdir: .
      command: [{python}, train.py, "{{{{ trial.params.lr }}}}", "{{{{ trial.params.width }}}}", "{{{{ trial.budget }}}}"]
    outputs: [model]
    search:
      method: asha
      variant: {variant}
      metric: val_loss
      max_trials: {trials}
      max_concurrent: 2
      budget: {{unit: epochs, min: 1, max: {max}}}
      reduction_factor: {eta}
      seed: {seed}
      space:
        lr: {{log_uniform: [0.0001, 1]}}
        width: {{uniform: [0, 1]}}
"""


def summary(points, reports):
    """`points`: every trial's params; `reports`: (epoch, value) in the order reported,
    each one epoch trained. The grid's best is the best of the same points at the full
    budget; reached: the epochs used when a full-budget report came within 1 % of it."""
    grid = min(loss(lr, w, MAX) for lr, w in points)
    reached = None
    for used, (epoch, value) in enumerate(reports, 1):
        if epoch == MAX and value <= grid * 1.01:
            reached = used
            break
    best = min((v for e, v in reports if e == MAX), default=None)
    return {"epochs": len(reports), "reached_at": reached, "grid_best": grid, "best": best}


def drivetrain(variant, seed, work):
    d = tempfile.mkdtemp(dir=work)
    # A root engine's stages are host `nobody`: the folders on the way are open to them.
    os.chmod(work, 0o755)
    os.chmod(d, 0o755)
    open(os.path.join(d, "train.py"), "w").write(TRAIN)
    p = os.path.join(d, "search.yaml")
    open(p, "w").write(PIPELINE.format(variant=variant, trials=TRIALS, max=MAX, eta=ETA, seed=seed, python=PYTHON))
    env = dict(os.environ, NO_COLOR="1")
    env.pop("DRIVETRAIN_HOME", None)
    t0 = time.perf_counter()
    r = subprocess.run([BIN, "run", p, "--parallelism", "2"], cwd=d, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if r.returncode != 0:
        sys.exit(f"drivetrain run failed:\n{r.stdout}\n{r.stderr}")
    db = sqlite3.connect(os.path.join(d, ".drivetrain", "state.db"))
    rows = db.execute("SELECT step, value FROM trial_metrics WHERE name = 'val_loss' ORDER BY rowid").fetchall()
    trials = db.execute("SELECT params, attempts FROM trials").fetchall()
    points = [(json.loads(t)["lr"], json.loads(t)["width"]) for t, _ in trials]
    attempts = sum(a for _, a in trials)
    out = summary(points, rows)
    out.update(wall=wall, trials=len(trials), attempts=attempts)
    return out


def optuna_sh(seed):
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    reports, points = [], []

    def objective(trial):
        lr = trial.suggest_float("lr", 1e-4, 1.0, log=True)
        width = trial.suggest_float("width", 0.0, 1.0)
        points.append((lr, width))
        value = None
        for epoch in range(1, MAX + 1):
            value = loss(lr, width, epoch)
            reports.append((epoch, value))
            trial.report(value, epoch)
            if trial.should_prune():
                raise optuna.TrialPruned()
        return value

    study = optuna.create_study(
        sampler=optuna.samplers.RandomSampler(seed=seed),
        pruner=optuna.pruners.SuccessiveHalvingPruner(min_resource=1, reduction_factor=ETA, min_early_stopping_rate=0),
    )
    t0 = time.perf_counter()
    study.optimize(objective, n_trials=TRIALS)
    wall = time.perf_counter() - t0
    out = summary(points, reports)
    out.update(wall=wall, trials=TRIALS, attempts=TRIALS)
    return out


def ray_asha(seed):
    import ray
    from ray import tune
    from ray.tune.schedulers import ASHAScheduler

    def trainable(config):
        for epoch in range(1, MAX + 1):
            tune.report({"val_loss": loss(config["lr"], config["width"], epoch), "epoch": epoch, "t": time.time()})

    import random

    random.seed(seed)
    space = {"lr": tune.loguniform(1e-4, 1.0), "width": tune.uniform(0.0, 1.0)}
    ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    try:
        t0 = time.perf_counter()
        tuner = tune.Tuner(
            trainable,
            param_space=space,
            tune_config=tune.TuneConfig(
                metric="val_loss",
                mode="min",
                num_samples=TRIALS,
                max_concurrent_trials=2,
                scheduler=ASHAScheduler(max_t=MAX, grace_period=1, reduction_factor=ETA, time_attr="epoch"),
                search_alg=tune.search.BasicVariantGenerator(random_state=seed),
            ),
            run_config=tune.RunConfig(verbose=0, storage_path=tempfile.mkdtemp()),
        )
        results = tuner.fit()
        wall = time.perf_counter() - t0
    finally:
        ray.shutdown()
    events, points = [], []
    for r in results:
        points.append((r.config["lr"], r.config["width"]))
        for _, row in r.metrics_dataframe.iterrows():
            events.append((row["t"], int(row["epoch"]), row["val_loss"]))
    events.sort()
    out = summary(points, [(e, v) for _, e, v in events])
    out.update(wall=wall, trials=TRIALS, attempts=TRIALS)
    return out


def python_start(n):
    t0 = time.perf_counter()
    for _ in range(n):
        subprocess.run([PYTHON, "-c", "pass"], check=True)
    return (time.perf_counter() - t0) / n


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--no-ray", action="store_true")
    a = ap.parse_args()
    methods = {
        "drivetrain asha promote": lambda s, w: drivetrain("promote", s, w),
        "drivetrain asha stop": lambda s, w: drivetrain("stop", s, w),
        "optuna SuccessiveHalvingPruner": lambda s, w: optuna_sh(s),
    }
    if not a.no_ray:
        methods["ray tune ASHAScheduler"] = lambda s, w: ray_asha(s)
    results = {m: [] for m in methods}
    with tempfile.TemporaryDirectory() as work:
        for seed in range(1, a.seeds + 1):
            for m, f in methods.items():
                results[m].append(f(seed, work))
    start = python_start(20)
    print(f"{TRIALS} trials, budget 1..{MAX} epochs, eta {ETA}; {a.seeds} seeds; every trial to the full budget: {TRIALS * MAX} epochs")
    print(f"{'method':<32} {'epochs (median)':>16} {'of 729':>7} {'grid best reached':>18} {'epochs to reach (median)':>25} {'ms/trial':>9}")
    for m, rs in results.items():
        epochs = statistics.median(r["epochs"] for r in rs)
        reached = [r["reached_at"] for r in rs if r["reached_at"] is not None]
        to_reach = statistics.median(reached) if reached else float("nan")
        per_trial = statistics.median(r["wall"] / r["trials"] for r in rs) * 1000
        print(f"{m:<32} {epochs:>16.0f} {epochs / (TRIALS * MAX):>6.0%} {len(reached):>12} of {len(rs):<3} {to_reach:>25.0f} {per_trial:>9.1f}")
    dt = results["drivetrain asha promote"]
    op = results["optuna SuccessiveHalvingPruner"]
    dt_trial = statistics.median(r["wall"] / r["trials"] for r in dt)
    op_trial = statistics.median(r["wall"] / r["trials"] for r in op)
    per_attempt = statistics.median(r["wall"] / r["attempts"] for r in dt)
    attempts = statistics.median(r["attempts"] for r in dt)
    print(
        f"per trial: drivetrain {dt_trial * 1000:.1f} ms ({attempts:.0f} rung attempts of {TRIALS} trials, "
        f"{per_attempt * 1000:.1f} ms of wall each, two at once; {PYTHON} -c pass alone {start * 1000:.1f} ms) against Optuna in-process "
        f"{op_trial * 1000:.2f} ms: {dt_trial / op_trial:.0f}x"
    )
    print(json.dumps(results))


if __name__ == "__main__":
    main()
