"""Kafka-native transformer inference: priority lanes, dedupe, micro-batches, dead letters.

The folder tells the data flow: ``intake`` (decode, validate) → ``admission``
(lane bounds, offset watermark) → ``dedupe`` → ``scheduling`` → ``compute`` and
``inference`` (own thread) → ``answers`` → ``publish`` / ``answer_producer`` →
``acks``; ``app`` wires them into a Faust worker, ``worker`` holds the
Faust-free core, ``faust_edge`` every use of Faust's private parts. Design
notes: ``docs/design.md``.
"""

__version__ = "0.1.0"
