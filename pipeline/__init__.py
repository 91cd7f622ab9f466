"""Kafka-native transformer inference: priority lanes, dedupe, micro-batches, dead letters.

The folder tells the data flow: ``intake`` (decode, validate) → ``dedupe`` →
``scheduling`` → ``inference`` (own thread) → ``publish`` → ``acks``; ``app``
wires them into a Faust worker, ``worker`` holds the Faust-free core.
"""

__version__ = "0.1.0"
