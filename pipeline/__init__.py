"""Kafka-native transformer inference: priority lanes, dedupe, micro-batches, dead letters.

The packages are the layers a record crosses (the README's diagram):
``kafka`` (the edge: Faust's fetch hook in ``kafka/faust_edge``, the producer,
topics) → ``codecs`` (Avro, JSON, registry framing, keys) → ``worker`` (the
Faust-free core, one stage a file: buffer, reader, admission, intake, dedupe,
compute, answers, acks) calling on ``scheduling`` (pure policies) and
``inference`` (the engine's threads in the worker, the network and its
tokenizer in a process of their own); ``observability`` watches it all and
``tools`` holds what runs beside it. ``app`` wires them into a Faust worker;
``cli`` is the ``pipeline`` command. Design notes: ``docs/design.md``.
"""

__version__ = "0.1.0"
