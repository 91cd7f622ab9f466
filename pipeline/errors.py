"""The pipeline's one error tree, split by what happens next.

::

    PipelineError
    ├── PermanentError          the input can never succeed: dead-letter it now
    │   ├── DecodeError         bytes are not a record we know (stage "decode")
    │   │   ├── UnknownSchemaId     Confluent framing: the registry has no schema by that id
    │   │   └── SchemaMismatch      the writer's schema cannot be read as the reader's
    │   ├── ValidationError     a record that breaks a rule (stage "validate")
    │   ├── ExpiredError        its deadline passed before it could run (stage "expired")
    │   └── PublishRejected     its result was refused for good (too large, not authorised,
    │                           invalid): surely not written; dead-letter it (stage "publish")
    ├── RetryableError          worth another try, with backoff, a bounded number of times
    │   ├── InferenceError      the model raised on an input (stage "infer" once out of tries)
    │   │   └── CircuitOpenError  the model's breaker is open: it was not called (stage "infer")
    │   ├── PublishError        the broker did not acknowledge a record (stage "publish")
    │   └── RegistryUnavailable   the Schema Registry did not answer (down, slow, refusing
    │                             us): not the input's fault; its records wait, never
    │                             dead-lettered for it
    ├── AnswerPathFailure       a record's fate is unknown (timed out) or the producer is
    │                           broken: stop the worker; the input stays uncommitted
    └── ConfigurationError      settings or environment that cannot work; says what to do
        ├── BrokerUnavailable   no broker answers at the configured address
        └── AuthenticationFailed  the broker refused the credentials, or TLS failed

Third-party exceptions are wrapped at the edge with ``raise ... from exc`` so
that the stages catch only these types. An error's ``stage`` is the dead-letter
stage it maps to (:func:`stage_of`); errors that never dead-letter an input
(configuration, the bases) have none.
"""

from __future__ import annotations

__all__ = [
    "STAGES",
    "AnswerPathFailure",
    "AuthenticationFailed",
    "BrokerUnavailable",
    "CircuitOpenError",
    "ConfigurationError",
    "DecodeError",
    "ExpiredError",
    "InferenceError",
    "PermanentError",
    "PipelineError",
    "PublishError",
    "PublishRejected",
    "RegistryUnavailable",
    "RetryableError",
    "SchemaMismatch",
    "UnknownSchemaId",
    "ValidationError",
    "stage_of",
]


#: The dead-letter stages, in the order a record meets them (the DeadLetter schema's
#: ``Stage`` symbols).
STAGES: tuple[str, ...] = ("decode", "validate", "infer", "expired", "publish")


class PipelineError(Exception):
    """Base of every error the pipeline raises on purpose."""

    #: The dead-letter stage this error maps to; None where it has none (see :func:`stage_of`).
    stage: str | None = None


class PermanentError(PipelineError):
    """The input can never succeed; retrying is pointless."""


class DecodeError(PermanentError):
    """The bytes are not a single-object-encoded record of a known schema."""

    stage = "decode"


class UnknownSchemaId(DecodeError):
    """A Confluent-framed record names a schema id the registry does not know (or
    a schema this worker cannot read: not Avro, or with references)."""


class SchemaMismatch(DecodeError):
    """The writer's schema (from the registry) cannot be resolved to the reader's:
    the producer's schema is not compatible with this worker's."""


class ValidationError(PermanentError):
    """The record decoded but breaks a rule (empty text, too long, ...)."""

    stage = "validate"

    def __init__(self, message: str, *, request_id: str | None = None) -> None:
        super().__init__(message)
        #: The request's id when the record decoded far enough to have one.
        self.request_id = request_id


class ExpiredError(PermanentError):
    """The request's deadline passed before it could be computed."""

    stage = "expired"


class PublishRejected(PermanentError):
    """The producer or broker refused a record for good: it was surely not written
    (too large, topic not authorised, invalid record), so answering the input
    with a dead letter cannot also leave a result behind. Retrying cannot help."""

    stage = "publish"


class RetryableError(PipelineError):
    """A failure that may go away: retry with backoff, a bounded number of times."""


class InferenceError(RetryableError):
    """The model raised while computing one input."""

    stage = "infer"


class CircuitOpenError(InferenceError):
    """The model's circuit breaker is open and no fallback model is set: the
    request is dead-lettered at once, without calling the model."""

    stage = "infer"


class PublishError(RetryableError):
    """The broker did not acknowledge a produced record."""

    stage = "publish"


class RegistryUnavailable(RetryableError):
    """The Schema Registry did not answer as a registry: unreachable, timed out, a
    server error, or credentials refused. Not the input's fault: never dead-lettered."""

    stage = "decode"


class AnswerPathFailure(PipelineError):
    """The answer path cannot go on: a record's fate is unknown (its delivery timed
    out; it may be written), the producer hit a fatal error, or a dead letter was
    refused. The worker stops loudly; the input stays uncommitted and is delivered
    again after a restart (at-least-once), never answered twice in two ways."""

    stage = "publish"


class ConfigurationError(PipelineError):
    """Settings or environment that cannot work; the message says what to do."""


class BrokerUnavailable(ConfigurationError):
    """No Kafka broker answers at the configured bootstrap address."""


class AuthenticationFailed(ConfigurationError):
    """The broker refused this client's SASL credentials, or the TLS handshake
    failed; retrying cannot help, so clients raise it at once instead of timing out."""


def stage_of(error: BaseException) -> str:
    """The dead-letter stage of an input that failed with ``error``: the error's own,
    else ``infer`` (an exception that escaped the model carries none)."""
    stage = error.stage if isinstance(error, PipelineError) else None
    return stage or "infer"
