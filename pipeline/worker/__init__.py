"""The worker's core: a lane record from the fetch to its answer and released offset.

The files, in the order a record moves through them (the record's forms on
the way, :class:`Origin` → :class:`Incoming` → :class:`Request` →
:class:`Work`, are in ``records.py``):

- ``pipeline/kafka/faust_edge/`` (``install``): the consumer's fetch hands each
  fetch's lane records over at once, below Faust's streams, to the ledger
  (``ledger.py``), the one keeper of a record's offset and bounds from the
  fetch to the release, whose parts are ``lane_buffer.py``,
  ``continuity.py``, ``start_offsets.py`` and ``admission.py`` (+ ``acks.py``);
- ``lane_buffer.py``: fetched records wait per partition in offset order,
  bounded per lane (a full lane's partitions leave the fetcher);
- ``lane_reader.py``: buffer to runtime, realtime first, a chunk a pass;
  checks each record against its partition's start (``start_offsets.py``,
  looked up from the broker per assignment) and next expected offset
  (``continuity.py``: a hole is sought back for, a second copy passed over);
  a record in the Schema Registry's framing waits until its writer schema is
  known (``writer_schemas.py``, looked up once per id on a thread of its own);
- ``runtime.py`` (:class:`~pipeline.worker.runtime.Runtime`): ``take`` takes
  one record on, at once:

  - ``admission.py``: counts it against its lane's bounds (records, bytes)
    and holds its offset in its partition's watermark;
  - ``intake.py``: ``parse`` decodes and validates its value into a Request
    (``peek_request_id`` names one too large to decode); a bad one becomes
    a dead letter;
  - ``repeats.py``, the one owner of dedupe state (the stored results of
    ``dedupe.py``, computations under way, results not yet stored), answers
    a repeat whose result is known; the rest is queued through its lane's
    gate (``gates.py``: pauses, and work parked while its lane's queue is
    full) in ``pipeline/scheduling/``, which forms batches by lane and
    deadline and is the only judge of expiry; ``guard.py`` sheds load and
    breaks the circuit around the model;

- ``batches.py``: the batch loop: each batch formed at the last moment, the
  expired dead-lettered, the rest handed to compute, its run time observed;
- ``compute.py``: a batch deduped again by ``repeats.py`` (a result known
  meanwhile, a twin in flight or in the same batch), through the model
  (``pipeline/inference/``, its own thread), retried, fallen back;
- ``answers.py``: exactly one result or dead letter per input, built by
  ``publish.py`` and sent by ``pipeline/kafka/producer.py``, awaited until
  the broker acknowledges it, then the dedupe entry stored (``repeats.py``);
- ``acks.py``: the release: the offset watermark hands Faust only a contiguous
  prefix of each partition's answered offsets to commit.

Each stage hands its output forward. What must go back against the flow
(room freed, an answer's lateness, a result to store, a stored result found
unusable, the answer path failing) is an event (``events.py``) that the
runtime dispatches. ``preflight.py`` holds the checks a worker runs before it
joins its group.
Nothing here imports Faust: ``pipeline/app.py`` wires these into a Faust
worker through injected callables. Import what you need from its module
(``pipeline.worker.runtime``, ``pipeline.worker.records``): this package
imports nothing, so the records cost no model stack.
"""
