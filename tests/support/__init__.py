"""Helpers shared by the test modules (one home, instead of copies per module).

:func:`require` is how a test states a prerequisite outside the code under
test (root, promtool, a local broker): off CI a missing one skips the test
with a reason that names it; on CI (``CI=true``) it fails the test, so a green
CI run has run every test.
"""

from __future__ import annotations

import os
import socket

import pytest

__all__ = ["free_ports", "on_ci", "require"]


def free_ports(count: int) -> list[int]:
    """``count`` distinct loopback ports that were free a moment ago."""
    socks = [socket.socket() for _ in range(count)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for s in socks:
            s.close()


def on_ci() -> bool:
    """True when the environment says this is a CI run (``CI=true``, ``1`` or ``yes``)."""
    return os.environ.get("CI", "").strip().lower() in {"1", "true", "yes"}


def require(condition: object, what: str) -> None:
    """Go on when ``condition`` holds; otherwise skip (off CI) or fail (on CI) naming ``what``.

    ``what`` names the prerequisite and how to get it, e.g. ``"promtool
    (apt-get install prometheus)"``.
    """
    if condition:
        return
    if on_ci():
        pytest.fail(f"CI=true and a prerequisite is missing: {what}", pytrace=False)
    pytest.skip(f"missing prerequisite: {what}")
