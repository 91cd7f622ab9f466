"""The Faust edge: the start-up check of the patched internals, and the lane ack filter.

Faust is patched globally by :func:`pipeline.faust_edge.install`, so every test that
installs or imports ``pipeline.app`` runs in a subprocess and leaves this process alone.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from pipeline import faust_edge
from pipeline.errors import ConfigurationError


def _python(code: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def test_the_installed_faust_is_the_tested_one() -> None:
    faust_edge.check()  # raises when constraints.txt and the venv disagree


def test_another_faust_release_is_refused_with_the_fix() -> None:
    with pytest.raises(ConfigurationError) as err:
        faust_edge.check(version="0.16.0")
    assert "0.16.0" in str(err.value)
    assert "constraints.txt" in str(err.value)


def test_missing_private_attributes_are_named() -> None:
    class Consumer:
        def __init__(self) -> None:
            self._read_offset: dict[object, int] = {}

        def ack(self, message: object) -> bool:
            return True

    with pytest.raises(ConfigurationError) as err:
        faust_edge.check(version=faust_edge.TESTED_FAUST, consumer=Consumer)
    text = str(err.value)
    for name in ("Consumer._add_gap", "Consumer._committed_offset", "Consumer.seek"):
        assert name in text
    assert "Consumer.ack" not in text.replace("Consumer.ack,", "")  # present: not named
    assert "\n" not in text


def test_a_worker_with_a_patched_attribute_missing_stops_with_one_line() -> None:
    done = _python(
        """
        import faust.transport.consumer as c
        del c.Consumer._add_gap
        import pipeline.app
        """
    )
    assert done.returncode != 0
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("pipeline: ") and "Consumer._add_gap" in lines[0]


def test_lane_offsets_are_acked_to_faust_only_once_released() -> None:
    """Faust's own Consumer.ack (the one a skipped event's ack reaches) is refused for
    a lane message until the watermark released it; other topics are untouched."""
    done = _python(
        """
        import asyncio, json
        import faust
        from faust.types.tuples import TP, ConsumerMessage as Message
        from pipeline import faust_edge

        faust_edge.install(frozenset({"lane"}))
        app = faust.App("edge-test", broker="kafka://127.0.0.1:1")
        app.topics.acking_topics.update({"lane", "other"})  # as subscribed agents make them
        consumer = app.consumer

        def message(topic, offset):
            return Message(topic, 0, offset, 0.0, 0, None, b"k", b"v", None, tp=TP(topic, 0))

        class Stream:
            async def ack(self, event):
                return event.message.ack(consumer)

        class Event:
            def __init__(self, msg):
                self.message = msg

        out = {}
        skipped = message("lane", 5)
        out["skipped_ack"] = skipped.ack(consumer)       # what Faust does for a skip
        out["acked_after_skip"] = list(consumer._acked[TP("lane", 0)])
        other = message("other", 3)
        other.ack(consumer)
        out["other_acked"] = other.acked
        asyncio.run(faust_edge.release((Stream(), Event(skipped))))
        out["acked_after_release"] = list(consumer._acked[TP("lane", 0)])
        print(json.dumps(out))
        """
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["skipped_ack"] is False
    assert out["acked_after_skip"] == []
    assert out["other_acked"] is True
    assert out["acked_after_release"] == [5]
