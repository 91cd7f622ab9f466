"""A single-node Apache Kafka broker (KRaft, broker+controller) without Docker.

The broker's jars come from Maven Central through ``ops/kafka/pom.xml``
(``mvn dependency:copy-dependencies``) and are cached per version under
``cache_dir/<version>/lib``. ``up()`` writes ``server.properties`` and a log4j2
configuration into ``data_dir``, formats the storage once, starts the JVM in
its own session (it outlives the command that started it) and waits until the
client port answers a metadata request. ``down()`` sends SIGTERM (a clean
shutdown) and SIGKILL only after a timeout. Needs ``java`` (17+) and ``mvn``.
The optional SASL_PLAINTEXT / SASL_SSL listeners: :mod:`pipeline.tools.kafka_local_security`.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pipeline.errors import BrokerUnavailable, ConfigurationError
from pipeline.settings import LocalKafkaSettings
from pipeline.tools.kafka_local_security import (
    listener_properties,
    scram_format_args,
    security_listeners,
)

__all__ = ["POM", "LocalKafka"]

#: The Maven descriptor that resolves the broker (kept next to the package).
POM = Path(__file__).resolve().parents[2] / "ops" / "kafka" / "pom.xml"

_SERVER_PROPERTIES = """\
# Written by pipeline.tools.kafka_local on every start; edits are overwritten.
process.roles=broker,controller
node.id=1
controller.quorum.bootstrap.servers=127.0.0.1:{cport}
listeners={listeners},CONTROLLER://127.0.0.1:{cport}
advertised.listeners={listeners}
controller.listener.names=CONTROLLER
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT,\
SASL_PLAINTEXT:SASL_PLAINTEXT,SASL_SSL:SASL_SSL
inter.broker.listener.name=PLAINTEXT
log.dirs={logs}
num.partitions=1
offsets.topic.replication.factor=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
group.initial.rebalance.delay.ms=0
"""

_LOG4J2 = """\
# Written by pipeline.tools.kafka_local: WARN and above, to {log}.
status = error
appender.file.type = File
appender.file.name = FILE
appender.file.fileName = {log}
appender.file.append = true
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = WARN
rootLogger.appenderRef.file.ref = FILE
"""


_APPEND = os.O_WRONLY | os.O_CREAT | os.O_APPEND

#: Run as ``python -c`` by ``_wait_ready``: exits 0 once the broker answers metadata.
_METADATA_CHECK = """\
import sys
from confluent_kafka.admin import AdminClient
AdminClient({"bootstrap.servers": sys.argv[1], "log_level": 0}).list_topics(timeout=5)
"""


def _pid_alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie child of ours is reaped, not counted)."""
    with contextlib.suppress(ChildProcessError):
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done == pid:
            return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _port_in_use(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


def _port_open(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def _cluster_id() -> str:
    """A Kafka ``Uuid`` in its base64url form (what ``StorageTool random-uuid`` prints)."""
    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not text.startswith("-"):
            return text


def _tool(name: str, install: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise ConfigurationError(f"`{name}` is not on PATH; install {install} and retry")
    return path


class LocalKafka:
    """One local broker, identified by its ``data_dir`` (which holds its pid file)."""

    def __init__(self, settings: LocalKafkaSettings) -> None:
        self.settings = settings
        self.port = settings.port
        self.controller_port = settings.controller_port or settings.port + 1
        self.data_dir = Path(settings.data_dir).expanduser().resolve()
        self.lib_dir = Path(settings.cache_dir).expanduser().resolve() / settings.version / "lib"
        self.pid_file = self.data_dir / "broker.pid"
        self.log_file = self.data_dir / "broker.log"

    @property
    def bootstrap(self) -> str:
        """The PLAINTEXT listener (always there; also the brokers' own)."""
        return f"127.0.0.1:{self.port}"

    @property
    def sasl_bootstrap(self) -> str | None:
        """The SASL_PLAINTEXT listener, when ``sasl_port`` is set."""
        return f"127.0.0.1:{self.settings.sasl_port}" if self.settings.sasl_port else None

    @property
    def tls_bootstrap(self) -> str | None:
        """The SASL_SSL listener, when ``tls_port`` is set."""
        return f"127.0.0.1:{self.settings.tls_port}" if self.settings.tls_port else None

    def _server_properties(self, logs: Path) -> str:
        s = self.settings
        listeners = [f"PLAINTEXT://127.0.0.1:{self.port}"]
        listeners += [f"{name}://127.0.0.1:{port}" for name, port in security_listeners(s)]
        text = _SERVER_PROPERTIES.format(
            listeners=",".join(listeners), cport=self.controller_port, logs=logs
        )
        return text + "".join(f"{k}={v}\n" for k, v in listener_properties(s).items())

    # -- jars ---------------------------------------------------------------

    def has_jars(self) -> bool:
        return any(self.lib_dir.glob("kafka_2.13-*.jar"))

    def ensure_jars(self) -> Path:
        """Resolve the broker's jars into the cache once; returns the lib folder."""
        if self.has_jars():
            return self.lib_dir
        mvn = _tool("mvn", "Apache Maven 3.6+ (e.g. `apt-get install maven`)")
        _tool("java", "a Java 17+ runtime (e.g. `apt-get install openjdk-17-jre-headless`)")
        if not POM.is_file():
            raise ConfigurationError(
                f"{POM} is missing; run from a source checkout (pip install -e .)"
            )
        self.lib_dir.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".lib-", dir=self.lib_dir.parent))
        try:
            cmd = [
                mvn,
                "-q",
                "-B",
                "-f",
                str(POM),
                "dependency:copy-dependencies",
                f"-DoutputDirectory={tmp}",
                f"-Dkafka.version={self.settings.version}",
            ]
            done = subprocess.run(cmd, capture_output=True, text=True, check=False)
            if done.returncode != 0 or not any(tmp.glob("kafka_2.13-*.jar")):
                tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-20:])
                raise ConfigurationError(
                    f"could not resolve Kafka {self.settings.version} from Maven Central "
                    f"(needs network access or a filled ~/.m2):\n{tail}"
                )
            try:
                tmp.rename(self.lib_dir)
            except OSError:
                if not any(self.lib_dir.glob("kafka_2.13-*.jar")):
                    raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return self.lib_dir

    # -- lifecycle ----------------------------------------------------------

    def read_pid(self) -> int | None:
        """The pid of this data dir's broker while it runs, else None."""
        try:
            pid = int(self.pid_file.read_text().strip())
        except (OSError, ValueError):
            return None
        cmdline = Path(f"/proc/{pid}/cmdline")
        with contextlib.suppress(OSError):  # guard against a reused pid (Linux)
            if b"kafka.Kafka" not in cmdline.read_bytes():
                return None
        return pid if _pid_alive(pid) else None

    def up(self) -> str:
        """Start the broker (or find it running) and return its bootstrap address."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        with self._lock():
            pid = self.read_pid()
            if pid is not None:
                self._wait_ready(pid)
                return self.bootstrap
            self.pid_file.unlink(missing_ok=True)
            s = self.settings
            for port in filter(None, (self.port, self.controller_port, s.sasl_port, s.tls_port)):
                if _port_in_use(port):
                    raise ConfigurationError(
                        f"port {port} on 127.0.0.1 is taken by another process; stop it or "
                        "pick free ports (--port, PIPELINE_LOCAL_KAFKA_PORT / _CONTROLLER_PORT)"
                    )
            java = self._java()
            lib = self.ensure_jars()
            config = self.data_dir / "server.properties"
            log4j = self.data_dir / "log4j2.properties"
            logs = self.data_dir / "logs"
            config.touch(mode=0o600)  # it may hold PLAIN passwords and the TLS key
            config.chmod(0o600)
            config.write_text(self._server_properties(logs))
            log4j.write_text(_LOG4J2.format(log=self.log_file))
            base = [java, f"-Dlog4j2.configurationFile={log4j}", "-cp", f"{lib}/*"]
            if not (logs / "meta.properties").exists():
                cmd = [
                    *base,
                    "kafka.tools.StorageTool",
                    "format",
                    "--standalone",
                    "-t",
                    _cluster_id(),
                    "-c",
                    str(config),
                    *scram_format_args(s),
                ]
                done = subprocess.run(cmd, capture_output=True, text=True, check=False)
                if done.returncode != 0:
                    raise ConfigurationError(
                        f"formatting {logs} failed:\n{done.stdout}{done.stderr}".rstrip()
                    )
            argv = [
                java,
                f"-Xmx{self.settings.heap}",
                "-XX:+ExitOnOutOfMemoryError",
                "-Djava.awt.headless=true",
                *base[1:],
                "kafka.Kafka",
                str(config),
            ]
            # posix_spawn, not Popen: no Popen object whose finaliser warns while the
            # broker runs on; setsid so that it outlives this process and its terminal.
            pid = os.posix_spawn(
                java,
                argv,
                os.environ,
                file_actions=[
                    (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
                    (os.POSIX_SPAWN_OPEN, 1, str(self.log_file), _APPEND, 0o644),
                    (os.POSIX_SPAWN_DUP2, 1, 2),
                ],
                setsid=True,
            )
            self.pid_file.write_text(f"{pid}\n")
            try:
                self._wait_ready(pid)
            except BrokerUnavailable:
                self._stop(pid, timeout=0)
                self.pid_file.unlink(missing_ok=True)
                raise
            return self.bootstrap

    def down(self, timeout: float = 30.0) -> bool:
        """Stop the broker; True when one was running. No process is left behind."""
        with self._lock():
            pid = self.read_pid()
            if pid is not None:
                self._stop(pid, timeout)
            self.pid_file.unlink(missing_ok=True)
            return pid is not None

    def status(self) -> dict[str, Any]:
        pid = self.read_pid()
        return {
            "running": pid is not None,
            "pid": pid,
            "bootstrap": self.bootstrap,
            "sasl_bootstrap": self.sasl_bootstrap,
            "tls_bootstrap": self.tls_bootstrap,
            "answering": pid is not None and _port_open(self.port),
            "data_dir": str(self.data_dir),
            "version": self.settings.version,
        }

    def log_tail(self, lines: int = 30) -> str:
        try:
            text = self.log_file.read_text(errors="replace")
        except OSError:
            return "(no broker log)"
        return "\n".join(text.splitlines()[-lines:])

    # -- internals ----------------------------------------------------------

    @contextlib.contextmanager
    def _lock(self) -> Iterator[None]:
        """Serialise up/down on one data dir across processes."""
        with (self.data_dir / ".lock").open("a") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)

    def _java(self) -> str:
        java = _tool("java", "a Java 17+ runtime (e.g. `apt-get install openjdk-17-jre-headless`)")
        done = subprocess.run([java, "-version"], capture_output=True, text=True, check=False)
        found = re.search(r'version "(\d+)(?:\.(\d+))?', done.stderr + done.stdout)
        if found:
            major = int(found.group(1))
            major = int(found.group(2) or 0) if major == 1 else major
            if major < 17:
                raise ConfigurationError(
                    f"Kafka {self.settings.version} needs Java 17+, found Java {major} at {java}"
                )
        return java

    def _wait_ready(self, pid: int) -> None:
        """Poll until the broker answers a metadata request, or fail with its log.

        The request is made by a child process: librdkafka can abort the process
        that polls a broker while it restarts (seen in the fault tests), and that
        must never take the caller down. Every wait is bounded by the deadline.
        """
        deadline = time.monotonic() + self.settings.start_timeout_s
        while time.monotonic() < deadline:
            if not _pid_alive(pid):
                raise BrokerUnavailable(
                    f"the broker (pid {pid}) exited during start-up; its log "
                    f"{self.log_file} ends with:\n{self.log_tail()}"
                )
            if _port_open(self.port):
                timeout = max(1.0, min(20.0, deadline - time.monotonic()))
                with contextlib.suppress(subprocess.TimeoutExpired):
                    check = [sys.executable, "-c", _METADATA_CHECK, self.bootstrap]
                    done = subprocess.run(check, capture_output=True, timeout=timeout, check=False)
                    if done.returncode == 0:
                        return
            time.sleep(0.25)
        raise BrokerUnavailable(
            f"the broker did not answer on {self.bootstrap} within "
            f"{self.settings.start_timeout_s:g} s (raise PIPELINE_LOCAL_KAFKA_START_TIMEOUT_S "
            f"if the machine is slow); its log {self.log_file} ends with:\n{self.log_tail()}"
        )

    def _stop(self, pid: int, timeout: float) -> None:
        for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 10.0)):
            if timeout <= 0 and sig == signal.SIGTERM:
                continue
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, sig)
            deadline = time.monotonic() + wait
            while time.monotonic() < deadline:
                if not _pid_alive(pid):
                    return
                time.sleep(0.1)
        raise BrokerUnavailable(f"the broker (pid {pid}) did not stop, even after SIGKILL")
