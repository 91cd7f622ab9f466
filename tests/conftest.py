"""Shared fixtures: one real Kafka broker per test session, unique topics per test.

``kafka_bootstrap`` uses ``KAFKA_BOOTSTRAP_SERVERS`` when it is set and a broker
answers there; otherwise it starts a :class:`pipeline.tools.kafka_local.LocalKafka`
(the same launcher as ``pipeline kafka up``) on free loopback ports with a
temporary data folder, and stops it when the session ends. Nothing is skipped:
tests marked ``kafka`` always run against a real broker, and a test that needs a
broker this session runs itself (``started_kafka``) gets one either way.

A prerequisite outside the code (promtool, root for a tmpfs) is stated with
:func:`support.require` or ``@pytest.mark.requires``: off CI a missing one skips
with its name, on CI (``CI=true``) it fails. On CI hypothesis is derandomised,
with no per-example deadline. No test may import ``pipeline.app`` into this
process (it patches Faust and sets the event loop policy): use a subprocess.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import support
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]
from hypothesis import settings as hypothesis_settings
from support import on_ci, require

from pipeline.settings import Settings, TopicSettings
from pipeline.tools.kafka_local import LocalKafka
from pipeline.tools.registry_local import LocalRegistry, RunningRegistry

if TYPE_CHECKING:
    from pipeline.inference.model import Model

#: Kept here too: test modules import it from conftest.
free_ports = support.free_ports

# On CI every run draws the same examples (a red run reproduces) and no
# example fails for being slow on a loaded runner; elsewhere, hypothesis's own
# defaults. HYPOTHESIS_PROFILE=ci picks the CI one locally.
hypothesis_settings.register_profile("ci", derandomize=True, deadline=None, database=None)
hypothesis_settings.load_profile(
    os.environ.get("HYPOTHESIS_PROFILE") or ("ci" if on_ci() else "default")
)


@pytest.hookimpl(tryfirst=True)  # before any fixture of the test is set up
def pytest_runtest_setup(item: pytest.Item) -> None:
    """``@pytest.mark.requires(condition, what)``: see :func:`support.require`."""
    for mark in item.iter_markers("requires"):
        require(*mark.args)


#: The folders mirror what a test loads: a test in kafka/ carries ``kafka``, one in
#: faults/ carries ``faults``, and ``kafka`` or ``faults`` appears nowhere else, except
#: in these modules, which mix both kinds along no clean line (named by file).
MIXED = frozenset(
    {
        "unit/kafka/test_answer_producer.py",
        "unit/tools/test_cli_errors.py",
        "unit/worker/test_hostile_input.py",
        "kafka/test_commands_options.py",
        "kafka/test_kafka_local.py",
        "kafka/test_security.py",
        "kafka/test_worker_process.py",
    }
)
TESTS = Path(__file__).resolve().parent


def folder_mismatch(item: pytest.Item) -> str | None:
    """Why ``item``'s markers do not match its folder (unit/, kafka/, faults/), or None."""
    rel = item.path.resolve().relative_to(TESTS).as_posix()
    folder = rel.split("/", 1)[0]
    kafka, faults = (item.get_closest_marker(m) is not None for m in ("kafka", "faults"))
    if folder not in ("unit", "kafka", "faults"):
        return "a test module belongs in tests/unit, tests/kafka or tests/faults"
    if rel in MIXED:
        return None
    if folder == "kafka" and not kafka:
        return "a test in tests/kafka needs the kafka marker (or it belongs in tests/unit)"
    if folder == "faults" and not faults:
        return "a test in tests/faults needs the faults marker"
    if folder == "unit" and (kafka or faults):
        return "a test marked kafka or faults belongs in tests/kafka or tests/faults"
    if folder == "kafka" and faults:
        return "a test marked faults belongs in tests/faults"
    return None


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test that loads the real MiniLM (the ``minilm`` fixture) is ``slow``; a test
    whose markers do not match its folder fails collection (:func:`folder_mismatch`)."""
    wrong = []
    for item in items:
        if "minilm" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.slow)
        why = folder_mismatch(item)
        if why:
            wrong.append(f"{item.nodeid}: {why}")
    if wrong:
        raise pytest.UsageError("markers do not match folders:\n" + "\n".join(wrong))


@pytest.fixture(autouse=True)
def _pipeline_app_stays_out() -> Iterator[None]:
    """Importing ``pipeline.app`` patches Faust and sets the event loop policy for the
    whole process: a test that needs it runs it in a subprocess."""
    yield
    assert "pipeline.app" not in sys.modules, (
        "this test imported pipeline.app into the test process; run that part in a subprocess"
    )


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny BERT classifier (tests/tiny_model.py) in a folder shared by the whole run;
    tests only read it."""
    from tiny_model import build_tiny_bert

    return build_tiny_bert(tmp_path_factory.mktemp("tiny-bert"))


@pytest.fixture(scope="session")
def minilm() -> Model:
    """The bundled all-MiniLM-L6-v2, loaded once per pytest run."""
    from pipeline.inference import load_model
    from pipeline.inference.model import Model
    from pipeline.settings import ModelSettings

    model = load_model(ModelSettings(process="off"))
    assert isinstance(model, Model)
    return model


def broker_answers(bootstrap: str, timeout: float = 5.0) -> bool:
    try:
        AdminClient({"bootstrap.servers": bootstrap, "log_level": 0}).list_topics(timeout=timeout)
    except Exception:
        return False
    return True


def local_kafka_for(data_dir: str, **changes: Any) -> LocalKafka:
    """A LocalKafka on fresh free ports in ``data_dir``; the jar cache is shared."""
    port, cport = free_ports(2)
    local = Settings.from_env().local_kafka
    return LocalKafka(
        dataclasses.replace(local, port=port, controller_port=cport, data_dir=data_dir, **changes)
    )


@pytest.fixture(scope="session")
def local_kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalKafka | None]:
    """The broker this session started, or None when KAFKA_BOOTSTRAP_SERVERS is used."""
    external = os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "").strip()
    if external:
        if broker_answers(external):
            yield None
            return
        print(
            f"KAFKA_BOOTSTRAP_SERVERS={external} does not answer; starting a local broker",
            file=sys.stderr,
        )
    broker = local_kafka_for(str(tmp_path_factory.mktemp("kafka")))
    broker.up()
    try:
        yield broker
    finally:
        broker.down()


@pytest.fixture(scope="session")
def started_kafka(
    local_kafka: LocalKafka | None, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LocalKafka]:
    """A LocalKafka this session runs: the session's broker, or (when the session
    uses ``KAFKA_BOOTSTRAP_SERVERS``) one started for the tests that need it."""
    if local_kafka is not None:
        yield local_kafka
        return
    broker = local_kafka_for(str(tmp_path_factory.mktemp("kafka-local")))
    broker.up()
    try:
        yield broker
    finally:
        broker.down()


@pytest.fixture
def make_local_kafka(tmp_path: Path) -> Iterator[Callable[[], LocalKafka]]:
    """``make() -> LocalKafka``: extra brokers (not started) on free ports; stopped after."""
    made: list[LocalKafka] = []

    def make() -> LocalKafka:
        broker = local_kafka_for(str(tmp_path / f"broker{len(made)}"))
        made.append(broker)
        return broker

    yield make
    for broker in made:
        broker.down()


@pytest.fixture(scope="session")
def local_registry() -> LocalRegistry:
    """The Schema Registry server (franz-go's srfake), built once into the cache.
    Without Go (and no cached build) the test skips, or fails on CI."""
    registry = LocalRegistry()
    if not registry.has_binary():
        require(
            shutil.which("go"),
            "go 1.24+ on PATH, to build the local Schema Registry (./run setup builds it)",
        )
        registry.ensure_binary()
    return registry


@pytest.fixture
def schema_registry(local_registry: LocalRegistry) -> Iterator[RunningRegistry]:
    """A fresh, empty Schema Registry on a free loopback port, for one test."""
    with local_registry.start() as running:
        yield running


@pytest.fixture(scope="session")
def kafka_bootstrap(local_kafka: LocalKafka | None) -> str:
    """Bootstrap address of a real, answering Kafka broker."""
    if local_kafka is None:
        return os.environ["KAFKA_BOOTSTRAP_SERVERS"].strip()
    return local_kafka.bootstrap


@pytest.fixture(scope="session")
def kafka_admin(kafka_bootstrap: str) -> AdminClient:
    return AdminClient({"bootstrap.servers": kafka_bootstrap})


def _create(admin: AdminClient, names: list[str], partitions: int) -> None:
    futures = admin.create_topics(
        [NewTopic(n, num_partitions=partitions, replication_factor=1) for n in names],
        operation_timeout=30,
    )
    for future in futures.values():
        future.result(timeout=60)


def _delete(admin: AdminClient, names: list[str]) -> None:
    """Best effort: a test that already deleted a topic must not fail here."""
    if not names:
        return
    for future in admin.delete_topics(names, operation_timeout=10).values():
        with contextlib.suppress(Exception):
            future.result(timeout=15)


@pytest.fixture
def topic_factory(kafka_admin: AdminClient) -> Iterator[Callable[..., str]]:
    """``make(name="topic", partitions=1) -> str``: creates a uniquely named topic.

    The topics are deleted (best effort) when the test ends.
    """
    made: list[str] = []

    def make(name: str = "topic", partitions: int = 1) -> str:
        topic = f"test.{name}.{uuid.uuid4().hex[:10]}"
        _create(kafka_admin, [topic], partitions)
        made.append(topic)
        return topic

    yield make
    _delete(kafka_admin, made)


@pytest.fixture
def unique_topics(kafka_admin: AdminClient) -> Iterator[TopicSettings]:
    """The pipeline's topics under a per-test prefix, created (default partitions)."""
    topics = TopicSettings(prefix=f"t{uuid.uuid4().hex[:10]}.")
    _create(kafka_admin, topics.all_topics(), topics.partitions)
    yield topics
    _delete(kafka_admin, topics.all_topics())


@pytest.fixture
def settings_for(kafka_bootstrap: str) -> Callable[..., Settings]:
    """``settings_for(topics=..., worker=...) -> Settings`` aimed at the test broker."""

    def make(**sections: Any) -> Settings:
        base = Settings.from_env().replace(**sections)
        return base.replace(
            kafka=dataclasses.replace(base.kafka, bootstrap_servers=kafka_bootstrap)
        )

    return make
