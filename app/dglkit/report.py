"""`dglkit report`: summarise a job from the trainer's metrics.jsonl (and result.json when present).

Writes <job dir>/summary.json, summary.txt (one screen) and curves.png (loss, the task's metric and epoch
time per epoch). The metric is accuracy (epoch events carry val_acc) or, for link prediction, MRR (val_mrr).
Nothing is rewritten when the summary is unchanged.
"""

import argparse
import io
import json
import statistics
from pathlib import Path
from typing import Any

from dglkit.common import UserError, emit_result, is_regular, read_json, read_text, replace_file, write_json


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--job-dir", required=True, type=Path, help="job directory holding metrics.jsonl")


def run(args: argparse.Namespace) -> int:
    job_dir: Path = args.job_dir
    events = read_metrics(job_dir / "metrics.jsonl")
    summary = summarise(job_dir, events, read_json(job_dir / "result.json"))
    outputs = [job_dir / name for name in ("summary.json", "summary.txt", "curves.png")]
    if read_json(outputs[0]) == summary and all(map(is_regular, outputs)):
        emit_result({"changed": False, "summary": str(outputs[1]), **headline(summary)})
        return 0
    epochs = [event for event in events if event.get("event") == "epoch"]
    plot(epochs, summary, outputs[2])
    replace_file(outputs[1], text(summary).encode())
    write_json(outputs[0], summary)
    emit_result({"changed": True, "summary": str(outputs[1]), **headline(summary)})
    return 0


def read_metrics(path: Path) -> list[dict[str, Any]]:
    try:
        lines = read_text(path).splitlines()
    except FileNotFoundError:
        raise UserError(f"{path} not found: pass the --job-dir whose trainer wrote metrics.jsonl") from None
    except OSError as error:
        raise UserError(f"{path}: {error.strerror}: the job replaced it, nothing to summarise") from None
    events = []
    for number, line in enumerate(lines, 1):
        try:
            events.append(json.loads(line))
        except ValueError:
            if number < len(lines):  # a killed trainer may leave half a last line; anything else is corrupt
                raise UserError(f"{path}:{number}: not a JSON line") from None
    if not any(event.get("event") == "epoch" for event in events):
        raise UserError(f"{path} has no epoch line yet: the job has not finished an epoch")
    return events


def summarise(job_dir: Path, events: list[dict[str, Any]], result: dict[str, Any] | None) -> dict[str, Any]:
    start = next((event for event in events if event.get("event") == "start"), {})
    epochs = [event for event in events if event.get("event") == "epoch"]
    test = next((event for event in reversed(events) if event.get("event") == "test"), result or {})
    metric = task_metric(epochs)
    partition = read_json(Path(start["part_config"])) if start.get("part_config") else None
    machines = partition.get("num_parts") if partition else None
    trainers = start.get("num_trainers", epochs[-1].get("num_trainers"))
    best = max(epochs, key=lambda event: event[f"val_{metric}"])
    # The first epoch carries start-up costs (connections, caches); later ones show the steady state.
    steady = epochs[1:] or epochs
    summary = {
        "job_dir": str(job_dir.resolve()), "dataset": describe_dataset(start.get("part_config")),
        "graph_name": partition.get("graph_name") if partition else None,
        "machines": machines, "trainers": trainers,
        "trainers_per_machine": trainers // machines if machines and trainers else None,
        "graphbolt": start.get("graphbolt"), "epochs": len(epochs), "planned_epochs": start.get("num_epochs"),
        "task": start.get("task", "node_classification"), "metric": metric, "final_loss": epochs[-1]["loss"],
        f"final_val_{metric}": epochs[-1][f"val_{metric}"], f"best_val_{metric}": best[f"val_{metric}"],
        "best_epoch": best["epoch"], f"test_{metric}": test.get(f"test_{metric}"),
        f"best_test_{metric}": test.get(f"best_test_{metric}"),
        "mean_epoch_time": statistics.fmean(event["epoch_time"] for event in steady),
        "first_epoch_time": epochs[0]["epoch_time"],
        "seeds_per_s": statistics.fmean(event["seeds_per_s"] for event in steady),
        "complete": f"test_{metric}" in test, "result": result, "restarts": restarts(job_dir, events),
    }
    summary["title"] = f"{summary['dataset'] or job_dir.name}: {machines or '?'} machines x " \
                       f"{summary['trainers_per_machine'] or '?'} trainers"
    return summary


def task_metric(epochs: list[dict[str, Any]]) -> str:
    """'acc' (node classification) or 'mrr' (link prediction): what the trainer validated with."""
    return "mrr" if "val_mrr" in epochs[0] else "acc"


def restarts(job_dir: Path, events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each failed attempt that was restarted: what failed, the epoch it resumed at and the time lost (from the
    checkpointed epoch to the resumed start: the work redone plus the downtime)."""
    failures = {int(path.parent.name): read_json(path) or {} for path in job_dir.glob("attempts/*/FAILED")
                if path.parent.name.isdigit()}
    resumes = [event for event in events if event.get("event") == "resume"]
    found = []
    for attempt, resume in zip(sorted(failures), resumes):
        failure = failures[attempt]
        checkpointed = next((event for event in events if event.get("event") == "epoch"
                             and event["epoch"] == resume["epoch"] - 1 and "time" in event), None)
        found.append({"attempt": attempt, "node": failure.get("node"), "process": failure.get("process"),
                      "reason": failure.get("reason"), "resumed_at_epoch": resume["epoch"],
                      "time_lost": resume["time"] - checkpointed["time"] if checkpointed else None})
    return found


def describe_dataset(part_config: str | None) -> str | None:
    """'<source> (N nodes, E edges)' through the partition's manifest and the dataset it names."""
    if not part_config:
        return None
    manifest = read_json(Path(part_config).parent / "manifest.json")
    dataset = read_json(Path(manifest["dataset_dir"]) / "dataset.json") if manifest else None
    if not dataset:
        return Path(part_config).stem
    return f"{dataset['source']} ({dataset['num_nodes']:,} nodes, {dataset['num_edges']:,} edges)"


def percent(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.2f}%"


NAMES = {"acc": "accuracy", "mrr": "MRR"}


def text(summary: dict[str, Any]) -> str:
    m = summary["metric"]
    # Accuracy reads as a percentage, MRR as the fraction it is.
    show = percent if m == "acc" else (lambda value: "-" if value is None else f"{value:.4f}")
    lines = [
        summary["title"],
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
        f"job             {summary['job_dir']}",
    ]
    for restart in summary["restarts"]:
        lost = "?" if restart["time_lost"] is None else f"{restart['time_lost']:.0f} s"
        lines.append(f"restart         attempt {restart['attempt']} failed on {restart['node']} ({restart['process']}: "
                     f"{restart['reason']}); resumed at epoch {restart['resumed_at_epoch']}, {lost} lost")
    return "\n".join(lines) + "\n"


def headline(summary: dict[str, Any]) -> dict[str, Any]:
    m = summary["metric"]
    keys = ("epochs", f"final_val_{m}", f"best_val_{m}", f"test_{m}", f"best_test_{m}", "mean_epoch_time")
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
