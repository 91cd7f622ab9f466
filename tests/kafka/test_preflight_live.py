"""A real worker whose preflight fails never joins its consumer group (kafka, slow): the
checks themselves are in tests/unit/worker/test_preflight.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient
from harness import Deployment


@pytest.mark.kafka
@pytest.mark.slow
def test_a_bad_worker_never_joins_its_group(
    kafka_bootstrap: str, kafka_admin: AdminClient, tmp_path: Path
) -> None:
    dep = Deployment.create(kafka_bootstrap, tmp_path, partitions=1)
    for extra in (
        {"PIPELINE_MODEL_PATH": str(tmp_path / "no-model")},
        {"PIPELINE_MODEL_DEVICE": "tpu"},
    ):
        worker = dep.spawn(**extra)
        code = worker.proc.wait(timeout=120)
        lines = worker.log().strip().splitlines()
        assert code != 0
        assert lines[-1].startswith("pipeline: "), lines[-3:]
        assert next(iter(extra)) in lines[-1] or "DEVICE" in lines[-1], lines[-1]
    group = dep.settings.worker.app_id
    listed = kafka_admin.list_consumer_groups().result(timeout=30)
    assert group not in {g.group_id for g in listed.valid}
