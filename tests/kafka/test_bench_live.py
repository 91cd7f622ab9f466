"""``pipeline bench`` on the real broker (kafka): a quick smoke run, workers side by side,
and the producer connecting before the clock starts. No timing asserts anywhere; the
workload generator and report math are in tests/unit/tools/test_bench.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from confluent_kafka.admin import AdminClient

from pipeline.cli import main

# -- the quick bench on the real broker --------------------------------------------


@pytest.mark.kafka
@pytest.mark.slow
def test_quick_bench_answers_everything_and_writes_the_report(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    out = tmp_path / "bench"
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    before = set(admin.list_topics(timeout=10).topics)
    result = CliRunner().invoke(
        main,
        [
            "bench",
            "--quick",
            "--modes",
            "noop,adaptive,faust-floor",
            "--bootstrap",
            kafka_bootstrap,
            "--out",
            str(out),
            "--set",
            "PIPELINE_SCHEDULER_FLOW_THRESHOLD=0.3",
        ],
        catch_exceptions=False,
    )
    assert result.exit_code == 0, result.output
    # Each mode's topics, and Faust's, are gone with it (no --keep-topics).
    left = set(admin.list_topics(timeout=10).topics) - before
    assert not {t for t in left if t.startswith(("bench-", "pipeline-bench-"))}, left
    report = json.loads((out / "bench.json").read_text())
    assert set(report) >= {"config", "machine", "modes", "targets", "elapsed_s"}
    for mode in ("noop", "adaptive"):  # --set reaches every pipeline worker, and the report
        assert report["modes"][mode]["env"]["PIPELINE_SCHEDULER_FLOW_THRESHOLD"] == "0.3"
    assert set(report["modes"]) == {"noop", "adaptive", "faust-floor"}
    phases = {p["phase"] for p in report["modes"]["adaptive"]["phases"]}
    assert phases == {"saturate", "load-80", "dup-0", "dup-50", "burst", "burst-small", "backlog"}
    backlog = report["modes"]["adaptive"]["phases"][-1]
    assert backlog["phase"] == "backlog" and backlog["drained"] is True
    assert backlog["answered_by_lane"]["bulk"] == backlog["backlog_requests"] == 100
    assert backlog["answered_by_lane"]["realtime"] >= 1 and backlog["drain_s"] > 0
    noop_phases = [p["phase"] for p in report["modes"]["noop"]["phases"]]
    assert noop_phases == ["saturate", "dup-0", "after-idle"]
    idle = report["modes"]["noop"]["phases"][2]
    assert idle["answered_by_lane"]["realtime"] == idle["sent"] == 3
    assert len(idle["latencies_ms"]) == 3
    floor = report["modes"]["faust-floor"]["phases"][0]
    assert floor["answered"] == floor["sent"] == 400 and floor["throughput"] > 0
    for mode in report["modes"].values():
        if mode["mode"] == "faust-floor":  # raw copies: no lanes, no latency
            continue
        for p in mode["phases"]:
            assert p["unanswered"] == 0 and p["answered"] == p["sent"], (mode["mode"], p)
            assert {"throughput", "latency_ms", "served", "cpu_util", "peak_rss_bytes"} <= set(p)
            if p["phase"] == "saturate":  # the model process's cores: adaptive has one
                has_model = mode["mode"] == "adaptive"
                assert (p["model_cpu_util"] is not None) == has_model, (mode["mode"], p)
            assert set(p["latency_ms"]) == {"realtime", "standard", "bulk", "all"}
    table = (out / "bench.md").read_text()
    assert "| noop | saturate |" in table and "| target | measured |" in table
    assert "ran with `PIPELINE_SCHEDULER_FLOW_THRESHOLD=0.3` (--set)" in table
    assert "| adaptive | burst |" in table and "| noop | after-idle |" in table
    assert "| adaptive | backlog |" in table and "Backlog (adaptive): 100 bulk" in table
    for png in ("latency_vs_load.png", "adaptive_timeline.png"):
        assert (out / png).read_bytes()[:4] == b"\x89PNG"


@pytest.mark.kafka
@pytest.mark.slow
def test_quick_bench_on_the_simulated_device_reports_the_feed(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    """--device sim: raw and every worker run the simulated device of this run (its
    own file under --out, its profile from --sim-profile), and the report carries
    the feed: F, G, U, the backlog's batches against raw's best, both processes'
    memory."""
    out = tmp_path / "bench"
    result = CliRunner().invoke(
        main,
        ["bench", "--quick", "--device", "sim", "--sim-profile", "graphed",
         "--modes", "raw,adaptive,noop", "--idle-requests", "0",
         "--bootstrap", kafka_bootstrap, "--out", str(out)],
        catch_exceptions=False,
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    report = json.loads((out / "bench.json").read_text())
    assert report["config"]["device"] == "sim" and report["config"]["sim_profile"] == "graphed"
    (raw,) = report["modes"]["raw"]["phases"]
    assert raw["device"] == "sim" and raw["dtype"] == "sim-graphed"
    assert raw["answered"] == raw["sent"] == 60 and raw["best_budget"] == 4096
    assert raw["best_batch_size"] > 1 and raw["mean_batch_tokens"] <= 4096
    env = report["modes"]["adaptive"]["env"]
    assert env["PIPELINE_MODEL_DEVICE"] == "sim" and env["PIPELINE_MODEL_SIM_PROFILE"] == "graphed"
    assert env["PIPELINE_MODEL_SIM_FILE"] == str((out / "work" / "sim-device").resolve())
    for p in report["modes"]["adaptive"]["phases"]:
        assert p["answered"] == p["sent"] and p["unanswered"] == 0, p
    feed = report["feed"]
    assert feed["device"] == "sim" and feed["sim_profile"] == "graphed"
    assert feed["F"] > 0 and feed["F_base"] in ("raw", "noop")
    # F0 (context): over noop's own 0 % repeats phase, adaptive's dup-0 texts
    noop_unique = [p for p in report["modes"]["noop"]["phases"] if p["phase"] == "dup-0"]
    assert feed["noop_unique"] == noop_unique[0]["throughput"] and feed["F0"] > 0
    assert noop_unique[0]["served"].get("stored", 0) == 0
    assert feed["model_forward_s"] > 0 and 0 <= feed["G"] <= 1
    assert 0 < feed["U"] <= 1 and feed["U_source"] == "simulated device's counter"
    assert feed["backlog_batch"] >= 1 and feed["raw_best_batch"] == raw["best_batch_size"]
    assert feed["batch_ratio"] == feed["backlog_batch"] / raw["best_batch_size"]
    # sim runs the model in a process of its own (PIPELINE_MODEL_PROCESS=auto): found and read
    assert feed["worker_rss_gib"] > 0 and feed["model_rss_gib"] > 0
    assert feed["st"] is None
    names = {t["target"] for t in report["targets"]}
    assert "F (sim, graphed profile): adaptive at 0 % repeats / min(raw, noop)" in names
    table = (out / "bench.md").read_text()
    assert "Feed (sim, graphed profile): F = " in table and "U = " in table
    assert "sentence-transformers' encode: n/a on the simulated device" in table


@pytest.mark.kafka
@pytest.mark.slow
def test_workers_side_by_side_share_the_partitions_and_answer_everything(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    """--workers 2: both workers of a mode join one group and hold partitions
    (the bench waits for that before its clock starts), and every request is
    answered by one of them."""
    out = tmp_path / "bench"
    result = CliRunner().invoke(
        main,
        ["bench", "--quick", "--modes", "noop,faust-floor", "--workers", "2",
         "--idle-requests", "0", "--bootstrap", kafka_bootstrap, "--out", str(out)],
        catch_exceptions=False,
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    report = json.loads((out / "bench.json").read_text())
    assert report["config"]["workers"] == 2
    # No dup-0 phase for noop: it is F0's context beside adaptive, which did not run.
    assert [p["phase"] for p in report["modes"]["noop"]["phases"]] == ["saturate"]
    for mode in ("noop", "faust-floor"):
        for p in report["modes"][mode]["phases"]:
            assert p["workers"] == 2 and p["answered"] == p["sent"], (mode, p)
    assert "2 worker processes side by side" in (out / "bench.md").read_text()


@pytest.mark.kafka
def test_the_bench_producer_connects_before_its_clock_starts(kafka_bootstrap: str) -> None:
    """A phase's first requests must not carry the producer's connection set-up
    (100-500 ms measured): ``connect`` does it up front, or says the broker is gone."""
    from pipeline.errors import BrokerUnavailable
    from pipeline.kafka.client import RequestProducer
    from pipeline.kafka.topics import create_topics
    from pipeline.settings import Settings

    live = Settings.from_env(
        {"PIPELINE_KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap, "PIPELINE_TOPICS_PREFIX": "connect."}
    )
    create_topics(live)
    RequestProducer(live).connect(timeout_s=10)  # the constructor connected; again is harmless
    dead = Settings.from_env({"PIPELINE_KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:1"})
    with pytest.raises(BrokerUnavailable, match=r"no broker answered within 1\.0s"):
        RequestProducer(dead, connect_timeout_s=1.0)
