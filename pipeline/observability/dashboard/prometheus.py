"""Prometheus for the dashboard picture: an HTTP API client and a local launcher.

:class:`PrometheusClient` reads ``/api/v1/query`` and ``/api/v1/query_range``;
an unreachable server or a rejected query raises
:class:`~pipeline.errors.ConfigurationError` with Prometheus' own reason.

:class:`LocalPrometheus` runs the ``prometheus`` binary (Debian's package,
which ``./run setup`` installs) on a free loopback port with a config derived
from ``ops/prometheus/prometheus.yml`` (:func:`scrape_config`: the pipeline
job aimed at given targets, the alert rules kept), and stops it, leaving no
process behind. Its data folder is the caller's (a temporary one).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

import yaml

from pipeline.errors import ConfigurationError
from pipeline.tools.supervise import free_port, terminate

__all__ = [
    "PROMETHEUS_YML",
    "LocalPrometheus",
    "PrometheusClient",
    "RawSeries",
    "scrape_config",
]

PROMETHEUS_YML = Path(__file__).resolve().parents[3] / "ops/prometheus/prometheus.yml"

INSTALL_HINT = (
    "install Prometheus: `apt-get install prometheus` on Debian/Ubuntu (./run setup does "
    "this), or unpack a release from https://prometheus.io/download/ and put its "
    "`prometheus` on PATH"
)


@dataclass(frozen=True)
class RawSeries:
    """One series of a query_range answer: its labels and (epoch seconds, value) points."""

    labels: dict[str, str]
    points: list[tuple[float, float]]


@dataclass
class PrometheusClient:
    """Prometheus' HTTP API at ``url`` (``http://host:port``)."""

    url: str
    timeout_s: float = 10.0

    def _get(self, path: str, params: dict[str, str]) -> Any:
        query = urllib.parse.urlencode(params)
        address = f"{self.url.rstrip('/')}{path}?{query}"
        try:
            with urllib.request.urlopen(address, timeout=self.timeout_s) as resp:
                body = json.loads(resp.read())
        except urllib.error.HTTPError as exc:  # 400/422 carry the reason as JSON
            try:
                body = json.loads(exc.read())
            except ValueError:
                raise ConfigurationError(f"Prometheus at {self.url}: HTTP {exc.code}") from exc
        except (OSError, ValueError) as exc:
            raise ConfigurationError(
                f"Prometheus at {self.url} does not answer ({exc}); start it, or pass "
                "--prometheus with the right address"
            ) from exc
        if body.get("status") != "success":
            raise ConfigurationError(
                f"Prometheus rejected {params.get('query')!r}: {body.get('error', body)}"
            )
        return body["data"]

    def ready(self) -> bool:
        """Whether ``/-/ready`` answers 200."""
        try:
            with urllib.request.urlopen(f"{self.url.rstrip('/')}/-/ready", timeout=2) as resp:
                return int(resp.status) == 200
        except OSError:
            return False

    def query(self, expr: str) -> list[dict[str, Any]]:
        """An instant query's result vector."""
        result: list[dict[str, Any]] = self._get("/api/v1/query", {"query": expr})["result"]
        return result

    def query_range(self, expr: str, start: float, end: float, step_s: float) -> list[RawSeries]:
        """Every series of ``expr`` between ``start`` and ``end`` (epoch s); NaN stays NaN."""
        data = self._get(
            "/api/v1/query_range",
            {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step_s:g}"},
        )
        return [
            RawSeries(
                labels=dict(r["metric"]),
                points=[(float(t), float(v)) for t, v in r["values"]],
            )
            for r in data["result"]
        ]


def scrape_config(
    targets: Sequence[str], *, interval_s: float = 1.0, source: Path = PROMETHEUS_YML
) -> dict[str, Any]:
    """``source`` with its ``pipeline`` job scraping ``targets`` (host:port) every
    ``interval_s``, the other jobs dropped and rule files made absolute."""
    try:
        config: dict[str, Any] = yaml.safe_load(source.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigurationError(
            f"{source} not found; run from a source checkout (ops/prometheus/)"
        ) from None
    every = f"{interval_s:g}s"
    config["global"].update(scrape_interval=every, scrape_timeout=every, evaluation_interval=every)
    config["rule_files"] = [str(source.parent / f) for f in config.get("rule_files", [])]
    job = next(j for j in config["scrape_configs"] if j["job_name"] == "pipeline")
    job.pop("dns_sd_configs", None)
    job["static_configs"] = [{"targets": list(targets)}]
    config["scrape_configs"] = [job]
    return config


@dataclass
class LocalPrometheus:
    """A ``prometheus`` process scraping ``targets``; use as a context manager.

    ``workdir`` receives ``prometheus.yml``, ``data/`` and ``prometheus.log``.
    """

    targets: Sequence[str]
    workdir: Path
    interval_s: float = 1.0
    port: int = 0
    start_timeout_s: float = 60.0
    client: PrometheusClient = field(init=False)
    _proc: subprocess.Popen[bytes] | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        self.port = self.port or free_port()
        self.client = PrometheusClient(self.url)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.workdir / "prometheus.log"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def start(self) -> LocalPrometheus:
        """Start it and wait until it is ready; raise ConfigurationError if it cannot start."""
        binary = shutil.which("prometheus")
        if binary is None:
            raise ConfigurationError(f"`prometheus` is not on PATH; {INSTALL_HINT}")
        self.workdir.mkdir(parents=True, exist_ok=True)
        config = self.workdir / "prometheus.yml"
        config.write_text(yaml.safe_dump(scrape_config(self.targets, interval_s=self.interval_s)))
        with open(self.log_path, "wb") as out:
            self._proc = subprocess.Popen(
                [
                    binary,
                    f"--config.file={config}",
                    f"--storage.tsdb.path={self.workdir / 'data'}",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        deadline = time.monotonic() + self.start_timeout_s
        while not self.client.ready():
            if self._proc.poll() is not None:
                raise ConfigurationError(f"prometheus exited at start:\n{self.log()[-3000:]}")
            if time.monotonic() > deadline:
                self.stop()
                raise ConfigurationError(f"prometheus not ready:\n{self.log()[-3000:]}")
            time.sleep(0.3)
        return self

    def wait_for(self, expr: str, timeout_s: float = 30.0) -> list[dict[str, Any]]:
        """The first non-empty answer of ``expr``; TimeoutError (with the log) if none."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            result = self.client.query(expr)
            if result:
                return result
            time.sleep(0.5)
        raise TimeoutError(f"{expr} returned nothing in {timeout_s}s:\n{self.log()[-3000:]}")

    def stop(self) -> None:
        """SIGTERM (Prometheus flushes its head block), SIGKILL after 15 s."""
        proc, self._proc = self._proc, None
        if proc is not None:
            terminate(proc, 15.0, kill_wait_s=5.0)

    def __enter__(self) -> LocalPrometheus:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
