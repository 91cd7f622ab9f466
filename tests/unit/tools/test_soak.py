"""``pipeline bench --soak``: its arithmetic, its plot and its readings of this process.
The run itself (a real broker, workers, a restart) is tests/kafka/test_soak_live.py."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from pipeline.cli import main
from pipeline.tools.bench import soak_report
from pipeline.tools.bench.soak import SoakConfig, dir_bytes, open_fds, rss_bytes
from pipeline.tools.bench.soak_report import (
    MIB,
    per_minute,
    plot,
    repeats_by_event,
    slope_per_hour,
    summarise,
    window_p99,
)


def test_slope_is_per_hour_and_flat_or_noisy_flat_series_give_about_nothing() -> None:
    # 1 MiB a minute is 60 MiB an hour.
    assert slope_per_hour([(60.0 * k, 100.0 + k) for k in range(10)]) == pytest.approx(60.0)
    assert slope_per_hour([(10.0 * k, 200.0) for k in range(30)]) == pytest.approx(0.0)
    zigzag = [(10.0 * k, 200.0 + (5.0 if k % 2 else -5.0)) for k in range(360)]
    assert abs(slope_per_hour(zigzag) or 0.0) < 1.0
    assert slope_per_hour([(5.0, 1.0)]) is None
    assert slope_per_hour([(5.0, 1.0), (5.0, 2.0)]) is None


def test_summary_leaves_out_the_warm_up_and_compares_first_and_last_windows() -> None:
    # Grows 100 MiB in the first 300 s, then flat: the slope after warm-up is 0.
    rss = [(t, (300.0 + min(t, 300.0) / 3.0) * MIB) for t in range(0, 1800, 10)]
    first = [(t / 10.0, 50.0 + (t % 100)) for t in range(0, 3000)]  # received 0..300 s
    last = [(1500.0 + t / 10.0, 2.0 * (50.0 + (t % 100))) for t in range(0, 3000)]
    head = summarise(rss, first + last, warmup_s=300.0, duration_s=1800.0)
    assert head["rss_slope_mib_per_hour"] == pytest.approx(0.0, abs=1e-6)
    assert head["rss_slope_met"] is True
    assert head["realtime_p99_ratio"] == pytest.approx(2.0)
    assert head["realtime_p99_flat"] is False
    # Counting the warm-up, the same series slopes upward.
    with_warmup = summarise(rss, first, warmup_s=0.0, duration_s=1800.0)
    assert with_warmup["rss_slope_mib_per_hour"] > 20.0
    assert with_warmup["rss_slope_met"] is False
    assert with_warmup["realtime_p99_ratio"] is None  # nothing in the last window


def test_short_runs_shrink_the_windows_to_a_sixth() -> None:
    head = summarise([], [(1.0, 10.0), (59.0, 30.0)], warmup_s=10.0, duration_s=60.0)
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


def test_events_at_fixed_fractions_and_warm_up_bounded() -> None:
    config = SoakConfig(duration_s=1800.0)
    assert config.events() == [
        (600.0, "worker joins"),
        (900.0, "worker leaves"),
        (1200.0, "broker restart"),
    ]
    assert config.warmup_s == 300.0
    assert SoakConfig(duration_s=7200.0).warmup_s == 300.0
    assert SoakConfig(duration_s=60.0).warmup_s == 10.0


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
    report = {
        "config": {"duration_s": 200.0},
        "offered_rate": 10.0,
        "samples": samples,
        "per_minute": per_minute([(5.0, 10.0)], [], 200.0),
        "events": [{"t_s": 60.0, "event": "worker joins"}],
        "summary": summarise(
            [(s["t_s"], s["rss_bytes"]) for s in samples], [], warmup_s=30.0, duration_s=200.0
        ),
    }
    path = plot(report, tmp_path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert soak_report.RSS_SLOPE_TARGET_MIB_H == 20.0


def test_help_names_the_soak() -> None:
    result = CliRunner().invoke(main, ["bench", "--help"])
    assert result.exit_code == 0
    assert "--soak" in result.output
    bad = CliRunner().invoke(main, ["bench", "--soak", "5"])
    assert bad.exit_code != 0
    assert "30" in bad.output
