"""``pipeline bench --soak`` for a few seconds: its own broker, a real worker (the tiny
BERT), a second worker joining and leaving, the broker restarted, a worker joining
and leaving again. No timing asserts; the soak's arithmetic is
tests/unit/tools/test_soak.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from pipeline.cli import main


@pytest.mark.kafka
@pytest.mark.slow
def test_a_short_soak_answers_everything_through_its_events_and_writes_the_report(
    tmp_path: Path, tiny_dir: Path
) -> None:
    out = tmp_path / "soak"
    result = CliRunner().invoke(
        main,
        ["bench", "--soak", "45", "--rate", "16", "--out", str(out),
         "--set", f"PIPELINE_MODEL_PATH={tiny_dir}", "--set", "PIPELINE_MODEL_TORCH_THREADS=1"],
        catch_exceptions=False,
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    report = json.loads((out / "soak.json").read_text())
    assert (out / "soak.png").read_bytes()[:4] == b"\x89PNG"
    assert report["offered_rate"] == 8.0  # half of --rate
    assert report["sent"] > 0
    assert report["unanswered"] == 0, report["producer_errors"]
    events = {e["event"]: e for e in report["events"]}
    assert list(events) == [
        "worker joins", "worker leaves", "broker restart",
        "worker joins after the restart", "worker leaves after the restart",
    ]  # fmt: skip
    assert events["worker leaves"]["exit_code"] == 0
    assert events["worker leaves after the restart"]["exit_code"] == 0
    assert "down_s" in events["broker restart"]  # its own broker, restarted
    # One entry per worker's log (the first worker, then each joiner's own), each read.
    held = report["held_partitions"]
    assert len(held) == 3 and all(isinstance(rows, list) for rows in held.values()), held
    assert not (out / "work").exists()  # the broker's and workers' folders are gone
    samples = report["samples"]
    assert len(samples) >= 3
    assert all(s["rss_bytes"] > 0 and s["open_fds"] > 0 for s in samples)
    assert samples[-1]["rocksdb_bytes"] > 0
    assert samples[-1]["lag"] is not None
    head = report["summary"]
    # 45 s never fills the stores' 96 MiB bound: no warm-up's end, so no slope to count.
    assert head["store_bound_mib"] == 96.0
    assert head["warmup_s"] is None and head["rss_slope_mib_per_hour"] is None
    assert head["rss_slope_met"] is False
    assert head["rss_slope_after_fixed_warmup_mib_per_hour"] is not None
    by_event = report["repeated_by_event"]
    assert sum(row["repeated"] for row in by_event) == report["repeated_answers"]
    assert sum(m["n"] for m in report["per_minute"]) > 0
