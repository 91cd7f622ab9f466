"""The model's fingerprint: what a stored answer must have been computed with to be served.

:func:`model_fingerprint` hashes everything that changes a model's answer to a
text: the files of the model folder (weights, config, tokenizer), the task and
how its output is formed (pooling, normalisation: its ``answer_form``,
:mod:`pipeline.settings.tasks`), the effective token limit,
the device kind and the weights' dtype (float32 unless ``PIPELINE_MODEL_DTYPE``
or a CUDA device says otherwise; the simulated device's profile), the
transformers/tokenizers/torch versions that run it, and the configured
``name@version``. Dedupe keys include it (:class:`pipeline.codecs.keys.InputKeys`),
so new weights at the same path, an upgraded model package or library,
another task or ``max_length`` never meet a stored answer of the old ones.

Not included, because they do not change the answer beyond float rounding:
the padding mode, the thread counts, and whether the network runs traced
(a trace is checked against the eager network at load, :mod:`.tracing`).

File contents are hashed up to :data:`CONTENT_LIMIT` bytes per file, larger
files by name, size and modification time (hashing gigabytes at every start
would cost seconds); each digest is remembered for the life of the process
while the file's size, times and inode stay the same.
"""

from __future__ import annotations

import hashlib
import os
import threading
from importlib import metadata
from pathlib import Path

from pipeline.settings.tasks import task_of

__all__ = ["CONTENT_LIMIT", "files_digest", "model_fingerprint"]

#: Files up to this size are hashed by content; larger ones by name, size and mtime.
CONTENT_LIMIT = 512 * 1024 * 1024

_LIBRARIES = ("transformers", "tokenizers", "torch")

_memo: dict[tuple[str, int, int, int, int], str] = {}
_memo_lock = threading.Lock()


def _file_digest(path: Path, st: os.stat_result) -> str:
    # ctime and inode too: a rewrite that restores size and mtime still changes them
    key = (str(path.resolve()), st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)
    with _memo_lock:
        known = _memo.get(key)
    if known is not None:
        return known
    if st.st_size > CONTENT_LIMIT:
        digest = f"stat:{st.st_size}:{st.st_mtime_ns}"
    else:
        with path.open("rb") as f:
            content = hashlib.file_digest(f, lambda: hashlib.blake2b(digest_size=16))
        digest = "blake2b:" + content.hexdigest()
    with _memo_lock:
        _memo[key] = digest
    return digest


def files_digest(folder: Path) -> str:
    """A hex digest of every regular file under ``folder`` (hidden ones skipped): each
    one's path relative to the folder, and its content digest (or its size and mtime,
    past :data:`CONTENT_LIMIT`)."""
    h = hashlib.blake2b(digest_size=16)
    root = folder.resolve()
    for dirpath, dirnames, filenames in os.walk(root, followlinks=True):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for name in sorted(filenames):
            if name.startswith("."):
                continue
            path = Path(dirpath) / name
            st = path.stat()
            rel = path.relative_to(root).as_posix()
            h.update(f"{rel}\x00{_file_digest(path, st)}\x00".encode("utf-8", "surrogatepass"))
    return h.hexdigest()


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "-"


def model_fingerprint(
    *,
    model_id: str,
    task: str,
    max_length: int,
    device_type: str,
    folder: Path | None,
    dtype: str = "float32",
) -> str:
    """A hex digest of everything that changes the model's answer (see the module's promise).

    ``folder`` None (task ``noop``) leaves out the files and the libraries.
    """
    parts = [
        f"model_id={model_id}",
        f"task={task}",
        f"answer={task_of(task).answer_form}",
        f"max_length={max_length}",
        f"device={device_type}",
    ]
    if dtype != "float32":  # float32 keys stay those of before the dtype was a setting
        parts.append(f"dtype={dtype}")
    if folder is not None:
        parts.append(f"files={files_digest(folder)}")
        parts += [f"{lib}={_version(lib)}" for lib in _LIBRARIES]
    h = hashlib.blake2b(digest_size=16)
    h.update("\x00".join(parts).encode("utf-8", "surrogatepass"))
    return h.hexdigest()
