"""Records on the wire: Avro single-object and Confluent-framed bodies, JSON, and request keys.

- ``avro.py``: Avro single-object encoding and the schemas by fingerprint;
- ``json_records.py``: JSON records checked as strictly as Avro;
- ``writer.py``: answer bodies written by code generated per schema;
- ``registry.py``: the Confluent Schema Registry's framing and client;
- ``keys.py``: a request's Kafka key and the worker's dedupe key;
- ``lengths.py``: a text's exact token count, in the dedupe key's normal form.

Pure except ``registry.py``'s HTTP client: nothing here imports Kafka or a model.
"""
