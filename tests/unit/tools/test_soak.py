"""``pipeline bench --soak``: its arithmetic, its plot and its readings of this process.
The run itself (a real broker, workers, a restart) is tests/kafka/test_soak_live.py."""

from __future__ import annotations

import datetime as dt
import json
import os
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from pipeline.cli import main
from pipeline.tools.bench import soak_report
from pipeline.tools.bench.soak import SoakConfig
from pipeline.tools.bench.soak_probes import dir_bytes, open_fds, rss_bytes
from pipeline.tools.bench.soak_report import (
    MIB,
    held_partitions,
    latency_summary,
    memory_summary,
    per_minute,
    plot,
    repeats_by_event,
    rereport,
    slope_per_hour,
    store_bound_bytes,
    summarise,
    warmup_at_store_bound,
    window_p99,
)


def _rows(
    duration_s: float,
    *,
    fill_s: float,
    rss_growth_mib: float,
    bound_mib: float,
    after_mib_per_h: float = 0.0,
) -> list[dict[str, Any]]:
    """Samples every 10 s: RSS grows ``rss_growth_mib`` until ``fill_s`` (then by
    ``after_mib_per_h``), the RocksDB folder reaches ``bound_mib`` at ``fill_s``."""
    rows = []
    for t in range(10, int(duration_s) + 1, 10):
        grown = (
            rss_growth_mib * min(t, fill_s) / fill_s + after_mib_per_h * max(t - fill_s, 0) / 3600
        )
        rows.append(
            {
                "t_s": float(t),
                "rss_bytes": (100.0 + grown) * MIB,
                "model_rss_bytes": 300.0 * MIB,
                "rocksdb_bytes": bound_mib * MIB * t / fill_s,
            }
        )
    return rows  # fmt: skip


def test_slope_is_per_hour_and_flat_or_noisy_flat_series_give_about_nothing() -> None:
    # 1 MiB a minute is 60 MiB an hour.
    assert slope_per_hour([(60.0 * k, 100.0 + k) for k in range(10)]) == pytest.approx(60.0)
    assert slope_per_hour([(10.0 * k, 200.0) for k in range(30)]) == pytest.approx(0.0)
    zigzag = [(10.0 * k, 200.0 + (5.0 if k % 2 else -5.0)) for k in range(360)]
    assert abs(slope_per_hour(zigzag) or 0.0) < 1.0
    assert slope_per_hour([(5.0, 1.0)]) is None
    assert slope_per_hour([(5.0, 1.0), (5.0, 2.0)]) is None


def test_the_warm_up_ends_where_the_stores_have_written_their_memory_bound() -> None:
    bound = store_bound_bytes(32, 3)
    assert bound == 96 * MIB
    # The caches fill for 21 minutes (96 MiB of RSS), then stay: the warm-up is found
    # from the folder's size, and the slope after it is flat over the 24 minutes left.
    rows = _rows(2700.0, fill_s=1260.0, rss_growth_mib=96.0, bound_mib=96.0)
    assert warmup_at_store_bound(rows, bound) == 1260.0
    head = memory_summary(rows, bound_bytes=bound, duration_s=2700.0, new_texts=1000.0)
    assert head["warmup_s"] == 1260.0
    assert head["after_warmup_s"] == 1440.0
    assert head["rss_slope_mib_per_hour"] == pytest.approx(0.0, abs=1e-6)
    assert head["rss_slope_met"] is True
    # The first soaks' fixed 5-minute warm-up sees the caches filling.
    assert head["rss_slope_after_fixed_warmup_mib_per_hour"] > 50.0
    assert head["rss_mib"]["first"] == pytest.approx(100.0 + 96.0 * 10 / 1260)
    assert head["rss_mib"]["at_warmup"] == pytest.approx(196.0)
    assert head["model_rss_slope_mib_per_hour"] == pytest.approx(0.0)
    assert head["rocksdb_bytes_per_new_text"] == pytest.approx(2700 / 1260 * 96 * MIB / 1000)
    # Growth that goes on past the bound is reported as it is.
    growing = _rows(2700.0, fill_s=1260.0, rss_growth_mib=96.0, bound_mib=96.0,
                    after_mib_per_h=60.0)  # fmt: skip
    grows = memory_summary(growing, bound_bytes=bound, duration_s=2700.0)
    assert grows["rss_slope_mib_per_hour"] == pytest.approx(60.0)
    assert grows["rss_slope_met"] is False


def test_a_bound_never_reached_or_reached_late_meets_nothing() -> None:
    bound = store_bound_bytes(32, 3)
    never = _rows(1800.0, fill_s=3600.0, rss_growth_mib=96.0, bound_mib=96.0)
    head = memory_summary(never, bound_bytes=bound, duration_s=1800.0)
    assert head["warmup_s"] is None and head["after_warmup_s"] is None
    assert head["rss_slope_mib_per_hour"] is None
    assert head["rss_slope_met"] is False
    # Flat after the bound, but only 10 minutes of it: too short to count.
    late = _rows(1800.0, fill_s=1200.0, rss_growth_mib=96.0, bound_mib=96.0)
    head = memory_summary(late, bound_bytes=bound, duration_s=1800.0)
    assert head["rss_slope_mib_per_hour"] == pytest.approx(0.0, abs=1e-6)
    assert head["rss_slope_met"] is False


def test_latency_summary_compares_first_and_last_windows() -> None:
    first = [(t / 10.0, 50.0 + (t % 100)) for t in range(0, 3000)]  # received 0..300 s
    last = [(1500.0 + t / 10.0, 2.0 * (50.0 + (t % 100))) for t in range(0, 3000)]
    head = latency_summary(first + last, duration_s=1800.0)
    assert head["realtime_p99_ratio"] == pytest.approx(2.0)
    assert head["realtime_p99_flat"] is False
    assert latency_summary(first, duration_s=1800.0)["realtime_p99_ratio"] is None


def test_short_runs_shrink_the_windows_to_a_sixth() -> None:
    head = summarise([], [(1.0, 10.0), (59.0, 30.0)], bound_bytes=MIB, duration_s=60.0)
    assert head["p99_window_s"] == 10.0
    assert head["realtime_p99_first_ms"] == 10.0
    assert head["realtime_p99_last_ms"] == 30.0
    assert head["rss_slope_mib_per_hour"] is None


def test_per_minute_buckets_latencies_and_expirations() -> None:
    lat = [(5.0, 10.0), (30.0, 20.0), (61.0, 100.0), (179.0, 7.0)]
    rows = per_minute(lat, [62.0, 63.0], duration_s=150.0)
    assert [r["t_s"] for r in rows] == [0.0, 60.0, 120.0]
    assert [r["n"] for r in rows] == [2, 1, 1]
    assert [r["expired"] for r in rows] == [0, 2, 0]
    assert rows[1]["p99_ms"] == 100.0
    assert window_p99(lat, 60.0, 120.0) == 100.0
    assert window_p99(lat, 200.0, 300.0) is None


def test_repeats_fall_in_the_stretch_of_the_event_before_them() -> None:
    events = [{"t_s": 600.0, "event": "worker joins"}, {"t_s": 900.0, "event": "worker leaves"}]
    rows = repeats_by_event([10.0, 600.0, 650.0, 950.0, 2000.0], events, end_s=1800.0)
    assert [(r["event"], r["repeated"]) for r in rows] == [
        ("before any event", 1),
        ("worker joins", 2),
        ("worker leaves", 2),  # one after the end: answers of the drain count too
    ]
    assert rows[-1]["to_s"] == 1800.0


def test_events_at_fixed_fractions() -> None:
    config = SoakConfig(duration_s=1800.0)
    assert config.events() == [
        (600.0, "worker joins"),
        (900.0, "worker leaves"),
        (1200.0, "broker restart"),
        (1350.0, "worker joins after the restart"),  # a rebalance after the restart
        (1500.0, "worker leaves after the restart"),
    ]


def test_held_partitions_are_read_from_a_workers_log() -> None:
    t0 = dt.datetime(2026, 12, 6, 9, 16, 0).timestamp() * 1000.0  # local time, as logged
    held = (
        "[2026-12-06 09:16:{s}] [30372] [WARNING] pipeline.worker.start_offsets: "
        "app.inference.requests.{lane}[0]: start offset unknown (BrokerUnavailable: start "
        "offsets of 9 partitions: TimeoutError: ); holding the partition, asking again in 0.5s"
    )
    lines = [
        held.format(s="27,407", lane="realtime"),
        "[2026-12-06 09:16:28,000] [30372] [WARNING] pipeline.observability.stalls: "
        "event loop stalled for 106 ms",
        held.format(s="28,500", lane="bulk"),
        held.format(s="31,250", lane="realtime"),
        "Traceback (most recent call last):",
    ]
    assert held_partitions(lines, t0) == [
        {"partition": "app.inference.requests.realtime[0]", "failures": 2,
         "first_s": 27.4, "last_s": 31.2},
        {"partition": "app.inference.requests.bulk[0]", "failures": 1,
         "first_s": 28.5, "last_s": 28.5},
    ]  # fmt: skip
    assert held_partitions([], t0) == []


def test_readings_of_this_process_and_a_folder(tmp_path: Path) -> None:
    assert (rss_bytes(os.getpid()) or 0) > MIB
    before = open_fds(os.getpid()) or 0
    with open(tmp_path / "a", "wb") as f:
        f.write(b"x" * 1000)
        assert (open_fds(os.getpid()) or 0) == before + 1
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b").write_bytes(b"y" * 500)
    assert dir_bytes(tmp_path) == 1500
    assert dir_bytes(tmp_path / "missing") == 0
    gone = 2**22 + 7  # above the kernel's default pid_max
    assert rss_bytes(gone) is None
    assert open_fds(gone) is None


def test_plot_writes_a_png(tmp_path: Path) -> None:
    samples: list[dict[str, Any]] = [
        {"t_s": 10.0 * k, "rss_bytes": 100 * MIB, "model_rss_bytes": None, "open_fds": 50,
         "rocksdb_bytes": k * 1000, "lag": None}
        for k in range(20)
    ]  # fmt: skip
    report: dict[str, Any] = {
        "config": {"duration_s": 200.0},
        "offered_rate": 10.0,
        "samples": samples,
        "per_minute": per_minute([(5.0, 10.0)], [], 200.0),
        "events": [{"t_s": 60.0, "event": "worker joins"}],
        "summary": summarise(samples, [], bound_bytes=10_000, duration_s=200.0),
    }
    assert report["summary"]["warmup_s"] == 100.0
    path = plot(report, tmp_path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert soak_report.RSS_SLOPE_TARGET_MIB_H == 20.0


def test_a_written_report_is_recomputed_with_the_bound_its_workers_ran_with(
    tmp_path: Path,
) -> None:
    rows = _rows(2700.0, fill_s=630.0, rss_growth_mib=24.0, bound_mib=24.0)
    report = {
        "config": {"duration_s": 2700.0, "dup_rate": 0.05,
                   "worker_env": [["PIPELINE_DEDUPE_STORE_MEMORY_MIB", "8"]]},
        "offered_rate": 51.5, "sent": 2000, "samples": rows, "events": [],
        "per_minute": per_minute([], [], 2700.0),
        "summary": {"warmup_s": 300.0, "rss_slope_mib_per_hour": 9.9,
                    "realtime_p99_first_ms": 12.0},
    }  # fmt: skip
    path = tmp_path / "soak.json"
    path.write_text(json.dumps(report))
    head = rereport(path)["summary"]
    assert head["store_bound_mib"] == 24.0  # 8 MiB x the 3 partitions by default
    assert head["warmup_s"] == 630.0
    assert head["rss_slope_mib_per_hour"] == pytest.approx(0.0, abs=1e-6)
    assert head["realtime_p99_first_ms"] == 12.0  # the latencies' figures stay
    assert json.loads(path.read_text())["summary"] == head
    assert (tmp_path / "soak.png").exists()


def test_help_names_the_soak() -> None:
    result = CliRunner().invoke(main, ["bench", "--help"])
    assert result.exit_code == 0
    assert "--soak" in result.output
    bad = CliRunner().invoke(main, ["bench", "--soak", "5"])
    assert bad.exit_code != 0
    assert "30" in bad.output


def test_the_lag_probe_logs_a_dead_broker_through_logging(
    caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]
) -> None:
    """During the soak's broker restart the lag probe reads nothing, and librdkafka's
    refused connections reach the ``librdkafka`` logger, not stderr raw."""
    import logging

    from conftest import free_ports

    from pipeline.settings import Settings
    from pipeline.tools.bench.soak_probes import Lag

    (port,) = free_ports(1)
    dead = Settings.from_env({"PIPELINE_KAFKA_BOOTSTRAP_SERVERS": f"127.0.0.1:{port}"})
    with caplog.at_level(logging.DEBUG, logger="librdkafka"):
        lag = Lag(dead)
        try:
            assert lag.read() is None
        finally:
            lag.close()
    assert any("Connection refused" in r.getMessage() for r in caplog.records)
    assert "|FAIL|" not in capfd.readouterr().err
