"""What runs beside the worker: the ``pipeline`` commands and what they drive.

- ``commands/``: the ``pipeline`` CLI's subcommands (``pipeline.cli`` is the group);
- ``demo.py``: the README's main command (``./run demo``);
- ``bench/``: the benchmark; ``replay/``: dead letters replayed offline;
- ``kafka_local.py`` (+ ``kafka_local_security.py``), ``registry_local.py``:
  a local broker and Schema Registry without Docker;
- ``supervise.py``: start, watch and stop real worker processes.
"""
