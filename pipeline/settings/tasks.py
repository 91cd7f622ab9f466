"""The model's tasks as data (``PIPELINE_MODEL_TASK``): each task defined once.

A :class:`Task` says everything the pipeline asks of a task: which network
output it reads and which transformers class loads the network (none: no
model at all), whether the folder must hold a trained head, how the output
becomes an answer (a text that is part of the model's fingerprint, so stored
answers of another form are never served), and which result fields it fills.
Free of torch and transformers: the worker, the settings and the model
process all read it. The README's "Adding a lane or a task" says which files
a new task touches.
"""

from __future__ import annotations

import dataclasses

from pipeline.errors import ConfigurationError

__all__ = ["DEFINITIONS", "TASKS", "TASK_NAMED", "Task", "help_text", "task_of"]


@dataclasses.dataclass(frozen=True)
class Task:
    """One task (see the module's promise)."""

    name: str
    #: What it answers, for ``pipeline settings``.
    summary: str
    #: How the network's output becomes an answer. Part of the model's fingerprint:
    #: change the text when the code that forms the answer (``model.py``) changes.
    answer_form: str
    #: The result fields its answers fill (``embedding``, or ``label`` and ``score``).
    result_fields: tuple[str, ...]
    #: The network's output the answer is read from; None: no network at all.
    output: str | None = None
    #: The transformers class that loads the network (``transformers.<auto_class>``).
    auto_class: str | None = None
    #: Whether the folder must hold the task's trained head (its weights are not
    #: made up at load, as transformers would).
    trained_head: bool = False

    @property
    def runs_model(self) -> bool:
        """Whether the task loads and runs a network (the noop task does not)."""
        return self.output is not None

    @property
    def embeds(self) -> bool:
        """Whether its answers are embeddings (else a label and its score)."""
        return "embedding" in self.result_fields


#: Every task; the first is the default.
DEFINITIONS: tuple[Task, ...] = (
    Task(
        name="embed",
        summary="mean-pooled, L2-normalised",
        answer_form="last_hidden_state, attention-mask mean pooling, L2 normalisation",
        result_fields=("embedding",),
        output="last_hidden_state",
        auto_class="AutoModel",
    ),
    Task(
        name="classify",
        summary="label, score",
        answer_form="logits, softmax, top label and its probability",
        result_fields=("label", "score"),
        output="logits",
        auto_class="AutoModelForSequenceClassification",
        trained_head=True,
    ),
    Task(
        name="noop",
        summary="no model: a fixed tiny embedding, to measure the pipeline's own cost",
        answer_form="a fixed embedding",
        result_fields=("embedding",),
    ),
)

#: The tasks' names, the default first.
TASKS: tuple[str, ...] = tuple(t.name for t in DEFINITIONS)

#: Every task by its name.
TASK_NAMED: dict[str, Task] = {t.name: t for t in DEFINITIONS}


def task_of(name: str) -> Task:
    """The task called ``name``; ConfigurationError naming the setting if none is."""
    try:
        return TASK_NAMED[name]
    except KeyError:
        raise ConfigurationError(
            f"PIPELINE_MODEL_TASK={name!r}: expected one of {', '.join(TASKS)}"
        ) from None


def help_text() -> str:
    """``PIPELINE_MODEL_TASK``'s help: every task and what it answers."""
    named = [f"{t.name} ({t.summary})" for t in DEFINITIONS]
    return ", ".join(named[:-1]) + ", or " + named[-1]
