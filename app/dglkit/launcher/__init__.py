"""`dglkit launch`'s parts, one concern each (dglkit/launch.py is the command and says what it does):

- options: the launcher's settings, job.json over defaults, flags over job.json;
- command: the user's command line, its {placeholders} and the programs it runs;
- preflight: every check that can fail before anything starts, and the job's layout it derives;
- node: this node's state, status.json, launcher.log and the failure records it writes;
- start: the servers' and trainers' environment (DGL's launch.py's and torchrun's) and starting them;
- supervise: the watch over this node's processes and heartbeats during an attempt;
- outside: what other nodes and the operator say (FAILED, STOP, signals, a node gone silent);
- attempts: attempts and restarts, with the barrier between them (attempts/<n>/);
- stop: stopping every process group the launcher started and removing what they left in /dev/shm.
"""
