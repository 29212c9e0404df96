"""`dglkit report`: summarise a job that started, whatever its outcome: what ran, how it ended (the process that
failed first, dglkit/blame.py), each attempt and why it ended, and the trainer's metrics.jsonl (and result.json)
when there are any.

Writes <job dir>/summary.json, summary.txt (one screen) and, once an epoch is done, curves.png (loss, the task's
metric and epoch time per epoch). The metric is accuracy (epoch events carry val_acc) or, for link prediction,
MRR (val_mrr). Nothing is rewritten when the summary is unchanged.
"""

import argparse
import io
import shlex
import statistics
from pathlib import Path
from typing import Any

from dglkit import jobfiles
from dglkit.blame import history
from dglkit.common import UserError, emit_result, is_regular, read_json, read_text, replace_file, write_json
from dglkit.jobstate import snapshot


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--job-dir", required=True, type=Path, help="job directory holding metrics.jsonl")


def run(args: argparse.Namespace) -> int:
    summary = write_summary(args.job_dir)
    emit_result({"changed": summary.pop("changed"), **summary})
    return 0


def write_summary(job_dir: Path) -> dict[str, Any]:
    """Write summary.{json,txt} and curves.png unless they are current; returns {"changed", "summary": the
    summary.txt path, the headline figures}."""
    events = read_metrics(job_dir / "metrics.jsonl")
    epochs = [event for event in events if event.get("event") == "epoch"]
    if not epochs and not (job_dir / "nodes").is_dir():
        raise UserError(f"{job_dir / 'metrics.jsonl'} has no epoch line and no node ran in {job_dir}: pass the "
                        "directory of a job that started")
    # result.json holds the test event's figures (and the run's settings).
    summary = summarise(job_dir, events, jobfiles.record(job_dir / "result.json", jobfiles.EVENT))
    outputs = [job_dir / name for name in ("summary.json", "summary.txt", "curves.png")]
    if read_json(outputs[0]) == summary and all(map(is_regular, outputs[:3 if epochs else 2])):
        return {"changed": False, "summary": str(outputs[1]), **headline(summary)}
    if epochs:
        plot(epochs, summary, outputs[2])
    replace_file(outputs[1], text(summary).encode())
    write_json(outputs[0], summary)
    return {"changed": True, "summary": str(outputs[1]), **headline(summary)}


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """The events of metrics.jsonl; none when the program wrote none (yet)."""
    try:
        lines = read_text(path).splitlines()
    except FileNotFoundError:
        return []
    except OSError as error:
        raise UserError(f"{path}: {error.strerror}: the job replaced it, nothing to summarise") from None
    events = []
    for number, line in enumerate(lines, 1):
        try:
            events.append(jobfiles.event(line))
        except jobfiles.Unreadable as error:
            if number < len(lines):  # a killed trainer may leave half a last line; anything else is corrupt
                raise UserError(f"{path}:{number} {error}") from None
    return events


def summarise(job_dir: Path, events: list[dict[str, Any]], result: dict[str, Any] | None) -> dict[str, Any]:
    """What ran and how it ended, each attempt, and (once an epoch is done) the training figures."""
    config = jobfiles.record(job_dir / "job.json", jobfiles.JOB) or {}
    start = next((event for event in events if event.get("event") == "start"), {})
    epochs = [event for event in events if event.get("event") == "epoch"]
    part_config = start.get("part_config") or config.get("part_config")
    partition = jobfiles.record(Path(part_config), jobfiles.PARTITION) if part_config else None
    machines = partition.get("num_parts") if partition else None
    ending = outcome(job_dir, config)
    summary = {
        "job_dir": str(job_dir.resolve()), "dataset": describe_dataset(part_config),
        "graph_name": partition.get("graph_name") if partition else None, "machines": machines,
        "command": config.get("command") or (shlex.join(["dglkit", "train", *config["train_args"]])
                                              if "train_args" in config else None),
        "nodes": config.get("nodes", []), "state": ending.get("state"), "outcome": ending.get("message"),
        "attempts_run": ending.get("attempts_run", ending.get("attempt")), "restarts": restarts(job_dir, events),
        "metrics_written": bool(events), "epochs": len(epochs), "planned_epochs": start.get("num_epochs"),
        "progress": epochs[-1] if epochs else None,
    }
    summary["title"] = f"{summary['dataset'] or job_dir.name}: {machines or '?'} machines"
    if epochs:
        summary.update(training(start, epochs, events, result, machines))
        summary["title"] += f" x {summary['trainers_per_machine'] or '?'} trainers"
    return summary


def outcome(job_dir: Path, config: dict[str, Any]) -> dict[str, Any]:
    """How the job ended by its nodes' files (dglkit watch's verdict); {} when no node ran here."""
    nodes = config.get("nodes") or sorted(path.name for path in (job_dir / "nodes").glob("*") if path.is_dir())
    if not nodes:
        return {}
    state = snapshot(job_dir, nodes, config.get("stale_after", 120.0), final=False)
    if state["state"] == "stopped":
        state["message"] = "stopped on request"
    elif state["state"] == "failed" and "message" not in state:
        state["message"] = f"failed on {state['failed_node']}: {state['reason']}"
    return state


def training(start: dict[str, Any], epochs: list[dict[str, Any]], events: list[dict[str, Any]],
             result: dict[str, Any] | None, machines: int | None) -> dict[str, Any]:
    """The figures of the epochs done: metric, best epoch, test results, timings."""
    test = next((event for event in reversed(events) if event.get("event") == "test"), result or {})
    metric = task_metric(epochs)
    trainers = start.get("num_trainers", epochs[-1].get("num_trainers"))
    best = max(epochs, key=lambda event: event[f"val_{metric}"])
    # The first epoch carries start-up costs (connections, caches); later ones show the steady state.
    steady = epochs[1:] or epochs
    return {
        "trainers": trainers, "trainers_per_machine": trainers // machines if machines and trainers else None,
        "graphbolt": start.get("graphbolt"),
        "task": start.get("task", "node_classification"), "metric": metric, "final_loss": epochs[-1]["loss"],
        f"final_val_{metric}": epochs[-1][f"val_{metric}"], f"best_val_{metric}": best[f"val_{metric}"],
        "best_epoch": best["epoch"], f"test_{metric}": test.get(f"test_{metric}"),
        f"best_test_{metric}": test.get(f"best_test_{metric}"),
        "mean_epoch_time": statistics.fmean(event["epoch_time"] for event in steady),
        "first_epoch_time": epochs[0]["epoch_time"],
        "seeds_per_s": statistics.fmean(event["seeds_per_s"] for event in steady),
        "complete": f"test_{metric}" in test, "result": result,
    }


def task_metric(epochs: list[dict[str, Any]]) -> str:
    """'acc' (node classification) or 'mrr' (link prediction): what the trainer validated with."""
    return "mrr" if "val_mrr" in epochs[0] else "acc"


def restarts(job_dir: Path, events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each failed attempt that was restarted: the process that failed first, the epoch the next attempt resumed at
    and the time lost (from the checkpointed epoch to the resumed start: the work redone plus the downtime). An
    attempt whose successor left no "resume" record (a program that writes no checkpoint) started over."""
    failures = history(job_dir)
    resumes = resumes_by_attempt(job_dir, events, [past["failed_time"] for past in failures])
    found = []
    for past in failures:
        resume = resumes.get(past["attempt"] + 1, {})
        found.append({"attempt": past["attempt"], "node": past["node"], "process": past["process"],
                      "reason": past["reason"], "resumed_at_epoch": resume.get("epoch"),
                      "time_lost": resume.get("time_lost")})
    return found


def resumes_by_attempt(job_dir: Path, events: list[dict[str, Any]],
                       failed_times: list[float | None]) -> dict[int, dict[str, Any]]:
    """attempt -> {"epoch", "time_lost"} of the "resume" record that attempt wrote. A resume loads the last
    checkpoint, whose curves may lack an earlier attempt's resume (that attempt failed before it checkpointed), so
    every attempt's metrics.jsonl as it was (attempts/<n>/) is read too. A record names its attempt; one that does
    not (a program's own) belongs to the attempt running at its time: after the failures before it."""
    files = [events] + [read_events(path) for path in sorted(job_dir.glob("attempts/*/metrics.jsonl"))]
    found: dict[int, dict[str, Any]] = {}
    for lines in files:
        for index, event in enumerate(lines):
            if event.get("event") != "resume" or not isinstance(event.get("epoch"), int):
                continue
            attempt = event.get("attempt") or 1 + sum(isinstance(t, (int, float)) and t < event.get("time", 0)
                                                      for t in failed_times)
            checkpointed = next((earlier for earlier in reversed(lines[:index]) if earlier.get("event") == "epoch"
                                 and earlier.get("epoch") == event["epoch"] - 1 and "time" in earlier), None)
            found[attempt] = {"epoch": event["epoch"], "time_lost": event["time"] - checkpointed["time"]
                              if checkpointed and "time" in event else None}
    return found


def read_events(path: Path) -> list[dict[str, Any]]:
    """An earlier attempt's metrics.jsonl; none when it cannot be read as the report reads the current one."""
    try:
        return read_metrics(path)
    except UserError:
        return []


def describe_dataset(part_config: str | None) -> str | None:
    """'<source> (N nodes, E edges)' through the partition's manifest and the dataset it names."""
    if not part_config:
        return None
    manifest = jobfiles.record(Path(part_config).parent / "manifest.json", jobfiles.MANIFEST) or {}
    dataset = jobfiles.record(Path(manifest["dataset_dir"]) / "dataset.json", jobfiles.DATASET,
                              required=("source", "num_nodes", "num_edges")) if "dataset_dir" in manifest else None
    if not dataset:
        return Path(part_config).stem
    return f"{dataset['source']} ({dataset['num_nodes']:,} nodes, {dataset['num_edges']:,} edges)"


def percent(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.2f}%"


NAMES = {"acc": "accuracy", "mrr": "MRR"}


def text(summary: dict[str, Any]) -> str:
    lines = [summary["title"]]
    if summary["state"]:
        lines.append(f"outcome         {summary['outcome'] or summary['state']}")
    if summary["command"]:
        lines.append(f"ran             {summary['command']}" + (f" on {', '.join(summary['nodes'])}" if summary["nodes"] else ""))
    if summary["epochs"]:
        lines += training_lines(summary)
    else:
        lines.append(f"progress        {no_epochs(summary)}")
    lines.append(f"job             {summary['job_dir']}")
    for restart in summary["restarts"]:
        lost = "?" if restart["time_lost"] is None else f"{restart['time_lost']:.0f} s"
        again = f"resumed at epoch {restart['resumed_at_epoch']}, {lost} lost" if restart["resumed_at_epoch"] is not None \
            else "started over (no checkpoint)"
        lines.append(f"restart         attempt {restart['attempt']} failed on {restart['node']} ({restart['process']}: "
                     f"{restart['reason']}); {again}")
    return "\n".join(lines) + "\n"


def no_epochs(summary: dict[str, Any]) -> str:
    """The progress of a job without epoch records: a program that ended well need not write any."""
    if summary["state"] != "succeeded":
        return "no epoch finished"
    return ("the program finished; its metrics.jsonl has no epoch record" if summary["metrics_written"]
            else "the program finished and wrote no metrics.jsonl")


def training_lines(summary: dict[str, Any]) -> list[str]:
    m = summary["metric"]
    # Accuracy reads as a percentage, MRR as the fraction it is.
    show = percent if m == "acc" else (lambda value: "-" if value is None else f"{value:.4f}")
    return [
        f"task            {summary['task']}",
        f"epochs          {summary['epochs']} of {summary['planned_epochs'] or '?'}"
        f"{'' if summary['complete'] else '  (no test result: job incomplete)'}",
        f"{'val ' + NAMES[m]:<15} final {show(summary[f'final_val_{m}'])}, best "
        f"{show(summary[f'best_val_{m}'])} (epoch {summary['best_epoch']})",
        f"{'test ' + NAMES[m]:<15} {show(summary[f'best_test_{m}'])} best validation model, "
        f"{show(summary[f'test_{m}'])} final model",
        f"final loss      {summary['final_loss']:.4f}",
        f"epoch time      {summary['mean_epoch_time']:.2f} s mean after the first ({summary['first_epoch_time']:.2f} s)",
        f"throughput      {summary['seeds_per_s']:,.0f} seeds/s",
        f"graphbolt       {'yes' if summary['graphbolt'] else 'no'}",
    ]


def headline(summary: dict[str, Any]) -> dict[str, Any]:
    if not summary["epochs"]:
        return {"epochs": 0, "state": summary["state"]}
    m = summary["metric"]
    keys = ("epochs", "state", f"final_val_{m}", f"best_val_{m}", f"test_{m}", f"best_test_{m}", "mean_epoch_time")
    return {key: summary[key] for key in keys}


def plot(epochs: list[dict[str, Any]], summary: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")  # nodes have no display
    import matplotlib.pyplot as plt

    x = [event["epoch"] for event in epochs]
    fig, (loss, acc, seconds) = plt.subplots(1, 3, figsize=(13, 3.8))
    loss.plot(x, [event["loss"] for event in epochs], marker="o")
    loss.set(title="training loss", xlabel="epoch")
    m = summary["metric"]
    if all(f"train_{m}" in event for event in epochs):
        acc.plot(x, [event[f"train_{m}"] for event in epochs], marker="o", label="train")
    acc.plot(x, [event[f"val_{m}"] for event in epochs], marker="o", label="validation")
    for key, style, label in ((f"best_test_{m}", "-", "test (best validation model)"), (f"test_{m}", "--", "test (final)")):
        if summary[key] is not None:
            acc.axhline(summary[key], color="grey", linestyle=style, label=label)
    acc.set(title=NAMES[m], xlabel="epoch", ylim=(0, 1))
    acc.legend()
    seconds.bar(x, [event["epoch_time"] for event in epochs])
    seconds.set(title="epoch time (s)", xlabel="epoch")
    for axis in (loss, acc, seconds):
        axis.grid(alpha=0.3)
        axis.xaxis.get_major_locator().set_params(integer=True)
    fig.suptitle(summary["title"])
    fig.tight_layout()
    image = io.BytesIO()
    fig.savefig(image, format="png", dpi=90)
    plt.close(fig)
    replace_file(path, image.getvalue())
