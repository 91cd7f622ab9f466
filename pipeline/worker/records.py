"""The forms a lane record takes on its way through the worker, in that order.

:class:`Origin` (the Kafka record as fetched) → :class:`Incoming` (it, with the
token that acknowledges it) → :class:`Request` (its value decoded and
validated, by :func:`pipeline.worker.intake.parse`) → :class:`Work` (a valid
request through scheduling and the model, until its answer).

Plain data, importing nothing from the pipeline: every module of the worker
(and publish, and the client) may import it without pulling in the rest.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the records stay light: the client imports them
    from pipeline.inference.types import Prediction

__all__ = ["MAX_REQUEST_ID_CHARS", "Incoming", "Origin", "Request", "Work", "record_size"]

#: The longest request id intake accepts (and the client sends).
MAX_REQUEST_ID_CHARS = 256


def record_size(record: Any) -> int:
    """Bytes a record holds against its lane's bounds: its value and its key. Takes
    anything with ``value`` and ``key`` (a fetched Faust message, an :class:`Origin`)."""
    return len(record.value or b"") + len(record.key or b"")


@dataclass(frozen=True)
class Origin:
    """Where an input came from: enough to find and replay it."""

    topic: str
    partition: int
    offset: int
    timestamp_ms: int
    key: bytes | None
    value: bytes | None


@dataclass
class Incoming:
    """One consumed record and the opaque token that acknowledges it."""

    lane: str
    origin: Origin
    token: Any


@dataclass(frozen=True)
class Request:
    """A decoded, validated request; ``deadline_ms`` already holds the lane default."""

    request_id: str
    text: str
    created_at_ms: int
    deadline_ms: int
    lane: str
    #: The Kafka key: producers compute it, for partitioning (and consumers, for duplicates).
    content_hash: str
    #: What dedupe levels match on: equal only for the same model input and model.
    dedupe_key: str
    source: str = ""
    metadata: dict[str, str] = field(default_factory=dict)


@dataclass(eq=False)
class Work:
    """A valid request on its way through scheduling and the model.

    It is what the scheduler queues and plans (a
    :class:`~pipeline.scheduling.Queued`: ``lane``, ``deadline_ms``,
    ``arrived_ms``, ``tokens``), held by reference and told apart by identity.
    """

    incoming: Incoming
    request: Request
    arrived_ms: int
    #: The deadline it is scheduled by, set when it is offered (``Deadlines.schedule_by``:
    #: its own, or what load shedding makes of it).
    deadline_ms: int = 0
    #: The length the model will see, estimated when it is offered (for buckets).
    tokens: int = 0
    served: str = "computed"
    attempts: int = 0
    queue_ms: float = 0.0
    stats: dict[str, float] = field(default_factory=dict)
    #: Who computed it, when not the primary model (a fallback); never stored then.
    model: tuple[str, str] | None = None
    #: False when its text was cut by load shedding: such a result is not stored.
    storable: bool = True
    #: True once its stored result proved unusable (undecodable, another model
    #: version): it is computed, and the store is not asked again.
    stored_unusable: bool = False
    #: The dedupe owner's count of store writes when the store was asked for it
    #: (-1: never); a write after it may hold its result.
    recalled_at: int = -1
    #: Its result, once known: computed by ``leader`` (itself, or the twin whose
    #: computation it joined). A work with both set is an answer to publish.
    prediction: Prediction | None = None
    leader: Work | None = None

    @property
    def lane(self) -> str:
        return self.request.lane

    def answered_by(self, leader: Work, prediction: Prediction) -> Work:
        """Set its result, computed by ``leader``; return it (an answer to publish)."""
        self.leader, self.prediction = leader, prediction
        return self
