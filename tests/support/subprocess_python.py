"""Code run in a Python of its own: for tests of what patches Faust globally or opens
one Faust app per test (``pipeline.kafka.faust_edge``), so this process stays as it was."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from typing import Any


def run_python(code: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run ``code`` (dedented) with this interpreter; its output captured, never raising."""
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def last_json(done: subprocess.CompletedProcess[str]) -> Any:
    """The last line ``done`` printed, parsed as JSON."""
    return json.loads(done.stdout.strip().splitlines()[-1])
