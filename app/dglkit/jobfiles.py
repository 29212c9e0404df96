"""What a job wrote, read as untrusted.

The job account writes its job directory, so everything there (job.json, FAILED, status.json, metrics.jsonl,
failure records, what a summary is made of) may be the job's doing, whatever the launcher and the trainer
normally write. The kit's readers outside the sandbox (watch, report, pack, control) read those files through
`load` or `record`: a field is kept only when it has the type and range the kit writes (else it counts as absent,
so the reader's default or root's own record applies, never the job's value), and every string is cleared of
control characters (`printable`), so that nothing a job wrote reaches a terminal as an escape sequence.
"""

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dglkit.common import file_kind, read_text
from dglkit.printable import printable, scrub

# A check: whether a value is acceptable, and what it must be, in words.
Check = tuple[Callable[[Any], bool], str]
# A file's fields and their checks; a nested schema checks a field that is an object.
Schema = dict[str, "Check | Schema"]


def integer(low: int, high: int | None = None) -> Check:
    return ((lambda value: type(value) is int and low <= value and (high is None or value <= high)),
            f"an integer from {low}" + (f" to {high}" if high is not None else ""))


def optional(check: Check) -> Check:
    return (lambda value: value is None or check[0](value)), f"null or {check[1]}"


def one_of(*choices: str) -> Check:
    return (lambda value: value in choices), "one of " + ", ".join(choices)


# NaN and infinity included: a loss that diverged is a figure too.
NUMBER: Check = (lambda value: type(value) in (int, float), "a number")
TEXT: Check = (lambda value: isinstance(value, str), "a string")
TEXTS: Check = (lambda value: isinstance(value, list) and all(isinstance(item, str) for item in value),
                "a list of strings")
FLAG: Check = (lambda value: isinstance(value, bool), "true or false")
PORT = integer(1, 65535)

# status.json of a node (the launcher's): docs/design.md.
STATES = ("starting", "running", "restarting", "succeeded", "failed", "stopped")
STATUS: Schema = {"state": one_of(*STATES), "reason": TEXT, "attempt": integer(1)}
# FAILED and failed.json (a launcher's), failure-<pid>.json (a process's own): dglkit/blame.py.
FAILURE: Schema = {"node": optional(TEXT), "process": TEXT, "pid": integer(0), "attempt": integer(1),
                   "started": FLAG, "exit_code": optional(integer(-255, 255)), "reason": TEXT,
                   "error": optional(TEXT), "where": optional(TEXT), "log": optional(TEXT), "log_tail": TEXTS,
                   "traceback": TEXTS, "time": NUMBER}
# job.json (train.yml's launcher configuration): the fields that the readers outside the sandbox use.
JOB: Schema = {"nodes": TEXTS, "num_servers": integer(1, 65535), "master_port": PORT, "part_config": TEXT,
               "max_restarts": integer(0), "stale_after": NUMBER, "command": TEXT, "train_args": TEXTS,
               "train": {"num_epochs": integer(1)}}
# A metrics.jsonl record (the trainer's, or a program's in the kit's format): docs/design.md.
EVENT: Schema = {"event": TEXT, "epoch": integer(0), "time": NUMBER, "num_epochs": integer(1),
                 "num_trainers": integer(1), "part_config": TEXT, "task": TEXT, "graphbolt": FLAG,
                 **{name: NUMBER for name in ("loss", "epoch_time", "seeds_per_s")},
                 **{f"{split}_{metric}": NUMBER for split in ("train", "val", "test", "best_val", "best_test")
                    for metric in ("acc", "mrr", "hits10")}}
# What the readers of a record of these events rely on.
EVENT_NEEDS = {"epoch": ("epoch",), "resume": ("epoch", "time")}
# What a summary names the dataset by: the partition config, its manifest and the dataset's record.
PARTITION: Schema = {"num_parts": integer(1), "graph_name": TEXT}
MANIFEST: Schema = {"dataset_dir": TEXT}
DATASET: Schema = {"source": TEXT, "num_nodes": integer(0), "num_edges": integer(0)}


# The kit's files nest three levels at most; a reader recurses through what it reads.
DEPTH = 20


class Unreadable(Exception):
    """A job-written file that is not what the kit writes there; the message says what is wrong with it."""


def shown(value: Any) -> str:
    """A job's value in a message: printable, and short."""
    text = printable(json.dumps(value), lines=False)
    return text if len(text) <= 60 else text[:59] + "…"


def typed(value: dict[str, Any], schema: Schema) -> tuple[dict[str, Any], list[str]]:
    """value (printable) without the fields that fail their check, and what is wrong with each of those."""
    kept, wrong = {}, []
    for key, item in scrub(value).items():
        check = schema.get(key)
        if isinstance(check, dict) and isinstance(item, dict):
            kept[key], inner = typed(item, check)
            wrong += [f"{key}.{problem}" for problem in inner]
        elif check is None or (not isinstance(check, dict) and check[0](item)):
            kept[key] = item
        else:
            wrong.append(f"{key} is {shown(item)}, not {'an object' if isinstance(check, dict) else check[1]}")
    return kept, wrong


def json_object(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError as error:
        raise Unreadable(f"is not JSON: {error}") from None
    except RecursionError:
        raise Unreadable(f"is JSON nested deeper than {DEPTH} levels") from None
    if not isinstance(value, dict):
        raise Unreadable(f"is not a JSON object but {shown(value)}")
    if nesting(value) > DEPTH:
        raise Unreadable(f"is JSON nested deeper than {DEPTH} levels")
    return value


def nesting(value: Any) -> int:
    """How deeply lists and objects nest in value, found without recursion: the readers recurse."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, (dict, list)):
            deepest = max(deepest, level)
            stack += [(inner, level + 1) for inner in (item.values() if isinstance(item, dict) else item)]
    return deepest


def checked(value: dict[str, Any], schema: Schema, required: tuple[str, ...] = ()) -> dict[str, Any]:
    """value typed (`typed`); Unreadable when a required field is absent or fails its check."""
    kept, wrong = typed(value, schema)
    wrong = [problem for problem in wrong if problem.split(" ", 1)[0] in required]
    wrong += [f"no {key}" for key in required if key not in value]
    if wrong:
        raise Unreadable("is not what the kit writes there: " + "; ".join(wrong))
    return kept


def parse(text: str, schema: Schema, required: tuple[str, ...] = ()) -> dict[str, Any]:
    """The object in text, typed; Unreadable when it is not JSON, not an object, or a required field is absent or
    fails its check."""
    return checked(json_object(text), schema, required)


def load(path: Path, schema: Schema, required: tuple[str, ...] = ()) -> dict[str, Any]:
    """The typed object in path (`parse`), read without following a link or blocking on a FIFO;
    FileNotFoundError when it is missing, Unreadable, naming the file, when it is anything else."""
    try:
        text = read_text(path)
    except FileNotFoundError:
        raise
    except OSError as error:
        try:
            kind = file_kind(os.lstat(path))
        except OSError:
            kind = "file"
        raise Unreadable(f"{path} is {kind}, not a regular file" if kind != "file" else
                         f"{path} is unreadable: {error.strerror}") from None
    except ValueError as error:  # not UTF-8
        raise Unreadable(f"{path} is not JSON: {error}") from None
    try:
        return parse(text, schema, required)
    except Unreadable as error:
        raise Unreadable(f"{path} {error}") from None


def record(path: Path, schema: Schema, required: tuple[str, ...] = ()) -> dict[str, Any] | None:
    """`load`, or None when the file is missing or unreadable."""
    try:
        return load(path, schema, required)
    except (OSError, Unreadable):
        return None


def event(line: str) -> dict[str, Any]:
    """A metrics.jsonl line's record, typed; Unreadable when it is not a JSON object (half a line being written,
    or the job's doing), or an epoch or resume record without its epoch number."""
    value = json_object(line)
    return checked(value, EVENT, EVENT_NEEDS.get(str(value.get("event")), ()))
