"""Secure connections (pipeline.kafka.security): SASL and TLS for every Kafka client.

Unit tests check the options each client library gets and that secrets stay
hidden; the kafka tests run a real broker with a SCRAM/PLAIN listener (users
added when its storage is formatted) and a SASL_SSL listener whose CA, server
and client certificates are made here with the openssl command.
"""

from __future__ import annotations

import dataclasses
import ssl
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner
from confluent_kafka import Consumer
from conftest import local_kafka_for
from harness import Deployment
from support import free_ports

from pipeline.cli import main
from pipeline.errors import AuthenticationFailed, ConfigurationError
from pipeline.kafka.client import RequestProducer, read_answers
from pipeline.kafka.security import client_config, faust_credentials, security_env
from pipeline.kafka.topics import create_topics
from pipeline.settings import LocalKafkaSettings, Secret, Settings
from pipeline.tools.bench.drive import floor_loop
from pipeline.tools.kafka_local import LocalKafka

PASSWORD = "s3cret-alice-pw"


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


def _signed(d: Path, name: str, ca: str, subject: str, san: str | None = None) -> None:
    key, csr, pem = (str(d / f"{name}.{ext}") for ext in ("key", "csr", "pem"))
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", csr, "-subj", subject)
    extra: list[str] = []
    if san:
        (d / f"{name}.ext").write_text(f"subjectAltName={san}\n")
        extra = ["-extfile", str(d / f"{name}.ext")]
    ca_pem, ca_key = str(d / f"{ca}.pem"), str(d / f"{ca}.key")
    _openssl("x509", "-req", "-in", csr, "-CA", ca_pem, "-CAkey", ca_key, "-CAcreateserial",
             "-out", pem, "-days", "2", *extra)  # fmt: skip


def make_certs(d: Path) -> Path:
    """ca (signs the broker's and alice's certificates) and other-ca (signs nothing)."""
    d.mkdir(parents=True, exist_ok=True)
    for ca in ("ca", "other-ca"):
        _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(d / f"{ca}.key"),
                 "-out", str(d / f"{ca}.pem"), "-days", "2", "-subj", f"/CN=test {ca}")  # fmt: skip
    _signed(d, "server", "ca", "/CN=localhost", san="DNS:localhost,IP:127.0.0.1")
    _signed(d, "client", "ca", "/CN=alice")
    return d


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_certs(tmp_path_factory.mktemp("certs"))


@pytest.fixture(scope="module")
def secure_broker(tmp_path_factory: pytest.TempPathFactory, certs: Path) -> Iterator[LocalKafka]:
    """A broker with PLAINTEXT, SASL_PLAINTEXT and SASL_SSL (client certificates required)."""
    sasl_port, tls_port = free_ports(2)
    broker = local_kafka_for(
        str(tmp_path_factory.mktemp("secure-kafka")),
        sasl_port=sasl_port,
        tls_port=tls_port,
        users=Secret(f"alice:{PASSWORD},bob:bob-pw"),
        tls_cert_file=str(certs / "server.pem"),
        tls_key_file=str(certs / "server.key"),
        tls_ca_file=str(certs / "ca.pem"),
    )
    broker.up()
    try:
        yield broker
    finally:
        broker.down()


def sasl_env(broker: LocalKafka, **overrides: str) -> dict[str, str]:
    assert broker.sasl_bootstrap is not None
    return {
        "PIPELINE_KAFKA_BOOTSTRAP_SERVERS": broker.sasl_bootstrap,
        "PIPELINE_KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
        "PIPELINE_KAFKA_SECURITY_USERNAME": "alice",
        "PIPELINE_KAFKA_SECURITY_PASSWORD": PASSWORD,
        "PIPELINE_TOPICS_PREFIX": f"t{uuid.uuid4().hex[:8]}.",
        **overrides,
    }


def tls_env(broker: LocalKafka, certs: Path, **overrides: str) -> dict[str, str]:
    assert broker.tls_bootstrap is not None
    tls = {
        "PIPELINE_KAFKA_BOOTSTRAP_SERVERS": broker.tls_bootstrap,
        "PIPELINE_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
        "PIPELINE_KAFKA_SECURITY_CA_FILE": str(certs / "ca.pem"),
        "PIPELINE_KAFKA_SECURITY_CERT_FILE": str(certs / "client.pem"),
        "PIPELINE_KAFKA_SECURITY_KEY_FILE": str(certs / "client.key"),
    }
    return sasl_env(broker, **{**tls, **overrides})


def lane_values(settings: Settings, lane: str, count: int) -> list[bytes]:
    """Read ``count`` records of a lane topic with a client built like the pipeline's."""
    consumer = Consumer(
        {**client_config(settings), "group.id": uuid.uuid4().hex, "auto.offset.reset": "earliest"}
    )
    got: list[bytes] = []
    try:
        consumer.subscribe([settings.topics.lane_topic(lane)])
        for _ in range(200):
            msg = consumer.poll(0.5)
            if msg is not None and msg.error() is None:
                got.append(msg.value() or b"")
            if len(got) >= count:
                break
    finally:
        consumer.close()
    return got


# -- unit: settings, options, secrets --------------------------------------------


def test_client_options_per_protocol(certs: Path) -> None:
    plain = Settings.from_env({})
    assert client_config(plain) == {
        "bootstrap.servers": "127.0.0.1:9092",
        "security.protocol": "PLAINTEXT",
    }
    assert faust_credentials(plain.kafka_security) is None
    env = {
        "PIPELINE_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
        "PIPELINE_KAFKA_SECURITY_SASL_MECHANISM": "SCRAM-SHA-256",
        "PIPELINE_KAFKA_SECURITY_USERNAME": "alice",
        "PIPELINE_KAFKA_SECURITY_PASSWORD": PASSWORD,
        "PIPELINE_KAFKA_SECURITY_CA_FILE": str(certs / "ca.pem"),
        "PIPELINE_KAFKA_SECURITY_CERT_FILE": str(certs / "client.pem"),
        "PIPELINE_KAFKA_SECURITY_KEY_FILE": str(certs / "client.key"),
        "PIPELINE_KAFKA_SECURITY_KEY_PASSWORD": "unused",
        "PIPELINE_KAFKA_SECURITY_CHECK_HOSTNAME": "false",
    }
    s = Settings.from_env(env)
    assert client_config(s) == {
        "bootstrap.servers": "127.0.0.1:9092",
        "security.protocol": "SASL_SSL",
        "sasl.mechanisms": "SCRAM-SHA-256",
        "sasl.username": "alice",
        "sasl.password": PASSWORD,
        "ssl.endpoint.identification.algorithm": "none",
        "ssl.ca.location": str(certs / "ca.pem"),
        "ssl.certificate.location": str(certs / "client.pem"),
        "ssl.key.location": str(certs / "client.key"),
        "ssl.key.password": "unused",
    }
    # A worker process started by a command (bench) gets the same section back.
    assert security_env(s) == env
    assert Settings.from_env(security_env(s)).kafka_security == s.kafka_security
    assert security_env(plain) == {}


def test_faust_credentials_carry_sasl_and_tls(certs: Path) -> None:
    sasl = Settings.from_env(
        {
            "PIPELINE_KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
            "PIPELINE_KAFKA_SECURITY_USERNAME": "alice",
            "PIPELINE_KAFKA_SECURITY_PASSWORD": PASSWORD,
        }
    ).kafka_security
    creds = faust_credentials(sasl)
    assert (creds.protocol.value, creds.mechanism.value) == ("SASL_PLAINTEXT", "SCRAM-SHA-512")
    assert (creds.username, creds.password, creds.ssl_context) == ("alice", PASSWORD, None)
    assert PASSWORD not in repr(creds)
    tls = dataclasses.replace(sasl, protocol="SASL_SSL", ca_file=str(certs / "ca.pem"))
    creds = faust_credentials(tls)
    assert creds.protocol.value == "SASL_SSL"
    assert creds.ssl_context.verify_mode == ssl.CERT_REQUIRED
    assert creds.ssl_context.check_hostname is True
    only_tls = dataclasses.replace(tls, protocol="SSL", username="", password=Secret())
    assert faust_credentials(only_tls).protocol.value == "SSL"
    wrong_key = dataclasses.replace(
        only_tls, cert_file=str(certs / "client.pem"), key_file=str(certs / "other-ca.key")
    )
    with pytest.raises(ConfigurationError, match="cannot load the TLS files"):
        faust_credentials(wrong_key)


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"PROTOCOL": "SASL_SSL"}, "SASL_SSL needs PIPELINE_KAFKA_SECURITY_USERNAME and"),
        ({"PROTOCOL": "TLS"}, "PROTOCOL='TLS': expected one of PLAINTEXT, SSL"),
        ({"USERNAME": "alice", "PASSWORD": "x"}, "PLAINTEXT sends no credentials"),
        ({"PROTOCOL": "SSL", "CA_FILE": "/nonexistent/ca.pem"}, "is not a readable file"),
        ({"CA_FILE": __file__}, "PLAINTEXT does not use TLS"),
        ({"PROTOCOL": "SSL", "CERT_FILE": __file__}, "needs both"),
        (
            {
                "PROTOCOL": "SASL_PLAINTEXT",
                "SASL_MECHANISM": "GSSAPI",
                "USERNAME": "a",
                "PASSWORD": "b",
            },
            "SASL_MECHANISM='GSSAPI'",
        ),
    ],
)
def test_bad_security_settings_say_what_to_fix(env: dict[str, str], message: str) -> None:
    full = {f"PIPELINE_KAFKA_SECURITY_{k}": v for k, v in env.items()}
    with pytest.raises(ConfigurationError, match=message):
        Settings.from_env(full)


def test_secrets_never_show() -> None:
    env = {
        "PIPELINE_KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
        "PIPELINE_KAFKA_SECURITY_USERNAME": "alice",
        "PIPELINE_KAFKA_SECURITY_PASSWORD": PASSWORD,
        "PIPELINE_LOCAL_KAFKA_USERS": f"alice:{PASSWORD}",
    }
    s = Settings.from_env(env)
    assert s.kafka_security.password.reveal() == PASSWORD
    assert s.local_kafka.user_list() == [("alice", PASSWORD)]
    for shown in (repr(s), str(s), f"{s.kafka_security}", repr(s.local_kafka)):
        assert PASSWORD not in shown
        assert "'***'" in shown
    assert str(Secret(PASSWORD)) == "***" and repr(Secret()) == "''"
    result = CliRunner().invoke(main, ["settings"], env=env)
    assert result.exit_code == 0, result.output
    assert "PIPELINE_KAFKA_SECURITY_PASSWORD=''" in result.output
    assert PASSWORD not in result.output


def test_local_broker_users_are_checked() -> None:
    with pytest.raises(ConfigurationError, match="a SASL listener needs"):
        LocalKafkaSettings(sasl_port=9093)
    with pytest.raises(ConfigurationError, match="name:password"):
        LocalKafkaSettings(users=Secret('alice:"quoted"'))
    with pytest.raises(ConfigurationError, match="TLS_PORT needs"):
        LocalKafkaSettings(tls_port=9094, users=Secret("alice:pw"))


# -- real broker: the right credentials work ------------------------------------


@pytest.mark.kafka
@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-512", "SCRAM-SHA-256", "PLAIN"])
def test_sasl_admin_producer_and_consumer(secure_broker: LocalKafka, mechanism: str) -> None:
    user, password = ("bob", "bob-pw") if mechanism == "SCRAM-SHA-256" else ("alice", PASSWORD)
    settings = Settings.from_env(
        sasl_env(
            secure_broker,
            PIPELINE_KAFKA_SECURITY_SASL_MECHANISM=mechanism,
            PIPELINE_KAFKA_SECURITY_USERNAME=user,
            PIPELINE_KAFKA_SECURITY_PASSWORD=password,
        )
    )
    status = create_topics(settings)  # the dedupe changelog is shared by app id: may exist
    assert {status[t] for t in settings.topics.all_topics()} == {"created"}
    with RequestProducer(settings) as producer:
        for text in ("one", "two", "three"):
            producer.send(text, lane="bulk")
    assert producer.acked == 3
    assert len(lane_values(settings, "bulk", 3)) == 3


@pytest.mark.kafka
def test_tls_with_client_certificate(secure_broker: LocalKafka, certs: Path) -> None:
    settings = Settings.from_env(tls_env(secure_broker, certs))
    status = create_topics(settings)  # the dedupe changelog is shared by app id: may exist
    assert {status[t] for t in settings.topics.all_topics()} == {"created"}
    with RequestProducer(settings) as producer:
        producer.send("over TLS", lane="realtime")
    assert len(lane_values(settings, "realtime", 1)) == 1


@pytest.mark.kafka
def test_replay_and_bench_clients_connect_the_same_way(secure_broker: LocalKafka) -> None:
    env = sasl_env(secure_broker, PIPELINE_TOPICS_PARTITIONS="1")
    settings = Settings.from_env(env)
    create_topics(settings)
    result = CliRunner().invoke(main, ["replay-dlq", "--dry-run"], env=env)
    assert result.exit_code == 0, result.output
    # The benchmark's floor: its producer, consumer and plain producer over SASL.
    assert floor_loop(settings, ["a", "b", "c"], timeout_s=60) > 0


# -- real broker: wrong credentials fail at once, with one clear line ------------
# AuthenticationFailed is raised only from librdkafka's error callback, never
# after a timeout: getting it with timeouts of minutes shows it did not wait.


@pytest.mark.kafka
@pytest.mark.parametrize(
    ("args", "stdin"),
    [
        (["topics", "create"], None),
        (["produce", "--lane", "bulk"], "a text\nanother\n"),
        (["replay-dlq", "--dry-run", "--connect-timeout", "600"], None),
    ],
)
def test_wrong_password_is_one_clear_line(
    secure_broker: LocalKafka, args: list[str], stdin: str | None
) -> None:
    env = sasl_env(secure_broker, PIPELINE_KAFKA_SECURITY_PASSWORD="wrong")
    result = CliRunner().invoke(main, args, env=env, input=stdin)
    assert result.exit_code == 1, result.output
    assert "Error: AuthenticationFailed: authentication failed" in result.output
    assert "check PIPELINE_KAFKA_SECURITY_USERNAME, PIPELINE_KAFKA_SECURITY_PASSWORD" in (
        result.output
    )
    assert "Traceback" not in result.output


@pytest.mark.kafka
def test_wrong_password_stops_the_producer_long_before_its_timeout(
    secure_broker: LocalKafka,
) -> None:
    settings = Settings.from_env(sasl_env(secure_broker, PIPELINE_KAFKA_SECURITY_PASSWORD="no"))
    with pytest.raises(AuthenticationFailed, match="refused SCRAM-SHA-512 user 'alice'"):
        RequestProducer(settings, connect_timeout_s=600)  # connecting fails at once
    producer = RequestProducer(settings, connect_timeout_s=None)
    producer.send("x", lane="bulk")
    with pytest.raises(AuthenticationFailed, match="refused SCRAM-SHA-512 user 'alice'"):
        producer.flush(timeout_s=600)
    with pytest.raises(AuthenticationFailed):
        list(read_answers(settings, timeout_s=600))


@pytest.mark.kafka
@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"PIPELINE_KAFKA_SECURITY_CA_FILE": "other-ca.pem"}, "TLS handshake with .* failed"),
        (
            {"PIPELINE_KAFKA_SECURITY_CERT_FILE": "", "PIPELINE_KAFKA_SECURITY_KEY_FILE": ""},
            "may require a client certificate",
        ),
    ],
)
def test_tls_failures_are_clear(
    secure_broker: LocalKafka, certs: Path, change: dict[str, str], message: str
) -> None:
    change = {k: str(certs / v) if v else "" for k, v in change.items()}
    settings = Settings.from_env(tls_env(secure_broker, certs, **change))
    with pytest.raises(AuthenticationFailed, match=message):
        create_topics(settings, timeout_s=600)


# -- real worker over SASL_SSL ---------------------------------------------------


@pytest.mark.kafka
@pytest.mark.slow
def test_worker_answers_over_sasl_ssl(
    secure_broker: LocalKafka, certs: Path, tmp_path: Path
) -> None:
    env = tls_env(secure_broker, certs)
    del env["PIPELINE_TOPICS_PREFIX"]  # the deployment picks its own
    dep = Deployment.create(
        env.pop("PIPELINE_KAFKA_BOOTSTRAP_SERVERS"), tmp_path, partitions=1,
        PIPELINE_MODEL_TASK="noop", **env,
    )  # fmt: skip
    with dep.worker() as worker, RequestProducer(dep.settings) as producer:
        sent = {producer.send(f"secure text {i}", lane="standard") for i in range(3)}
        producer.flush()
        answers = dep.answers(expect=3)
        log = worker.log()
    assert {a.record["request_id"] for a in answers} == sent
    assert {a.kind for a in answers} == {"result"}
    assert "Authenticated as alice via SCRAM-SHA-512" in log
    assert PASSWORD not in log


@pytest.mark.kafka
@pytest.mark.slow
def test_worker_with_wrong_password_exits(secure_broker: LocalKafka, tmp_path: Path) -> None:
    env = sasl_env(secure_broker)
    dep = Deployment.create(env.pop("PIPELINE_KAFKA_BOOTSTRAP_SERVERS"), tmp_path, 3, **env)
    proc = dep.spawn(PIPELINE_KAFKA_SECURITY_PASSWORD="wrong", PIPELINE_MODEL_TASK="noop")
    try:
        with pytest.raises(RuntimeError, match="worker exited with 1"):
            proc.wait_ready(timeout_s=300)  # exits at start-up instead of retrying
    finally:
        proc.stop()
    assert "SaslAuthenticationFailed: Authentication failed" in proc.log()
