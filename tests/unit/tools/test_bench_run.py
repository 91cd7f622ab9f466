"""What ``pipeline bench``'s flags become (commands/bench_run.py): a flag left out keeps
the config's default, an accelerator gets its larger budgets and phases."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from click.testing import CliRunner

from pipeline.cli import main
from pipeline.tools.bench.run import BenchConfig
from pipeline.tools.commands.bench_run import (
    ACCELERATOR_BACKLOG,
    ACCELERATOR_REQUESTS,
    modes_config,
)


def _flags(**given: Any) -> dict[str, Any]:
    """Every flag as the command passes it when none is given on the command line."""
    left_out: dict[str, Any] = dict.fromkeys(
        ["requests", "noop_requests", "duration", "device", "burst_requests",
         "burst_small_requests", "backlog_requests", "backlog_max_s", "idle_requests", "idle_s"]
    )  # fmt: skip
    return {
        "quick": False, "modes": ("adaptive",), "rate": 0.0, "loads": (), "dup_rate": 0.2,
        "seed": 7, "out": Path("bench-out"), "sim_profile": "eager", "fixed_batch": 32,
        "fixed_wait_ms": 20, "threads": (), "workers": 1, "fleet_realtime_workers": 1,
        "worker_env": (), **left_out, **given,
    }  # fmt: skip


def test_flags_left_out_keep_the_configs_defaults() -> None:
    config = modes_config(**_flags())
    default = BenchConfig()
    assert (config.requests, config.loads, config.duration_s) == (
        default.requests, default.loads, default.duration_s,
    )  # fmt: skip
    assert config.modes == ("adaptive",)
    quick = modes_config(**_flags(quick=True, loads=(0.5,), idle_s=2.0))
    assert quick.requests == BenchConfig.quick().requests
    assert (quick.loads, quick.idle_s) == ((0.5,), 2.0)


def test_an_accelerator_sends_more_requests_unless_n_says() -> None:
    sim = modes_config(**_flags(device="sim"))
    assert sim.requests == ACCELERATOR_REQUESTS
    assert sim.backlog_requests == ACCELERATOR_BACKLOG > BenchConfig().backlog_requests
    assert modes_config(**_flags(device="sim", backlog_requests=300)).backlog_requests == 300
    assert modes_config(**_flags(device="sim", quick=True)).backlog_requests == (
        BenchConfig.quick().backlog_requests
    )
    assert sim.raw_budgets == (2048, 4096, 8192, 16384)
    assert modes_config(**_flags(device="cuda", requests=100)).requests == 100
    assert modes_config(**_flags(device="cuda", quick=True)).st_sizes == (32,)


def test_the_soak_help_reads_as_text() -> None:
    result = CliRunner().invoke(main, ["bench", "--help"])
    assert result.exit_code == 0
    text = " ".join(result.output.split())
    assert "at 50 % of its saturated throughput" in text  # not "50 %%"
    assert "joining at 3/4 and leaving at 5/6" in text
