"""``pipeline bench``: the workload generator and report math. No timing asserts
anywhere; the smoke runs on the real broker are in tests/kafka/test_bench_live.py."""

from __future__ import annotations

import dataclasses
import itertools
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any, cast

import pytest
from click.testing import CliRunner
from support.predictions import floats

from pipeline.cli import main
from pipeline.inference import load_model
from pipeline.kafka.client import RequestProducer
from pipeline.scheduling import Controller
from pipeline.settings import ModelSettings, SchedulerSettings
from pipeline.tools.bench import (
    WORDS,
    WorkloadSpec,
    generate,
    markdown,
    percentile,
    summarize,
    targets,
)
from pipeline.tools.bench.drive import send
from pipeline.tools.bench.fleets import split_env
from pipeline.tools.bench.goodput import capacity_bound, goodput
from pipeline.tools.bench.report import goodputs
from pipeline.tools.bench.stats import (
    Answered,
    ProcProbe,
    batch_stats,
    last_answer_s,
    metric_total,
    parse_metrics,
)
from pipeline.tools.bench.workload import backlog

# -- workload --------------------------------------------------------------------


def test_same_seed_same_workload_and_another_seed_differs() -> None:
    spec = WorkloadSpec(n=500, seed=3, rate=100.0, dup_rate=0.3)
    assert generate(spec) == generate(spec)
    assert generate(spec) != generate(WorkloadSpec(n=500, seed=4, rate=100.0, dup_rate=0.3))


def test_lane_mix_within_tolerance() -> None:
    lanes = Counter(r.lane for r in generate(WorkloadSpec(n=5000, seed=1)))
    assert abs(lanes["realtime"] / 5000 - 0.1) < 0.02
    assert abs(lanes["standard"] / 5000 - 0.6) < 0.03
    assert abs(lanes["bulk"] / 5000 - 0.3) < 0.03


def test_lengths_mostly_short_with_a_long_tail_from_the_word_list() -> None:
    reqs = generate(WorkloadSpec(n=4000, seed=2, dup_rate=0.0))
    words = [len(r.text.split()) for r in reqs]
    short = sum(1 for w in words if w <= 12) / len(words)
    long_ = sum(1 for w in words if w > 40) / len(words)
    assert 0.70 < short < 0.80
    assert 0.03 < long_ < 0.07
    assert max(words) <= 160
    assert all(word in WORDS for r in reqs[:200] for word in r.text.split())


@pytest.mark.parametrize("dup_rate", [0.0, 0.2, 0.5])
def test_dup_rate_within_tolerance_and_zipf_skewed(dup_rate: float) -> None:
    reqs = generate(WorkloadSpec(n=4000, seed=5, dup_rate=dup_rate, hot_set=50))
    seen: set[str] = set()
    repeats = 0
    for r in reqs:
        repeats += r.text in seen
        assert r.duplicate == (r.text in seen)
        seen.add(r.text)
    assert abs(repeats / len(reqs) - dup_rate) < 0.03
    if dup_rate:
        counts = Counter(r.text for r in reqs if r.duplicate).most_common()
        hottest, tenth = counts[0][1], counts[9][1]
        assert hottest > 3 * tenth  # Zipf: rank 1 weighs ~12x rank 10 at s=1.1


def test_open_loop_offsets_follow_the_rate_and_saturation_sends_at_once() -> None:
    reqs = generate(WorkloadSpec(n=2000, seed=9, rate=200.0))
    offsets = [r.offset_ms for r in reqs]
    assert offsets == sorted(offsets)
    assert abs(offsets[-1] / 1000 - 2000 / 200) < 1.0
    assert {r.offset_ms for r in generate(WorkloadSpec(n=50, seed=9))} == {0.0}


def test_bad_specs_are_refused() -> None:
    with pytest.raises(ValueError):
        WorkloadSpec(n=10, dup_rate=1.5)
    with pytest.raises(ValueError):
        WorkloadSpec(n=10, lane_mix=(1.0, 0.0))  # type: ignore[arg-type]


def test_backlog_is_bulk_at_once_then_a_realtime_stream_at_its_rate() -> None:
    reqs = backlog(300, rate=10.0, realtime=200, seed=4, dup_rate=0.2)
    assert reqs == backlog(300, rate=10.0, realtime=200, seed=4, dup_rate=0.2)
    assert [r.index for r in reqs] == list(range(500))
    heap, stream = reqs[:300], reqs[300:]
    assert {r.lane for r in heap} == {"bulk"} and {r.offset_ms for r in heap} == {0.0}
    assert any(r.duplicate for r in heap)  # the bulk repeats like any other workload
    assert {r.lane for r in stream} == {"realtime"} and not any(r.duplicate for r in stream)
    offsets = [r.offset_ms for r in reqs]
    assert offsets == sorted(offsets) and stream[0].offset_ms == 0.0
    assert abs(stream[-1].offset_ms / 1000 - 200 / 10.0) < 3.0  # Poisson at 10/s
    assert not {r.text for r in stream} & {r.text for r in heap}
    with pytest.raises(ValueError):
        backlog(10, rate=0.0, realtime=5, seed=1)


class _Recorder:
    """Takes the place of the producer: what ``send`` handed over, in order."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, str]] = []

    def send(self, text: str, *, lane: str, request_id: str) -> str:
        self.sent.append((request_id, lane))
        return request_id

    def flush(self) -> None:
        pass


class _Log:
    def __init__(self) -> None:
        self.sent: dict[str, tuple[str, float]] = {}


def test_send_stops_once_told_without_waiting_for_the_next_offset() -> None:
    # The realtime stream is 100 s apart: were the stop not honoured, send would wait.
    workload = backlog(5, rate=0.01, realtime=3, seed=2)
    producer, log, stop = _Recorder(), _Log(), threading.Event()

    def progress(_: int) -> None:
        if len(producer.sent) == 5:
            stop.set()

    send(cast(RequestProducer, producer), workload, prefix="p-", collector=log,
         progress=progress, stop=stop)  # fmt: skip
    assert producer.sent == [(f"p-{i}", "bulk") for i in range(5)]
    assert sorted(log.sent) == [f"p-{i}" for i in range(5)]


# -- report math -----------------------------------------------------------------


def test_percentile_interpolates_like_numpy() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 50) == pytest.approx(50.5)
    assert percentile(values, 99) == pytest.approx(99.01)
    assert percentile(values, 0) == 1.0 and percentile(values, 100) == 100.0
    assert percentile([7.0], 95) == 7.0
    assert percentile([], 50) is None
    with pytest.raises(ValueError):
        percentile(values, 101)


def test_summarize_counts_lanes_misses_expirations_and_dedupe() -> None:
    answers = [
        Answered("a", "realtime", "result", 0, 100.0, completed_at_ms=90, served="computed"),
        Answered("b", "realtime", "result", 0, 300.0, completed_at_ms=250, served="stored"),
        Answered("c", "realtime", "dead_letter", 0, 50.0, stage="expired"),
        Answered("d", "bulk", "result", 0, 1000.0, completed_at_ms=900, served="batch"),
    ]
    s = summarize(answers, sent=5, started_ms=0.0, deadlines_ms={"realtime": 200, "bulk": 60000})
    assert s["answered"] == 4 and s["unanswered"] == 1
    assert s["throughput"] == pytest.approx(4.0)  # 4 answers in 1 s
    assert s["latency_ms"]["realtime"]["p50"] == pytest.approx(200.0)
    assert s["latency_ms"]["bulk"]["p99"] == pytest.approx(1000.0)
    assert s["deadline_missed"] == {"realtime": 1, "standard": 0, "bulk": 0}
    assert s["expired"]["realtime"] == 1
    assert s["served"] == {"computed": 1, "stored": 1, "batch": 1}
    assert s["dedupe_hit_rate"]["stored"] == pytest.approx(1 / 3)


def test_realtime_path_splits_computed_latency_into_legs() -> None:
    def result(rid: str, served: str, queue: float, model: float) -> Answered:
        return Answered(rid, "realtime", "result", 1000, 1250.0, completed_at_ms=1200,
                        served=served, queue_ms=queue, inference_ms=model)  # fmt: skip

    s = summarize(
        [result("a", "computed", 50.0, 40.0), result("b", "stored", 0.0, 0.0)],
        sent=2, started_ms=1000.0, deadlines_ms={"realtime": 200},
    )  # fmt: skip
    legs = s["realtime_path_ms"]
    # created 1000 -> completed 1200 -> received 1250; only the computed one counts
    assert {leg: v["p50"] for leg, v in legs.items()} == {
        "queue": 50.0,
        "engine": 110.0,
        "model": 40.0,
        "answer": 50.0,
    }
    assert legs["queue"]["n"] == 1
    report = {"modes": {"adaptive": {"mode": "adaptive", "phases": [{"phase": "load-80", **s}]}}}
    assert "| adaptive | load-80 | 1 | 50 / 50 | 110 / 110 | 40 / 40 | 50 / 50 |" in markdown(
        report
    )


def test_metrics_parsing_and_batch_stats() -> None:
    text = (
        "# HELP x\n"
        "pipeline_batch_size_count 10.0\npipeline_batch_size_sum 80.0\n"
        "pipeline_tokens_real_total 600.0\npipeline_tokens_padded_total 1000.0\n"
        'pipeline_queue_depth{lane="bulk"} 3.0\npipeline_queue_depth{lane="realtime"} 1.0\n'
    )
    after = parse_metrics(text)
    assert metric_total(after, "pipeline_queue_depth") == 4.0
    assert metric_total(after, "pipeline_queue_depth", lane="bulk") == 3.0
    stats = batch_stats(parse_metrics(""), after)
    assert stats["mean_batch_size"] == 8.0
    assert stats["mean_batch_tokens"] == 100.0
    assert stats["padding_ratio"] == pytest.approx(0.4)


def test_sampler_averages_the_gpu_over_each_phase_alone(tmp_path: Path) -> None:
    """The GPU is read at each tick of the phase that runs, not once after it: a
    phase's ``gpu_util`` is the mean of its own ticks, and ticks between phases
    count for none. NVML has no GPU to read here; a stand-in gives the readings."""
    import prometheus_client

    from pipeline.tools.bench.phases import Sampler, mean_gpu
    from pipeline.tools.bench.report import write_report
    from pipeline.tools.supervise import free_port

    readings = iter([0.2, 0.4, 0.9, 0.9, 0.9] + [0.5] * 1000)

    class StandIn:
        closed = False

        def utilisation(self) -> float:
            return next(readings)

        def close(self) -> None:
            self.closed = True

    registry = prometheus_client.CollectorRegistry()
    prometheus_client.Gauge("pipeline_token_budget", "", registry=registry).set(512)
    port = free_port()
    server, thread = prometheus_client.start_http_server(port, "127.0.0.1", registry)
    device = StandIn()
    try:
        sampler = Sampler(port, interval_s=0.02, device=device)
        sampler.phase = "backlog"
        deadline = time.monotonic() + 10
        while len(sampler.rows) < 5 and time.monotonic() < deadline:
            time.sleep(0.01)
        sampler.phase = ""
        time.sleep(0.1)
        sampler.close()
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
    assert device.closed
    backlog_rows = [r for r in sampler.rows if r["phase"] == "backlog"]
    assert len(backlog_rows) >= 5 and backlog_rows[0]["budget"] == 512
    expected = sum(r["gpu"] for r in backlog_rows) / len(backlog_rows)
    assert sampler.gpu_util("backlog") == pytest.approx(expected)
    assert 0.2 <= expected < 0.9 and any(r["phase"] == "" for r in sampler.rows)
    assert mean_gpu(sampler.rows, "saturate") is None
    assert mean_gpu([{"phase": "x", "gpu": None}], "x") is None

    rows = [{**r, "batches": i, "items": 4 * i} for i, r in enumerate(sampler.rows)]
    report = {"config": {}, "modes": {"adaptive": {"mode": "adaptive", "phases": [],
                                                    "timeline": rows}}}  # fmt: skip
    paths = write_report(report, tmp_path)
    assert paths["adaptive_timeline"].stat().st_size > 0


def test_a_run_without_load_phases_or_an_adaptive_worker_draws_no_empty_plot(
    tmp_path: Path,
) -> None:
    from pipeline.tools.bench.plots import plots

    saturated: dict[str, Any] = {"phase": "saturate", "offered_rate": None, "latency_ms": {}}
    phases = [saturated]
    report = {"modes": {"noop": {"mode": "noop", "phases": phases, "timeline": []}}}
    assert plots(report, tmp_path) == []
    assert not list(tmp_path.glob("*.png"))
    loaded = {**saturated, "offered_rate": 100.0,
              "latency_ms": {"realtime": {"p99": 50.0}, "all": {"p99": 80.0}}}  # fmt: skip
    phases.append(loaded)
    assert [p.name for p in plots(report, tmp_path)] == ["latency_vs_load.png"]


def test_proc_probe_reads_this_process() -> None:
    import os

    probe = ProcProbe(os.getpid())
    assert (probe.cpu_s() or 0) > 0
    assert (probe.peak_rss_bytes() or 0) > 1 << 20
    assert ProcProbe(2**22 + 7).cpu_s() is None


def test_targets_and_markdown_from_a_report() -> None:
    def phase(name: str, tput: float, **extra: object) -> dict[str, object]:
        lat = {k: {"p50": 10.0, "p95": 20.0, "p99": 30.0} for k in ("realtime", "all")}
        return {
            "phase": name,
            "throughput": tput,
            "latency_ms": lat,
            "sent": 1,
            "answered": 1,
            "expired": {"realtime": 0},
            "unanswered": 0,
            **extra,
        }

    report = {
        "config": {"dup_rate": 0.2},
        "modes": {
            "raw": {
                "mode": "raw",
                "phases": [
                    phase("saturate", 100.0, sweep={"256": 100.0, "512": 90.0}, single=50.0)
                ],
            },
            "adaptive": {
                "mode": "adaptive",
                "phases": [
                    phase("saturate", 95.0, peak_rss_bytes=2**30),
                    phase("load-80", 76.0, offered_rate=76.0),
                    phase("dup-0", 90.0),
                    phase("dup-50", 180.0),
                ],
            },
        },
    }
    by_name = {t["target"]: t for t in targets(report)}
    assert by_name["adaptive / raw throughput"]["met"] is True
    unique = by_name["adaptive at 0 % repeats / raw (raw: whole workload sorted, token budget)"]
    assert unique["value"] == pytest.approx(0.9) and unique["met"] is True
    assert by_name["adaptive / sync throughput"]["met"] is None  # sync did not run
    gain = by_name["the model alone: best batch / batch 1 (for reference: batching's own gain)"]
    assert gain["value"] == pytest.approx(100.0 / 50.0)
    assert by_name["50 % duplicates / 0 % throughput"]["value"] == pytest.approx(2.0)
    rss = by_name["worker peak RSS (adaptive: the defaults, bursts included)"]
    assert rss["value"] == pytest.approx(1.0) and rss["met"] is False  # goal 0.6 GiB
    both = by_name["worker + model process peak RSS"]
    assert both["value"] == pytest.approx(1.0) and both["met"] is True  # no model process
    assert by_name["fixed worker peak RSS (for reference)"]["met"] is None  # fixed did not run
    table = markdown(report)
    assert table.startswith("| mode | phase |") and "| adaptive | load-80 |" in table


def test_targets_for_the_seed_case_burst_after_idle_and_the_faust_floor() -> None:
    def phase(name: str, tput: float | None, p99: float, **extra: object) -> dict[str, object]:
        lat = {k: {"p50": p99 / 2, "p95": p99, "p99": p99} for k in ("realtime", "all")}
        return {"phase": name, "throughput": tput, "latency_ms": lat, "sent": 10, "answered": 10,
                "expired": {"realtime": 0}, "unanswered": 0, **extra}  # fmt: skip

    report = {
        "config": {"workers": 2},
        "modes": {
            "adaptive": {"phases": [phase("burst", 100.0, 250.0, expired={"realtime": 3})]},
            "noop": {
                "phases": [
                    phase("saturate", 8000.0, 900.0, workers=2),
                    phase("after-idle", None, 40.0, idle_s=3.0, latencies_ms=[12.0, 40.0]),
                ]
            },
            "faust-floor": {"phases": [phase("saturate", 10000.0, 0.0, workers=2)]},
            "floor": {"phases": [phase("saturate", 20000.0, 0.0)]},
        },
    }
    by_name = {t["target"]: t for t in targets(report)}
    burst = by_name["adaptive, a burst of 10 at once into the idle worker: realtime p99"]
    assert burst["value"] == 250.0 and burst["met"] is False
    assert by_name["adaptive, the same burst of 10: realtime expirations"]["value"] == 3.0
    idle = by_name["noop, a realtime request after idle (3 s silences): p99"]
    assert idle["value"] == 40.0 and idle["met"] is True
    assert by_name["noop events/s per worker"]["value"] == pytest.approx(4000.0)  # 2 workers
    ratio = by_name["noop / bare Faust agent (faust-floor), same workers"]
    assert ratio["value"] == pytest.approx(0.8) and ratio["met"] is True
    assert by_name["noop / plain confluent-kafka loop (the long-term aim)"]["value"] == 0.4
    table = markdown(report)
    assert "| noop | after-idle |" in table and "| faust-floor | saturate |" in table
    assert "creation → result, ms: 12, 40" in table and "2 worker processes" in table


def test_backlog_targets_drain_time_and_its_line_in_the_report() -> None:
    def answer(rid: str, lane: str, created: int, received: float) -> Answered:
        return Answered(rid, lane, "result", created, received, completed_at_ms=int(received))

    started = 1000.0
    answers = [
        answer("b0", "bulk", 1000, 4000.0),
        answer("r0", "realtime", 1000, 1120.0),
        answer("b1", "bulk", 1000, 9200.0),
        answer("r1", "realtime", 2000, 2090.0),
        Answered("r2", "realtime", "dead_letter", 3000, 3050.0, stage="expired"),
    ]
    assert last_answer_s(answers, "bulk", started) == pytest.approx(8.2)
    assert last_answer_s(answers, "standard", started) is None
    s = summarize(answers, sent=1503, started_ms=started, deadlines_ms={"realtime": 200})
    phase = {**s, "phase": "backlog", "backlog_requests": 1500, "realtime_rate": 10.0,
             "backlog_max_s": 60.0, "drain_s": 8.2, "drained": True}  # fmt: skip
    report = {"modes": {"adaptive": {"mode": "adaptive", "phases": [phase]}}}
    by_name = {t["target"]: t for t in targets(report)}
    p99 = by_name["adaptive, realtime at 10/s while a 1,500-request bulk backlog drains: "
                  "realtime p99"]  # fmt: skip
    assert p99["value"] == pytest.approx(s["latency_ms"]["realtime"]["p99"])
    assert p99["goal"] == 150.0 and p99["met"] is True  # 120 and 90 ms
    expired = by_name["adaptive, the same backlog: realtime expirations"]
    assert expired["value"] == 1.0 and expired["met"] is False
    table = markdown(report)
    assert "| adaptive | backlog |" in table
    assert "1,500 bulk requests at once into the idle worker drained in 8.2 s" in table
    assert "3 realtime requests sent at 10/s meanwhile" in table
    stuck = markdown({"modes": {"adaptive": {"phases": [phase | {"drained": False}]}}})
    assert "was not drained when the realtime stream ended (60 s at most)" in stuck
    unrun = {t["target"]: t for t in targets({"modes": {}})}
    assert unrun["adaptive, a bulk backlog drains: realtime p99"]["met"] is None


# -- the model alone: token-budget batches, raw on the simulated device ---------------


def test_token_batches_fill_the_budget_in_order_and_never_leave_a_text_out() -> None:
    from pipeline.tools.bench.alone import token_batches

    lengths = [3, 3, 4, 10, 10, 50]
    assert [list(b) for b in token_batches(lengths, 12)] == [[0, 1, 2], [3], [4], [5]]
    assert [list(b) for b in token_batches(lengths, 20)] == [[0, 1, 2], [3, 4], [5]]
    assert [len(b) for b in token_batches(lengths, 0)] == [1] * 6  # one text a batch
    assert token_batches([], 100) == []
    unsorted = [10, 2, 2, 2]  # the longest so far counts, wherever it is
    assert [list(b) for b in token_batches(unsorted, 20)] == [[0, 1], [2, 3]]
    import random

    rng = random.Random(4)
    for _ in range(50):
        lens = sorted(rng.randint(1, 64) for _ in range(rng.randint(1, 80)))
        budget = rng.randint(0, 512)
        batches = token_batches(lens, budget)
        assert [i for b in batches for i in b] == list(range(len(lens)))
        for b in batches:
            assert len(b) == 1 or len(b) * max(lens[i] for i in b) <= budget
        for b, nxt in itertools.pairwise(batches):  # greedy: the next text did not fit
            assert (len(b) + 1) * max(lens[i] for i in [*b, nxt[0]]) > budget


def test_raw_on_the_simulated_device_sorts_everything_and_picks_its_best_budget(
    tmp_path: Path,
) -> None:
    from pipeline.inference.sim import read_busy_s
    from pipeline.tools.bench.alone import run_raw

    texts = [r.text for r in generate(WorkloadSpec(n=60, seed=3, dup_rate=0.0))]
    device = tmp_path / "sim-device"
    settings = ModelSettings(device="sim", sim_profile="graphed", sim_file=str(device))
    raw = run_raw(settings, texts, budgets=(64, 2048), sweep_n=60)
    assert raw["device"] == "sim" and raw["dtype"] == "sim-graphed"
    assert raw["answered"] == raw["sent"] == 60 and raw["throughput"] > 0
    assert raw["best_budget"] in (64, 2048) and set(raw["sweep"]) == {"64", "2048"}
    assert raw["sweep"][str(raw["best_budget"])] == max(raw["sweep"].values())
    assert raw["single"] > 0 and raw["best_batch_size"] == raw["mean_batch_size"]
    assert raw["mean_batch_size"] == pytest.approx(60 / raw["batches"])
    # The whole workload sorted by tokens, then cut by the budget: batches and padding
    # are what token_batches gives on the sorted counts.
    from pipeline.tools.bench.alone import token_batches

    model = load_model(dataclasses.replace(settings, process="off"))
    lengths = sorted(model.count_tokens(t) for t in texts)
    batches = token_batches(lengths, raw["best_budget"])
    assert raw["batches"] == len(batches)
    padded = sum(len(b) * lengths[b[-1]] for b in batches)
    assert raw["mean_batch_tokens"] * raw["batches"] == pytest.approx(padded)
    assert raw["padding_ratio"] == pytest.approx(1 - sum(lengths) / padded)
    assert read_busy_s(device) > 0  # the simulated device did the work


def test_run_bench_on_sim_gives_raw_its_device_and_profile_and_st_is_not_applicable(
    tmp_path: Path,
) -> None:
    """Neither mode touches Kafka: raw runs the run's own simulated device, st says why
    it did not run, and the report says so."""
    from pipeline.settings import Settings
    from pipeline.tools.bench import BenchConfig, run_bench

    config = BenchConfig(modes=("raw", "st"), requests=40, device="sim", sim_profile="traced",
                         raw_budgets=(4096,), out=tmp_path)  # fmt: skip
    report = run_bench(config, Settings.from_env({}), "127.0.0.1:1")
    (raw,) = report["modes"]["raw"]["phases"]
    assert raw["device"] == "sim" and raw["dtype"] == "sim-traced" and raw["answered"] == 40
    assert report["modes"]["st"] == {
        "mode": "st", "skipped": "n/a on --device sim", "phases": [], "timeline": []
    }  # fmt: skip
    assert not (tmp_path / "work").exists()  # the device file went with the run's work folder
    table = markdown(report)
    assert "| raw | saturate |" in table and "on sim (sim-traced)" in table
    assert "encode: n/a on the simulated device" in table


# -- the feed: F, G, U ---------------------------------------------------------------


def _feed_report(device: str | None, profile: str = "eager") -> dict[str, object]:
    def phase(name: str, tput: float, **extra: object) -> dict[str, object]:
        lat = {k: {"p50": 10.0, "p95": 20.0, "p99": 30.0} for k in ("realtime", "all")}
        return {"phase": name, "throughput": tput, "latency_ms": lat, "sent": 1, "answered": 1,
                "expired": {"realtime": 0}, "unanswered": 0, **extra}  # fmt: skip

    raw = phase("saturate", 5000.0, best_budget=4096, best_batch_size=200.0,
                mean_batch_size=200.0, mean_batch_tokens=4000.0, padding_ratio=0.1,
                sweep={"2048": 4000.0, "4096": 5000.0}, single=300.0, device="sim",
                dtype="sim-eager")  # fmt: skip
    rss = {"peak_rss_bytes": 2**29, "model_peak_rss_bytes": 2**28}
    cpu = {"cpu_util": 0.85, "model_cpu_util": 0.3}
    adaptive = [
        phase("saturate", 2000.0, model_forward_s=4.0, model_lock_wait_s=1.0, **rss, **cpu),
        phase("load-80", 1500.0, model_forward_s=100.0, model_lock_wait_s=100.0),  # not saturated
        phase("dup-0", 2400.0, model_forward_s=4.0, model_lock_wait_s=0.5),
        phase(
            "backlog",
            2100.0,
            model_forward_s=2.0,
            model_lock_wait_s=0.5,
            mean_batch_size=110.0,
            mean_batch_tokens=1000.0,
            device_busy=0.4,
            gpu_util=0.7,
            backlog_requests=1,
            realtime_rate=10.0,
            backlog_max_s=60.0,
            drained=True,
            drain_s=1.0,
        ),
    ]
    return {
        "config": {"device": device, "sim_profile": profile},
        "modes": {
            "raw": {"mode": "raw", "phases": [raw]},
            "adaptive": {"mode": "adaptive", "env": {}, "phases": adaptive},
            "noop": {"mode": "noop", "phases": [phase("saturate", 3000.0)]},
        },
    }


def test_the_table_shows_the_model_process_cores_beside_the_workers() -> None:
    from pipeline.tools.bench.report import markdown

    table = markdown(_feed_report("sim", "graphed"))
    assert "| 0.85 + 0.30 | 512 + 256 |" in table  # adaptive, saturated: both processes
    noop = next(line for line in table.splitlines() if line.startswith("| noop | saturate |"))
    assert "+" not in noop  # no model process: nothing beside the worker


def test_feed_divides_what_it_says_over_the_phases_it_says() -> None:
    from pipeline.tools.bench.feed import feed

    f = feed(_feed_report("sim", "graphed"))
    assert f["F"] == pytest.approx(2400.0 / 3000.0) and f["F_base"] == "noop"
    assert f["G"] == pytest.approx((1.0 + 0.5 + 0.5) / (4.0 + 4.0 + 2.0))  # load-80 left out
    assert f["U"] == 0.4 and f["U_source"] == "simulated device's counter"
    assert f["batch_ratio"] == pytest.approx(110.0 / 200.0)
    assert f["tokens_ratio"] == pytest.approx(1000.0 / 4000.0)
    assert f["worker_rss_gib"] == 0.5 and f["rss_total_gib"] == 0.75
    assert f["sim_profile"] == "graphed" and f["st"] is None
    cuda = feed(_feed_report("cuda"))
    assert cuda["U"] == 0.7 and cuda["U_source"] == "NVML"
    assert cuda["G"] is None and cuda["sim_profile"] is None  # the lock wait is known on sim only
    cpu = feed(_feed_report(None))
    assert cpu["U"] is None and cpu["G"] is None and cpu["F"] == pytest.approx(0.8)
    report = _feed_report("sim")
    report["modes"]["raw"]["phases"][0]["throughput"] = 1000.0  # type: ignore[index]
    slow = feed(report)
    assert slow["F"] == pytest.approx(2.4) and slow["F_base"] == "raw"
    del report["modes"]["noop"]  # type: ignore[attr-defined]
    assert feed(report)["F"] is None


def test_f0_divides_by_noop_without_repeats_beside_f() -> None:
    """F stays adaptive's dup-0 over min(raw, noop's saturation phase); F0, context,
    divides by noop's own dup-0 (the same new texts) where the run has it."""
    from pipeline.tools.bench.feed import feed

    report = _feed_report("sim", "graphed")
    noop = report["modes"]["noop"]["phases"]  # type: ignore[index]
    noop.append({**noop[0], "phase": "dup-0", "throughput": 2700.0})
    f = feed(report)
    assert f["F"] == pytest.approx(2400.0 / 3000.0) and f["noop"] == 3000.0
    assert f["F0"] == pytest.approx(2400.0 / 2700.0) and f["noop_unique"] == 2700.0
    table = markdown(report)
    assert "over min(raw 5,000/s, noop 3,000/s) (F0 = 0.89 over noop at 0 % repeats" in table
    before = feed(_feed_report("sim", "graphed"))  # a run from before noop had dup-0
    assert before["F0"] is None and "F0" not in markdown(_feed_report("sim", "graphed"))


def test_feed_targets_and_lines_in_the_report() -> None:
    report = _feed_report("sim", "graphed")
    by_name = {t["target"]: t for t in targets(report)}
    f_row = by_name["F (sim, graphed profile): adaptive at 0 % repeats / min(raw, noop)"]
    assert f_row["goal"] == 0.8 and f_row["met"] is True
    g_row = by_name["G (sim): model-side interpreter-lock wait / forward time, adaptive saturated"]
    assert g_row["value"] == pytest.approx(0.2) and g_row["met"] is False
    u_row = by_name["U (simulated device's counter): device busy under the backlog"]
    assert u_row["value"] == 0.4 and u_row["goal"] is None and u_row["met"] is None
    assert by_name["under the backlog: mean batch / raw's best batch"]["met"] is True
    assert by_name["worker peak RSS (adaptive: the defaults, bursts included)"]["met"] is True
    assert by_name["raw / sentence-transformers' encode, same device and texts"]["met"] is None
    table = markdown(report)
    assert "Feed (sim, graphed profile): F = 0.80, adaptive at 0 % repeats 2,400/s" in table
    assert "G = 0.20 of the model's forward time" in table
    assert "batches of 110.0 texts and 1,000 tokens against raw's best 200.0 and 4,000" in table
    assert "encode: n/a on the simulated device" in table
    assert (
        "| U (simulated device's counter): device busy under the backlog | 0.40  | – "
        "| reported |" in table
    )
    eager = {t["target"]: t for t in targets(_feed_report("sim", "eager"))}
    assert eager["F (sim, eager profile): adaptive at 0 % repeats / min(raw, noop)"]["goal"] is None
    slow = {t["target"]: t for t in targets(_feed_report("sim", "slow"))}
    assert slow["F (sim, slow profile): adaptive at 0 % repeats / min(raw, noop)"]["goal"] == 0.95


def test_model_stats_and_the_model_process_among_the_children(tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    from pipeline.tools.bench.stats import model_stats

    before = parse_metrics("pipeline_model_forward_seconds_total 2.0\n"
                           "pipeline_model_lock_wait_seconds_total 0.5\n")  # fmt: skip
    after = parse_metrics("pipeline_model_forward_seconds_total 6.0\n"
                          "pipeline_model_lock_wait_seconds_total 1.5\n")  # fmt: skip
    assert model_stats(before, after) == {"model_forward_s": 4.0, "model_lock_wait_s": 1.0}
    assert model_stats(None, after) == {"model_forward_s": None, "model_lock_wait_s": None}
    child = subprocess.Popen(
        [sys.executable, "-c", "print('up', flush=True); import time; time.sleep(30)", "marker"],
        stdout=subprocess.PIPE,
    )
    try:
        assert child.stdout is not None and child.stdout.readline() == b"up\n"  # it runs
        me = ProcProbe(os.getpid())
        assert child.pid in me.children()
        assert "time.sleep(30) marker" in ProcProbe(child.pid).cmdline()
    finally:
        child.kill()
        child.wait()
        if child.stdout is not None:
            child.stdout.close()
    assert ProcProbe(2**22 + 7).children() == [] and ProcProbe(2**22 + 7).cmdline() == ""


# -- the small additions: noop model, fixed policy --------------------------------


def test_noop_model_answers_without_weights() -> None:
    model = load_model(ModelSettings(task="noop"))
    preds = model.predict(["a b c", "hello"])
    assert [floats(p) for p in preds] == [[1.0, 0.0, 0.0, 0.0]] * 2
    assert ModelSettings(task="noop").model_id == "noop@1"


def test_fixed_policy_never_moves_the_budget() -> None:
    controller = Controller(SchedulerSettings(policy="fixed"), slo_ms=200)
    for latency in (1.0, 500.0, 500.0, 500.0, 1.0):
        controller.observe(padded_tokens=512, latency_ms=latency, utilisation=0.1, saturated=True)
    assert controller.budget == 512


def test_help_lists_the_flags() -> None:
    result = CliRunner().invoke(main, ["bench", "--help"])
    assert result.exit_code == 0
    for flag in (
        "--quick",
        "--modes",
        "--duration",
        "--rate",
        "--dup-rate",
        "--seed",
        "--out",
        "--device",
        "--sim-profile",
        "--bootstrap",
        "--workers",
        "--burst",
        "--burst-small",
        "--fleet-realtime-workers",
        "--backlog",
        "--backlog-max-s",
        "--idle-requests",
        "--idle-s",
        "--set",
    ):
        assert flag in result.output
    assert "sim" in result.output and "graphed" in result.output
    bad = CliRunner().invoke(main, ["bench", "--modes", "turbo"])
    assert bad.exit_code != 0 and "turbo" in bad.output
    profile = CliRunner().invoke(main, ["bench", "--device", "sim", "--sim-profile", "warp"])
    assert profile.exit_code == 2 and "warp" in profile.output


@pytest.mark.parametrize(
    ("arg", "says"),
    [
        ("PIPELINE_SCHEDULER_FLOW_THRESHHOLD=1", "did you mean PIPELINE_SCHEDULER_FLOW_THRESHOLD"),
        ("PIPELINE_SCHEDULER_MAX_ITEMS=eight", "expected"),
        ("SCHEDULER_MAX_ITEMS=8", "expected PIPELINE_NAME=VALUE"),
        ("PIPELINE_SCHEDULER_MAX_ITEMS", "expected PIPELINE_NAME=VALUE"),
    ],
)
def test_set_refuses_what_a_worker_would_refuse_before_starting_anything(
    arg: str, says: str
) -> None:
    result = CliRunner().invoke(main, ["bench", "--set", arg])
    assert result.exit_code == 2 and says in result.output, result.output


def test_goodput_divides_on_time_by_what_the_model_could_have_finished() -> None:
    # The case: ~230 texts/s alone, a 200 ms deadline less ~30 ms of legs.
    c = capacity_bound(230.0, 200.0, 30.0)
    assert c == pytest.approx(39.1)
    assert goodput(17, 100, c) == pytest.approx(17 / 39.1)  # more sent than possible
    assert goodput(30, 37, 1000.0) == pytest.approx(30 / 37)  # fewer sent than possible
    assert capacity_bound(230.0, 200.0, 250.0) == 0.0  # the legs alone spend the deadline
    assert goodput(0, 10, 0.0) is None and goodput(0, 0, 39.1) is None


def test_summarize_counts_realtime_on_time_and_when_its_expirations_came_back() -> None:
    answers = [
        Answered("a", "realtime", "result", 0, 150.0, completed_at_ms=120, served="computed"),
        Answered("b", "realtime", "result", 0, 260.0, completed_at_ms=230, served="computed"),
        Answered("c", "realtime", "dead_letter", 0, 60.0, stage="expired", failed_at_ms=50),
        Answered("d", "realtime", "dead_letter", 10, 190.0, stage="expired", failed_at_ms=150),
        Answered("e", "realtime", "dead_letter", 0, 500.0, stage="decode"),
    ]
    s = summarize(answers, sent=5, started_ms=0.0, deadlines_ms={"realtime": 200})
    assert s["on_time"]["realtime"] == 1 and s["deadline_missed"]["realtime"] == 1
    after = s["realtime_expired_after_ms"]
    assert after["n"] == 2 and after["p50"] == pytest.approx(120.0)  # 60 and 180 ms
    decided = s["realtime_expired_decided_ms"]  # the worker's decision: 50 and 140 ms
    assert decided["n"] == 2 and decided["max"] == 140
    assert s["deadlines_ms"] == {"realtime": 200}


def test_goodput_targets_from_raw_and_the_bursts_of_the_same_run() -> None:
    def burst(
        name: str, sent: int, on_time: int, expired: int, after_p99: float
    ) -> dict[str, object]:
        legs = {"engine": {"p50": 20.0}, "answer": {"p50": 10.0}}
        return {"phase": name, "sent": sent * 10, "throughput": 100.0,
                "latency_ms": {"realtime": {"p50": 80.0, "p95": 150.0, "p99": 190.0}},
                "sent_by_lane": {"realtime": sent, "standard": 0, "bulk": 0},
                "on_time": {"realtime": on_time}, "expired": {"realtime": expired},
                "deadlines_ms": {"realtime": 200}, "realtime_path_ms": legs,
                "realtime_expired_after_ms": {"n": float(expired), "p99": after_p99}}  # fmt: skip

    report = {
        "modes": {
            "raw": {"phases": [{"phase": "saturate", "throughput": 230.0}]},
            "adaptive": {
                "phases": [burst("burst", 100, 35, 60, 150.0), burst("burst-small", 30, 30, 0, 0.0)]
            },
        }
    }
    good = goodputs(report)
    assert good["burst"]["capacity"] == pytest.approx(39.1)  # 230/s x (200 - 30) ms
    assert good["burst"]["goodput"] == pytest.approx(35 / 39.1)
    assert good["burst-small"]["goodput"] == pytest.approx(1.0)  # 30 of 30, within C
    by_name = {t["target"]: t for t in targets(report)}
    assert (
        by_name["adaptive, the burst of 1000: realtime goodput (on time / min(sent, C))"]["met"]
        is True
    )
    small = by_name["adaptive, a burst of 300 (its realtime within C): realtime expirations"]
    assert small["value"] == 0.0 and small["met"] is True
    after = next(t for t in targets(report) if "creation → expired" in t["target"])
    assert after["value"] == 150.0 and after["goal"] == 200.0 and after["met"] is True
    decided = next(t for t in targets(report) if "expiry decided" in t["target"])
    assert decided["value"] is None and decided["met"] is None  # no failed_at_ms read
    table = markdown(report)
    assert "min(realtime sent, C)" in table
    assert "| burst | 100 | 35 | 39.1 | 200 − 30 | 0.90 |" in table
    # Without raw in the run there is no C, and so no goodput.
    del report["modes"]["raw"]
    assert goodputs(report) == {}
    assert by_name and next(t for t in targets(report) if "goodput" in t["target"])["value"] is None


def test_fleets_split_gives_each_fleet_its_lanes_and_group() -> None:
    envs = split_env(3, 1, "app")
    assert [e["PIPELINE_WORKER_LANES"] for e in envs] == ["realtime", "standard,bulk",
                                                          "standard,bulk"]  # fmt: skip
    assert [e["PIPELINE_WORKER_APP_ID"] for e in envs] == ["app-rt", "app-batch", "app-batch"]
    for bad in (0, 3):  # no realtime fleet, or no batch fleet
        with pytest.raises(ValueError, match="realtime workers"):
            split_env(3, bad, "app")


def test_fleets_table_sets_realtime_beside_the_bulk_drain() -> None:
    def layout(name: str, p99: float, drain: float) -> dict[str, object]:
        return {"phase": f"backlog-{name}", "layout": name, "workers": 2,
                "realtime_workers": 1 if name == "split" else 2, "sent": 1600, "answered": 1600,
                "throughput": 50.0, "backlog_requests": 1500, "drain_s": drain,
                "drained": True, "expired": {"realtime": 0},
                "latency_ms": {"realtime": {"p50": 40.0, "p95": 80.0, "p99": p99}}}  # fmt: skip

    report = {"modes": {"fleets": {"phases": [layout("mixed", 150.0, 10.0),
                                              layout("split", 60.0, 15.0)]}}}  # fmt: skip
    table = markdown(report)
    assert "| mixed | 2 | 40 / 150 | 0 | 10.0 | 150.0 |" in table
    assert "| split | 2 (1) | 40 / 60 | 0 | 15.0 | 100.0 |" in table
