"""A job's training curves as a TensorBoard event file in its run folder, on the controller (roles/dgl_job).

While the job runs, each poll's progress (`dglkit watch`'s latest epoch record) is added by the kit's action
plugin (plugins/action/dglkit_watch.py); at the end the whole metrics.jsonl is (`python tboard.py --run-folder
F`). Both go through `record`, which appends to the run's one event file only what the file does not hold yet, as
TensorBoard's reader sees it: a re-polled epoch is not written twice, and epochs that a restart from a checkpoint
threw away (a step at or after one that changed, or steps after the newest) are ended by a SessionLog START at
the first of them, which TensorBoard's reader takes as "purge what came after this step". Step = epoch, one tag
per figure of the epoch record, named as in metrics.jsonl; wall time = the record's "time".

A new run of the same job id (train.yml after a failure, or with dgl_job_force) sets the earlier run's event file
aside to history/<k>/, beside what `dglkit jobdir` moved there on the storage host: `tensorboard --logdir runs`
shows `<job id>` and `<job id>/history/<k>` as separate runs.

Runs with the controller's Python (Ansible's): the standard library and the `tensorboard` package alone, so that
it also runs as a script from the installed collection. The event file holds TensorBoard's records (its
RecordWriter and Event protos): one file per run, appended by every poll, whichever ansible-playbook made them.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import socket
import struct
import time
from pathlib import Path

EVENTS = "events.out.tfevents."
# The epoch record's keys that are not figures.
NOT_FIGURES = {"event", "epoch", "time", "num_trainers"}


def figures(record: dict) -> dict[str, float]:
    """The numbers of an epoch record that become scalars (loss, accuracy or MRR, epoch time, seeds/s, ...)."""
    return {key: float(value) for key, value in record.items()
            if key not in NOT_FIGURES and isinstance(value, (int, float)) and not isinstance(value, bool)}


def epochs(text: str) -> list[dict]:
    """The epoch records of metrics.jsonl, in order (a line being written, or not JSON, is left out)."""
    found = []
    for line in text.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and record.get("event") == "epoch" and isinstance(record.get("epoch"), int):
            found.append(record)
    return found


def event_file(folder: Path) -> Path | None:
    """The run's event file: the newest at the top of the run folder."""
    files = sorted(folder.glob(EVENTS + "*"))
    return files[-1] if files else None


def written(path: Path) -> dict[int, dict[str, float]]:
    """step -> {tag: value} as TensorBoard's reader sees the file (steps a START purged are gone)."""
    from tensorboard.backend.event_processing.event_accumulator import SCALARS, EventAccumulator

    # Its warning about each purge is what a restart should do here: not for the playbook's output.
    logging.getLogger("tensorboard").setLevel(logging.ERROR)
    reader = EventAccumulator(str(path), size_guidance={SCALARS: 0})
    reader.Reload()
    held: dict[int, dict[str, float]] = {}
    for tag in reader.Tags()[SCALARS]:
        for scalar in reader.Scalars(tag):
            held.setdefault(scalar.step, {})[tag] = scalar.value
    return held


def as_float32(values: dict[str, float]) -> dict[str, bytes]:
    """The values as the file stores them (float32), comparable bit for bit (NaN too)."""
    return {tag: struct.pack("<f", value) for tag, value in values.items()}


def plan(held: dict[int, dict[str, float]], records: list[dict]) -> tuple[int | None, list[dict]]:
    """(the step at which a START must purge what the file holds, or None; the records to append)."""
    first = next((i for i, record in enumerate(records)
                  if as_float32(held.get(record["epoch"], {})) != as_float32(figures(record))), len(records))
    start = records[first]["epoch"] if first < len(records) else records[-1]["epoch"] + 1
    return (start if any(step >= start for step in held) else None), records[first:]


def record(folder: Path, records: list[dict]) -> int:
    """Make the run's event file end with these epoch records (the newest last); returns the events appended."""
    from tensorboard.compat.proto.event_pb2 import Event, SessionLog
    from tensorboard.compat.proto.summary_pb2 import Summary
    from tensorboard.summary.writer.record_writer import RecordWriter

    records = [r for r in records if figures(r)]
    if not records:
        return 0
    path = event_file(folder)
    events = []
    if path is None:
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{EVENTS}{int(time.time()):010d}.{socket.gethostname()}.dglkit"
        events.append(Event(wall_time=time.time(), file_version="brain.Event:2"))
    start, missing = plan(written(path) if not events else {}, records)
    if start is not None:
        events.append(Event(wall_time=missing[0].get("time", time.time()) if missing else time.time(), step=start,
                            session_log=SessionLog(status=SessionLog.START)))
    for rec in missing:
        values = [Summary.Value(tag=tag, simple_value=value) for tag, value in figures(rec).items()]
        events.append(Event(wall_time=rec.get("time", time.time()), step=rec["epoch"], summary=Summary(value=values)))
    with path.open("ab") as stream:
        writer = RecordWriter(stream)
        for event in events:
            writer.write(event.SerializeToString())
    return len(events)


def set_aside(folder: Path, history: str) -> str | None:
    """Move the earlier run's event file to history/<history>/ (the name `dglkit jobdir` gave the earlier run,
    or "" when it moved nothing: then earlier-<the file's time>); returns where it went."""
    path = event_file(folder)
    if path is None:
        return None
    target = folder / "history" / (history or f"earlier-{int(path.stat().st_mtime)}")
    target.mkdir(parents=True, exist_ok=True)
    os.replace(path, target / path.name)
    return str(target / path.name)


def argument_parser() -> argparse.ArgumentParser:
    """The program's options (docs/cli.md is made from them too)."""
    parser = argparse.ArgumentParser(prog="python -m dglkit.tboard", description=__doc__.split("\n\n")[0])
    parser.add_argument("--run-folder", required=True, type=Path, help="the job's run folder, runs/<job id>")
    parser.add_argument("--set-aside", metavar="K", help="a new run starts: move the earlier run's event file to "
                        "history/K/ (K empty: history/earlier-<its time>/)")
    return parser


def main() -> None:
    args = argument_parser().parse_args()
    try:
        import tensorboard  # noqa: F401 (only to say that it is missing)
    except ImportError:
        print(json.dumps({"changed": False, "skipped": "the controller's Python has no tensorboard package"}))
        return
    if args.set_aside is not None:
        moved = set_aside(args.run_folder, args.set_aside)
        print(json.dumps({"changed": moved is not None, "moved": moved}))
        return
    metrics = args.run_folder / "metrics.jsonl"
    appended = record(args.run_folder, epochs(metrics.read_text()) if metrics.is_file() else [])
    print(json.dumps({"changed": appended > 0, "events": appended, "file": str(event_file(args.run_folder) or "")}))


if __name__ == "__main__":
    main()
