"""The Kafka edge: every Kafka client the pipeline builds, and every use of Faust's internals.

- ``faust_edge/``: the consumer's fetch hook and every private Faust part the
  worker touches (``check()`` verifies them at start-up);
- ``faust_conf.py``: the ``faust.App`` options and its lane topics; ``faust_app.py``:
  the app and Worker classes (rebalance and stop hooks, the log format);
- ``producer.py``: answers out through librdkafka, bridged to asyncio;
- ``reader.py``, ``client.py``: reading answers and producing requests (the
  client library users and the tools share);
- ``topics.py``, ``topic_limits.py``: creating and checking the topics;
- ``security.py``: ``PIPELINE_KAFKA_SECURITY_*`` as each client's options.
"""
