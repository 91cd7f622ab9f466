"""free_port (pipeline.tools.supervise): a port a worker can bind, outside the range the
kernel hands to outgoing connections."""

from __future__ import annotations

import socket

from pipeline.tools.supervise import LOWEST_PORT, _ephemeral_start, free_port


def test_a_free_port_is_bindable_and_below_the_ephemeral_range() -> None:
    first_ephemeral = _ephemeral_start()
    ports = {free_port() for _ in range(20)}
    for port in ports:
        if first_ephemeral > LOWEST_PORT:  # room below it (Linux's default: 32768)
            assert LOWEST_PORT <= port < first_ephemeral
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))  # nobody listens there
    assert len(ports) > 1  # picked at random, not one port for every worker
