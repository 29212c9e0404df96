"""What jobsite/sitecustomize.py changes in DGL's start of a kit job's processes, seen from real DGL imports in
processes with the kit's environment (the real handshake runs in every local job of test_launch.py)."""

import json
import os
import subprocess
import sys
from pathlib import Path

JOBSITE = Path(__file__).resolve().parents[2] / "app" / "dglkit" / "jobsite"


def python(code: str, **env: str) -> str:
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False,
                          env={**os.environ, "PYTHONPATH": str(JOBSITE), "DGLBACKEND": "pytorch", **env})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def test_a_server_connects_back_to_its_clients_without_dgls_3_s_sleep(tmp_path):
    out = python("""
import time
from dgl.distributed import rpc_server
started = time.monotonic()
rpc_server.time.sleep(3)  # DGL's "wait for clients' receivers ready"
print(time.monotonic() - started, rpc_server.time.monotonic is time.monotonic)
""", DGL_ROLE="server", DGLKIT_FAILURE_DIR=str(tmp_path))
    slept, same_clock = out.split()
    assert float(slept) < 1 and same_clock == "True", out


def write_status(path: Path, listening: bool, attempt: int = 1) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"state": "running", "attempt": attempt, "listening": listening}))


def test_a_trainer_connects_once_every_nodes_servers_listen(tmp_path):
    own, peer = tmp_path / "n1/status.json", tmp_path / "n2/status.json"
    write_status(own, True)
    write_status(peer, False)
    code = f"""
import threading, time, json
from dgl.distributed import dist_context
# The kit's, which DGL's initialize() calls.
assert dist_context.connect_to_server.__qualname__.startswith("connect_once_servers_listen"), dist_context.connect_to_server
import sitecustomize
def peer_listens():
    time.sleep(1)
    open({str(peer)!r}, "w").write(json.dumps({{"attempt": 1, "listening": True}}))
threading.Thread(target=peer_listens).start()
started = time.monotonic()
sitecustomize.wait_for_servers({[str(own), str(peer)]!r}, {str(own)!r})
print(time.monotonic() - started)
"""
    env = {"DGL_ROLE": "client", "DGLKIT_FAILURE_DIR": str(own.parent), "DGLKIT_SERVER_STATUS": f"{own},{peer}"}
    assert 0.9 < float(python(code, **env)) < 2.9
    # A peer whose file does not say so (another attempt's, or a shared filesystem that shows it late): the wait
    # ends 3 s after this node's servers listen, and DGL's own retries take over.
    write_status(peer, True, attempt=0)
    assert 2.9 < float(python(code.replace("time.sleep(1)", "return"), **env)) < 5
