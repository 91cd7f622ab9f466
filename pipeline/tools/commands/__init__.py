"""The ``pipeline`` command's larger commands, one module each.

``pipeline.cli`` owns the ``main`` group and the small commands, and registers
these; ``options`` holds the flags and helpers more than one command shares.
"""
