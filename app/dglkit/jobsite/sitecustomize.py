"""Imported first by every Python process of a job: the launcher puts this directory at the front of
PYTHONPATH. An uncaught exception ends the process at once, with its traceback. Without this, DGL's exit
handler waits for the other trainers, which wait in an all-reduce for this one: the process never exits,
its launcher never sees it end, and the job hangs instead of failing. A sampler (a multiprocessing child of a
trainer) whose work raises ends the same way; its trainer would otherwise wait half an hour for its batch.

Before it exits, a server, trainer or sampler leaves `failure-<pid>.json` in $DGLKIT_FAILURE_DIR (its node's
directory of the job): its name, the error, the line that raised it and the traceback. The file's time is the
shared filesystem's: `dglkit watch` orders the failures of all nodes by it to name the one that came first
(dglkit/blame.py), and the launcher stops the job as soon as it appears.

A trainer connects to DGL's servers once they listen: DGL's client tries each server and, refused, waits 3 s
before it tries again, and the kit starts trainers together with the servers, so a trainer would often be there
first and lose those seconds. Each launcher says in its status.json when its servers listen
($DGLKIT_SERVER_STATUS: every node's); the wait is at DGL's own connect_to_server, wrapped as DGL imports it.
Another node's file may show late (a shared filesystem's cache): that wait ends 3 s (DGL's retry) after this
node's servers listen.

A DGL server of a kit's job waits HANDSHAKE_SLEEP seconds, not 3, after the last client registered before it
connects back to the clients (DGL's rpc_server sleeps 3 s for "clients' receivers ready"): a client listens a
moment after it registers, and a connection refused is tried again, 3 s later, by DGL itself. Every job starts
about 3 s sooner.

A DGL server of a job with `node_data_names` ($DGLKIT_NODE_DATA_NAMES: {stored key: served key}) serves its
partition's node data under the names the program reads: the keys are renamed as DGL loads the part's
node_feat.dgl, so no data is copied (dglkit.nodedata).

(It takes the place of Debian's sitecustomize, which only installs apport's crash hook.)
"""
import importlib.abc
import importlib.util
import json
import multiprocessing.process
import os
import sys
import time
import traceback

# A kit job's servers wait this long, not DGL's 3 s, before they connect back to the clients that registered.
HANDSHAKE_SLEEP = 0.2


def process_name() -> str | None:
    """server-<i> (the launcher says so), trainer-<rank>, or trainer-<rank>-sampler in a trainer's child;
    None for any other process (a plain run's torchrun: its trainers' failures are theirs)."""
    name = os.environ.get("DGLKIT_PROCESS") or (f"trainer-{os.environ['RANK']}" if "RANK" in os.environ else None)
    if name and multiprocessing.process.parent_process() is not None:
        return f"{name}-sampler"
    return name


def record_failure(kind, value, tb) -> None:
    directory, name = os.environ.get("DGLKIT_FAILURE_DIR"), process_name()
    if not directory or not name:
        return
    frames = traceback.extract_tb(tb)
    where = f"{frames[-1].filename}:{frames[-1].lineno} in {frames[-1].name}" if frames else None
    error = " ".join(line.strip() for line in traceback.format_exception_only(kind, value))[:500]
    record = {"node": os.environ.get("DGLKIT_NODE"), "process": name, "pid": os.getpid(),
              "attempt": int(os.environ.get("DGLKIT_ATTEMPT", "1")), "error": error,
              "where": where, "traceback": "".join(traceback.format_exception(kind, value, tb)).splitlines(),
              "time": time.time()}
    path = os.path.join(directory, f"failure-{os.getpid()}.json")
    try:
        with open(path + ".tmp", "w") as out:
            json.dump(record, out, indent=1)
        os.replace(path + ".tmp", path)
    except OSError:
        pass  # the traceback is in the log all the same


def exit_on_uncaught_exception(kind, value, tb) -> None:
    traceback.print_exception(kind, value, tb)
    sys.stdout.flush()
    sys.stderr.flush()
    record_failure(kind, value, tb)
    os._exit(1)


def serve_node_data_as(served: dict[str, str]) -> None:
    from dgl.distributed import dist_graph

    load = dist_graph.load_partition_feats

    def load_renamed(*args, **kwargs):
        node_feats, edge_feats = load(*args, **kwargs)
        if node_feats is not None:
            node_feats = {served.get(key, key): value for key, value in node_feats.items()}
        return node_feats, edge_feats

    dist_graph.load_partition_feats = load_renamed


def servers_listen(paths: list[str], attempt: int) -> dict[str, bool]:
    """Whether each launcher (its status.json) says its servers listen in this attempt."""
    said = {}
    for path in paths:
        try:
            with open(path) as status:
                record = json.load(status)
        except (OSError, ValueError):
            record = {}
        said[path] = bool(record.get("listening")) and record.get("attempt") == attempt
    return said


def wait_for_servers(paths: list[str], own: str) -> None:
    attempt, own_since = int(os.environ.get("DGLKIT_ATTEMPT", "1")), None
    while not all((said := servers_listen(paths, attempt)).values()):
        if own_since is None and said.get(own):
            own_since = time.monotonic()
        if own_since is not None and time.monotonic() - own_since > 3:
            return
        time.sleep(0.05)


def connect_once_servers_listen(rpc_client, paths: list[str], own: str) -> None:
    connect = rpc_client.connect_to_server

    def connect_to_server(*args, **kwargs):
        wait_for_servers(paths, own)
        return connect(*args, **kwargs)

    rpc_client.connect_to_server = connect_to_server


class ShortHandshakeSleeps:
    """The time module as DGL's rpc_server sees it, with sleeps of at most HANDSHAKE_SLEEP seconds."""

    def __getattr__(self, name: str):
        return getattr(time, name)

    @staticmethod
    def sleep(seconds: float) -> None:
        time.sleep(min(seconds, HANDSHAKE_SLEEP))


class AfterImport(importlib.abc.MetaPathFinder):
    """Finds one module for the import system and calls `then` on it once it is loaded, before the modules that
    import it take names from it (dist_context takes connect_to_server from rpc_client)."""

    def __init__(self, name: str, then) -> None:
        self.name, self.then = name, then

    def find_spec(self, name, path, target=None):
        if name != self.name:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        load = spec.loader.exec_module

        def exec_module(module) -> None:
            load(module)
            self.then(module)

        spec.loader.exec_module = exec_module
        return spec


def run_or_exit(self) -> None:
    """multiprocessing's Process.run, ending the process as an uncaught exception does in the main process."""
    try:
        original_run(self)
    except Exception:
        exit_on_uncaught_exception(*sys.exc_info())


sys.excepthook = exit_on_uncaught_exception
original_run = multiprocessing.process.BaseProcess.run
# A method replaced on purpose: every sampler child runs through run_or_exit (see the module docstring).
multiprocessing.process.BaseProcess.run = run_or_exit  # type: ignore[method-assign]
if os.environ.get("DGL_ROLE") == "client" and os.environ.get("DGLKIT_SERVER_STATUS"):
    own_status = os.path.join(os.environ["DGLKIT_FAILURE_DIR"], "status.json")
    sys.meta_path.insert(0, AfterImport("dgl.distributed.rpc_client", lambda module: connect_once_servers_listen(
        module, os.environ["DGLKIT_SERVER_STATUS"].split(","), own_status)))
if os.environ.get("DGL_ROLE") == "server" and os.environ.get("DGLKIT_FAILURE_DIR"):
    sys.meta_path.insert(0, AfterImport("dgl.distributed.rpc_server",
                                        lambda module: setattr(module, "time", ShortHandshakeSleeps())))
if os.environ.get("DGL_ROLE") == "server" and os.environ.get("DGLKIT_NODE_DATA_NAMES"):
    try:
        serve_node_data_as(json.loads(os.environ["DGLKIT_NODE_DATA_NAMES"]))
    except Exception:
        # Python would carry on after a failed sitecustomize, and the program would then miss its data by name.
        exit_on_uncaught_exception(*sys.exc_info())
