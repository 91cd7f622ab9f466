"""A Confluent-compatible Schema Registry without Docker or a JVM: franz-go's srfake.

``ops/schema-registry/`` holds a small Go ``main`` serving the in-memory
registry of ``github.com/twmb/franz-go/pkg/sr/srfake`` (pinned in its
``go.mod``/``go.sum``). :meth:`LocalRegistry.ensure_binary` builds it once with
the machine's ``go`` into ``cache_dir/<module version>/schema-registry`` (about
30 s on 2 cores; ``./run setup`` does it when Go is present); :meth:`start`
runs it on a free loopback port and returns once ``GET /subjects`` answers.

The server keeps nothing across a restart (ids start again at 1), and its
compatibility endpoint always says compatible: tests must not rely on it to
refuse a schema. Used by the test suite (``tests/conftest.py``) and for trying
the registry framing out by hand.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import ssl
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import IO

from pipeline.errors import ConfigurationError
from pipeline.settings._fields import _default_cache
from pipeline.tools.supervise import terminate

__all__ = ["SOURCE", "LocalRegistry", "RunningRegistry"]

#: The Go module of the server (kept next to the package, like the broker's pom).
SOURCE = Path(__file__).resolve().parents[2] / "ops" / "schema-registry"


def _source_digest() -> str:
    """A digest of the server's source: a changed main.go builds a new binary."""
    digest = hashlib.sha256()
    for name in ("go.mod", "go.sum", "main.go"):
        digest.update((SOURCE / name).read_bytes())
    return digest.hexdigest()[:12]


def _module_version() -> str:
    """The pinned franz-go sr version, from go.mod."""
    match = re.search(r"github\.com/twmb/franz-go/pkg/sr (v\S+)", (SOURCE / "go.mod").read_text())
    if match is None:
        raise ConfigurationError(f"{SOURCE}/go.mod does not pin github.com/twmb/franz-go/pkg/sr")
    return match.group(1)


class RunningRegistry:
    """One started server: its URL, and :meth:`stop`."""

    def __init__(
        self, process: subprocess.Popen[bytes], address: str, errors: IO[bytes], scheme: str
    ) -> None:
        self.process = process
        self._errors = errors
        self.address = address
        self.url = f"{scheme}://{address}"

    @property
    def port(self) -> int:
        return int(self.address.rsplit(":", 1)[1])

    def alive(self) -> bool:
        return self.process.poll() is None

    def stop(self, timeout_s: float = 5.0) -> None:
        """SIGTERM, then SIGKILL after ``timeout_s``; every schema it held is gone."""
        terminate(self.process, timeout_s)
        if self.process.stdout is not None:
            self.process.stdout.close()
        self._errors.close()

    def __enter__(self) -> RunningRegistry:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class LocalRegistry:
    """Builds (once, cached) and starts the srfake server (see the module's promise)."""

    def __init__(self, cache_dir: str | Path | None = None) -> None:
        root = Path(cache_dir or Path(_default_cache()) / "schema-registry").expanduser()
        self.version = _module_version()
        self.binary = root / f"{self.version}-{_source_digest()}" / "schema-registry"

    def has_binary(self) -> bool:
        return self.binary.is_file() and os.access(self.binary, os.X_OK)

    def ensure_binary(self, timeout_s: float = 600.0) -> Path:
        """Build the server unless cached; raise ConfigurationError (one line) when Go is
        missing or the build fails (the module proxy unreachable, say)."""
        if self.has_binary():
            return self.binary
        go = shutil.which("go")
        if go is None:
            raise ConfigurationError(
                "`go` not found: the local schema registry is built from "
                f"{SOURCE} with Go 1.24+ (https://go.dev/dl/)"
            )
        self.binary.parent.mkdir(parents=True, exist_ok=True)
        # Build beside the target and rename: a concurrent build never leaves half a file.
        fd, tmp = tempfile.mkstemp(dir=self.binary.parent, prefix=".build-")
        os.close(fd)
        try:
            done = subprocess.run(
                [go, "build", "-trimpath", "-mod=readonly", "-o", tmp, "."],
                cwd=SOURCE,
                check=False,
                capture_output=True,
                text=True,
                timeout=timeout_s,
                env={**os.environ, "GOFLAGS": "-buildvcs=false"},
            )
            if done.returncode != 0:
                last = (done.stderr.strip().splitlines() or ["no output"])[-1]
                raise ConfigurationError(f"building the schema registry failed: {last}")
            os.chmod(tmp, 0o755)
            os.replace(tmp, self.binary)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
        return self.binary

    def start(
        self,
        port: int = 0,
        *,
        auth: str = "",
        seed: list[tuple[str, str]] | None = None,
        tls: tuple[str, str] | None = None,
        timeout_s: float = 10.0,
    ) -> RunningRegistry:
        """Start a server on ``127.0.0.1:port`` (0: a free one); return once it answers.
        ``auth``: an exact ``Authorization`` header every request must carry. ``seed``:
        ``(subject, schema)`` pairs registered in order before it listens (ids 1, 2, ...
        in that order): a restart that keeps what a real registry would have kept.
        ``tls``: ``(certificate, key)`` PEM files: it serves HTTPS."""
        binary = self.ensure_binary()
        args = [str(binary), "-addr", f"127.0.0.1:{port}"] + (["-auth", auth] if auth else [])
        if tls is not None:
            args += ["-cert", tls[0], "-key", tls[1]]
        if not seed:
            return self._start(args, auth, timeout_s)
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "seed.json"
            path.write_text(json.dumps([{"subject": sub, "schema": text} for sub, text in seed]))
            return self._start([*args, "-seed", str(path)], auth, timeout_s)

    def _start(self, args: list[str], auth: str, timeout_s: float) -> RunningRegistry:
        errors = tempfile.TemporaryFile()  # noqa: SIM115 (RunningRegistry.stop closes it)
        process = subprocess.Popen(
            args, stdout=subprocess.PIPE, stderr=errors, start_new_session=True
        )
        address = _first_line(process.stdout, timeout_s)
        if not address:
            process.kill()
            process.wait(5)
            errors.seek(0)
            why = errors.read().decode(errors="replace").strip().splitlines()
            errors.close()
            raise ConfigurationError(
                f"the schema registry did not start: {why[-1] if why else 'no output'}"
            )
        tls = "-cert" in args
        running = RunningRegistry(process, address, errors, "https" if tls else "http")
        deadline = time.monotonic() + timeout_s
        headers = {"Authorization": auth} if auth else {}
        # Our own child: whether it answers is the question here, not who it is.
        context = ssl._create_unverified_context() if tls else None
        while True:
            try:
                req = urllib.request.Request(f"{running.url}/subjects", headers=headers)
                with urllib.request.urlopen(req, timeout=1.0, context=context) as resp:
                    if resp.status == 200:
                        return running
            except OSError:
                pass
            if time.monotonic() > deadline or not running.alive():
                running.stop()
                raise ConfigurationError(f"the schema registry at {running.url} did not answer")
            time.sleep(0.05)


def _first_line(stream: IO[bytes] | None, timeout_s: float) -> str:
    """The first line the server prints (its address), or '' if none within the time."""
    if stream is None:
        return ""
    import selectors

    with selectors.DefaultSelector() as sel:
        sel.register(stream, selectors.EVENT_READ)
        if not sel.select(timeout_s):
            return ""
    return stream.readline().decode(errors="replace").strip()
