"""A small, real training job for the demo and the tests: logistic regression by SGD on CPU.

It checkpoints to shared storage every few steps and on SIGTERM (Slurm's warning before a
requeue), and resumes from the last checkpoint when started again. Every step is a pure
function of the step number and the weights, so an interrupted-and-resumed run ends with
exactly the same weights as an uninterrupted one: that is how the demo proves no step was lost.

    python -m localenv.train --dir /checkpoints/run1 [--steps 300] [--every 10] [--delay 0.05]
    python -m localenv.train --reference --steps 300   # the uninterrupted result, in-process
"""
from __future__ import annotations

import argparse
import json
import math
import os
import random
import signal
import socket
import sys
import time
from pathlib import Path

FEATURES = 8
BATCH = 32
LR = 0.1


def dataset(n: int = 2048, seed: int = 7) -> list[tuple[list[float], float]]:
    rng = random.Random(seed)
    true_w = [rng.uniform(-2, 2) for _ in range(FEATURES)]
    data = []
    for _ in range(n):
        x = [rng.gauss(0, 1) for _ in range(FEATURES)]
        p = 1 / (1 + math.exp(-dot(true_w, x)))
        data.append((x, 1.0 if rng.random() < p else 0.0))
    return data


def dot(a: list[float], b: list[float]) -> float:
    """Left to right, one rounding per step: the same bits on every Python (since 3.12 the builtin
    sum of floats compensates its rounding, so 3.11 on the host and 3.14 in the Slurm root differ)."""
    acc = 0.0
    for x, y in zip(a, b):
        acc += x * y
    return acc


def step(w: list[float], data, i: int) -> tuple[list[float], float]:
    """One SGD step on the mini-batch chosen by the step number alone."""
    batch = [data[(i * BATCH + k) % len(data)] for k in range(BATCH)]
    grad = [0.0] * FEATURES
    loss = 0.0
    for x, y in batch:
        z = dot(w, x)
        p = 1 / (1 + math.exp(-z))
        loss -= y * math.log(p + 1e-12) + (1 - y) * math.log(1 - p + 1e-12)
        for j in range(FEATURES):
            grad[j] += (p - y) * x[j]
    return [wj - LR * g / BATCH for wj, g in zip(w, grad)], loss / BATCH


def reference(steps: int) -> list[float]:
    data, w = dataset(), [0.0] * FEATURES
    for i in range(steps):
        w, _ = step(w, data, i)
    return w


def save(path: Path, i: int, w: list[float]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"step": i, "weights": w}))
    os.replace(tmp, path)  # atomic: a kill mid-write never leaves half a checkpoint


def log_event(d: Path, **fields) -> None:
    fields.update(time=time.time(), host=os.environ.get("SLURMD_NODENAME", socket.gethostname()),
                  job=os.environ.get("SLURM_JOB_ID"), restarts=os.environ.get("SLURM_RESTART_COUNT", "0"))
    with open(d / "events.jsonl", "a") as f:
        f.write(json.dumps(fields) + "\n")


def train(d: Path, steps: int, every: int, delay: float) -> int:
    d.mkdir(parents=True, exist_ok=True)
    ckpt = d / "checkpoint.json"
    data = dataset()
    start, w = 0, [0.0] * FEATURES
    if ckpt.exists():
        state = json.loads(ckpt.read_text())
        start, w = state["step"], state["weights"]
    log_event(d, event="start", step=start)
    stop = {"signal": None}
    signal.signal(signal.SIGTERM, lambda s, f: stop.update(signal=s))
    i = start
    while i < steps:
        if stop["signal"]:
            save(ckpt, i, w)
            log_event(d, event="checkpoint-on-sigterm", step=i)
            return 143  # killed by TERM, checkpoint saved; Slurm requeues
        w, loss = step(w, data, i)
        i += 1
        if i % every == 0:
            save(ckpt, i, w)
            log_event(d, event="checkpoint", step=i, loss=round(loss, 6))
        time.sleep(delay)
    save(ckpt, i, w)
    (d / "result.json").write_text(json.dumps({"steps": i, "weights": w}))
    log_event(d, event="done", step=i)
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", type=Path, help="checkpoint folder on shared storage")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--every", type=int, default=10, help="checkpoint every N steps")
    ap.add_argument("--delay", type=float, default=0.05, help="seconds per step (stands in for GPU work)")
    ap.add_argument("--reference", action="store_true", help="print the uninterrupted run's weights")
    a = ap.parse_args(argv)
    if a.reference:
        print(json.dumps(reference(a.steps)))
        return 0
    if a.dir is None:
        ap.error("--dir is required")
    return train(a.dir, a.steps, a.every, a.delay)


if __name__ == "__main__":
    sys.exit(main())
