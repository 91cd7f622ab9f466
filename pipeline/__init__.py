"""Kafka-native transformer inference: priority lanes, dedupe, micro-batches, dead letters.

The data flow: ``faust_edge`` (the consumer's fetch hook) → ``worker/``, the
Faust-free core, whose docstring lists its files in the order a record moves
(lane buffer and reader, admission, intake, compute, answers, acks), calling
on ``dedupe``, ``scheduling``, ``inference`` (the engine's threads in the worker,
the network and its tokenizer in a process of their own: ``inference/process.py``)
and ``publish`` / ``answer_producer``. ``app`` wires them into a Faust worker; ``faust_edge``
holds every use of Faust's private parts. Design notes: ``docs/design.md``.
"""

__version__ = "0.1.0"
