"""The benchmark's thread-budget sweep: parsing, the report table, and one real probe.

Unit tier: no broker. The probe runs the bundled model in a child process on
a handful of texts; nothing asserts on timing, only on what was measured.
"""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from pipeline.cli import main
from pipeline.tools.bench import markdown
from pipeline.tools.bench.threads import ThreadSetting, parse_settings, raw_threads


def test_settings_parse_into_worker_variables() -> None:
    assert parse_settings(" 1, 2:0 ,1:1:-1") == ("1", "2:0", "1:1:-1")
    assert ThreadSetting("1").env() == {"PIPELINE_MODEL_TORCH_THREADS": "1"}
    assert ThreadSetting("2:0").env() == {
        "PIPELINE_MODEL_TORCH_THREADS": "2",
        "PIPELINE_MODEL_TOKENIZER_THREADS": "0",
    }
    assert ThreadSetting("1:1:-1").env()["PIPELINE_SCHEDULER_HANDOVER_MS"] == "-1.0"


@pytest.mark.parametrize("bad", ["x", "1:y", "-1", "1:-2", "1:1:1:1", ":"])
def test_bad_settings_are_refused(bad: str) -> None:
    with pytest.raises(ValueError, match="expected T"):
        ThreadSetting(bad)


def test_cli_refuses_a_bad_sweep_before_starting_anything() -> None:
    result = CliRunner().invoke(main, ["bench", "--threads", "1,two"])
    assert result.exit_code == 2
    assert "--threads" in result.output and "'two'" in result.output


def test_report_shows_each_setting_against_the_first() -> None:
    def row(spec: str, adaptive: float) -> dict[str, object]:
        raw = {"torch_threads": 1, "tokenizer_threads": 1, "serial": 50.0, "pipelined": 55.0}
        return {
            "setting": spec,
            "raw": raw,
            "adaptive": adaptive,
            "adaptive_cpu": 1.5,
            "adaptive_per_core": adaptive / 1.5,
            "adaptive_realtime_p99_ms": 120.0,
        }

    report = {"modes": {}, "threads": [row("1:1", 40.0), row("2:0", 30.0)]}
    text = markdown(report)
    assert "| threads T:K[:H] |" in text
    assert "| 2:0 | 1 / 1 | 50.0 | 55.0 | 30.0 | 0.75 | 1.50 | 20.0 | 0.75 | 120 |" in text


def test_probe_measures_the_model_alone_under_the_setting() -> None:
    texts = [f"text number {i} " + "word " * (i % 7) for i in range(24)]
    result = raw_threads(ThreadSetting("1:1"), texts, size=8, env={})
    assert result["torch_threads"] == 1 and result["tokenizer_threads"] == 1
    assert result["texts"] == 24 and result["batch_size"] == 8
    assert result["serial"] > 0 and result["pipelined"] > 0
