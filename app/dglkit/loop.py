"""The training loop of every built-in task: epochs of steps, heartbeats, evaluation, the best-validation
model, checkpoints and resume, metrics.jsonl, result.json and the model files.

A task (dglkit.sage, dglkit.rgcn, dglkit.linkpred) builds its model, optimizers and loader and says how to take
one step and how to evaluate; everything else is here, so that every task checkpoints and resumes alike.
"""

import argparse
import copy
import json
import os
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Protocol, TextIO

import numpy as np
import torch

from dglkit import checkpoint
from dglkit.common import CHECKPOINT, UserError, beat


class Task(Protocol):
    """What a task hands the loop. `model` is wrapped in DistributedDataParallel; `embeddings` are the
    DistEmbeddings that `sparse_optimizer` (DGL's distributed SparseAdam) trains, empty when there are none."""

    metric: str  # the validation figure that picks the best model: "acc" or "mrr"
    counts_correct: bool  # steps report correct predictions (train_acc)
    tests_every_epoch: bool  # the best model's test figure is the one measured at its epoch
    model: torch.nn.parallel.DistributedDataParallel
    optimizer: torch.optim.Optimizer
    sparse_optimizer: Any
    embeddings: dict[str, Any]
    loader: Iterable

    def step(self, batch: Any) -> tuple[float, int, int]:
        """Train on one batch: (mean loss, correct predictions, seeds)."""

    def evaluate(self, split: str) -> dict[str, float]:
        """Figures on "val" or "test" over all trainers (collective)."""

    def save_outputs(self, rank: int) -> None:
        """Embeddings or predictions in original IDs, as the options ask (collective)."""

    def describe(self) -> dict[str, Any]:
        """What result.json records of the model and graph."""


def fit(args: argparse.Namespace, task: Task) -> None:
    """Train `task` for args.num_epochs, resuming from <out-dir>/checkpoint.pt when a run left one."""
    rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    out_dir = Path(args.out_dir)
    first_epoch, history, best, restored_rows = (checkpoint.load(out_dir, task) if args.checkpoint_every
                                                 else (0, [], None, 0))
    best = best or {"value": -1.0, "epoch": None, "state": None, "test": None}
    metrics = open_metrics(args, world) if rank == 0 else None
    if metrics:
        if first_epoch:
            # Kept in the history, so that the summary can count every restart and the time it cost.
            # The attempt (the launcher's DGLKIT_ATTEMPT) pairs it with the failure it recovered from.
            history.append({"event": "resume", "epoch": first_epoch, "time": time.time(),
                            "attempt": int(os.environ.get("DGLKIT_ATTEMPT", "1"))})
            restored = f" with {restored_rows} rows of learnt embeddings" if task.embeddings else ""
            log(rank, f"resumed from {out_dir / CHECKPOINT} at epoch {first_epoch}{restored}")
        # A resumed run rewrites the curves up to its checkpoint, so they continue without the lost epochs.
        for record in history:
            write_event(metrics, record)

    for epoch in range(first_epoch, args.num_epochs):
        record = train_epoch(args, task, epoch, rank, world)
        start = time.time()
        val = task.evaluate("val")
        test = task.evaluate("test") if task.tests_every_epoch else {}
        record["eval_time"] = time.time() - start
        record.update({f"val_{key}": value for key, value in val.items()})
        record.update({f"test_{key}": value for key, value in test.items()})
        record["time"] = time.time()
        # Validation figures are all-reduced, so every trainer keeps the same epoch's (DDP-synchronised) weights.
        if val[task.metric] > best["value"]:
            best = {"value": val[task.metric], "epoch": epoch, "test": test or None,
                    "state": copy.deepcopy(task.model.module.state_dict())}
        log_epoch(rank, record)
        history.append(record)
        if metrics:
            write_event(metrics, record)
        if args.checkpoint_every and ((epoch + 1) % args.checkpoint_every == 0 or epoch + 1 == args.num_epochs):
            checkpoint.save(out_dir, task, epoch, history, best)

    finish(args, task, history, best, metrics, rank, world)


def train_epoch(args: argparse.Namespace, task: Task, epoch: int, rank: int, world: int) -> dict[str, Any]:
    """One pass over this trainer's share: the epoch's record, summed over all trainers."""
    task.model.train()
    start = time.time()
    totals = torch.zeros(3, dtype=torch.float64)  # loss sum, correct, seeds
    # join() keeps DDP's all-reduce from hanging when trainers have different numbers of batches.
    with task.model.join():
        for step, batch in enumerate(task.loader):
            beat()
            loss, correct, seeds = task.step(batch)
            totals += torch.tensor([loss * seeds, correct, seeds], dtype=torch.float64)
            if step % args.log_every == 0:
                log(rank, f"epoch {epoch} step {step} loss {loss:.4f} seeds {seeds}")
    epoch_time = torch.tensor([time.time() - start], dtype=torch.float64)
    torch.distributed.all_reduce(totals)
    torch.distributed.all_reduce(epoch_time, op=torch.distributed.ReduceOp.MAX)
    loss_sum, correct, seeds = totals.tolist()
    record: dict[str, Any] = {"event": "epoch", "epoch": epoch, "loss": loss_sum / max(seeds, 1)}
    if task.counts_correct:
        record["train_acc"] = correct / max(seeds, 1)
    record.update({"epoch_time": epoch_time.item(), "seeds_per_s": seeds / epoch_time.item(), "num_trainers": world})
    return record


def finish(args: argparse.Namespace, task: Task, history: list[dict], best: dict, metrics: TextIO | None,
           rank: int, world: int) -> None:
    """Test the final and the best-validation model, write the outputs, the test event, the models and
    result.json."""
    test = task.evaluate("test")
    final_state = copy.deepcopy(task.model.module.state_dict())
    if best["test"] is None:
        task.model.module.load_state_dict(best["state"])
        best_test = task.evaluate("test")
    else:
        # Learnt embeddings move on after the best epoch, so that epoch's own test figures stand for it.
        best_test = best["test"]
    last_val = next(record[f"val_{task.metric}"] for record in reversed(history) if record["event"] == "epoch")
    log(rank, f"test_{task.metric} {test[task.metric]:.4f} (final model), {best_test[task.metric]:.4f} (best "
        f"validation model, epoch {best['epoch']}, val_{task.metric} {best['value']:.4f})")
    task.save_outputs(rank)
    if not metrics:
        return
    result = {**{f"test_{key}": value for key, value in test.items()},
              **{f"best_test_{key}": value for key, value in best_test.items()},
              f"val_{task.metric}": last_val, f"best_val_{task.metric}": best["value"], "best_epoch": best["epoch"]}
    write_event(metrics, {"event": "test", **result})
    metrics.close()
    beat()
    out_dir = Path(args.out_dir)
    torch.save(final_state, out_dir / "model.pt")
    torch.save(best["state"], out_dir / "model-best.pt")
    summary = {"task": args.task, "num_epochs": args.num_epochs, "num_hidden": args.num_hidden,
               "num_layers": args.num_layers, "seed": args.seed, "weight_decay": args.weight_decay, **result,
               "num_trainers": world, **task.describe()}
    (out_dir / "result.json").write_text(json.dumps(summary, indent=1) + "\n")


def open_metrics(args: argparse.Namespace, world: int) -> TextIO:
    """Rank 0's metrics.jsonl, opened with the start event (every option of the run)."""
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    metrics = (out_dir / "metrics.jsonl").open("w")
    options = {key: value for key, value in vars(args).items() if key not in ("subcommand", "run")}
    write_event(metrics, {"event": "start", **options, "num_trainers": world})
    return metrics


def log_epoch(rank: int, record: dict) -> None:
    """One progress line per epoch: every numeric figure of the epoch event."""
    figures = " ".join(f"{key} {value:.4f}" if isinstance(value, float) else f"{key} {value}"
                       for key, value in record.items() if key not in ("event", "epoch", "num_trainers", "time"))
    log(rank, f"epoch {record['epoch']}: {figures}")


def to_original_order(values: np.ndarray, orig_nids: np.ndarray) -> np.ndarray:
    """Row i of `values` belongs to partitioned node i, which is original node orig_nids[i]."""
    if len(values) != len(orig_nids):
        raise UserError(f"orig_nids has {len(orig_nids)} rows but the graph has {len(values)} nodes: it belongs "
                        "to another partition; re-run `dglkit partition`")
    ordered = np.empty_like(values)
    ordered[orig_nids] = values
    return ordered


def log(rank: int, message: str) -> None:
    print(f"[rank {rank}] {time.strftime('%H:%M:%S')} {message}", flush=True)


def write_event(stream: TextIO, record: dict) -> None:
    stream.write(json.dumps(record) + "\n")
    stream.flush()
