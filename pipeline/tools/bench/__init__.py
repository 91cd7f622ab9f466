"""``pipeline bench``: the pipeline against its baselines, on the real broker.

- :mod:`.workload`: the seeded, pure workload generator (lengths, lanes, Zipf duplicates, rate)
- :mod:`.stats`: percentiles, phase summaries, /proc and /metrics probes
- :mod:`.drive`: sending, collecting answers, the plain confluent-kafka floor loop
- :mod:`.modes`: sync, fixed, adaptive and noop workers (``--workers`` of each)
- :mod:`.alone`: the model alone: raw (sorted by tokens, token-budget batches) and st
  (sentence-transformers' encode)
- :mod:`.faust_floor`: the bare Faust agent of the faust-floor mode
- :mod:`.phases`: one phase against running workers (a workload, after-idle, faust-floor)
- :mod:`.fleets`: one fleet of mixed workers against a realtime fleet and a batch fleet
- :mod:`.run`: phases and modes in order
- :mod:`.goodput`: realtime goodput, on time over what the model could have finished
- :mod:`.feed`: how well the pipeline feeds the device: F, G, U, batches against raw's
- :mod:`.targets`: the issue's targets, each judged within one run
- :mod:`.report`: Markdown, JSON, plots
- :mod:`.soak` (``--soak SECONDS``): one worker under steady load for a long time, with a
  rebalance and a broker restart; :mod:`.soak_report`: its RSS slope, per-minute p99, plot
"""

from pipeline.tools.bench.report import markdown, targets, write_report
from pipeline.tools.bench.run import MODES, BenchConfig, run_bench
from pipeline.tools.bench.stats import percentile, summarize
from pipeline.tools.bench.workload import WORDS, BenchRequest, WorkloadSpec, generate

__all__ = [
    "MODES",
    "WORDS",
    "BenchConfig",
    "BenchRequest",
    "WorkloadSpec",
    "generate",
    "markdown",
    "percentile",
    "run_bench",
    "summarize",
    "targets",
    "write_report",
]
