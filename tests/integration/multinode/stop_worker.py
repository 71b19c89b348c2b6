"""The worker of the stop-sequence tests (multinode/test_stop_nodes.py,
coordinator/test_stop_through_coordinator.py): one script, written into the test's shared folder.
It prints `READY [pid, ppid]` once its handlers are in place."""

# argv: the shared folder, then a mode.
#   checkpoint: saves a checkpoint (in the shared folder) on KeyboardInterrupt
#   stubborn:   notes SIGINT and SIGTERM (one line each, in order) and goes on; only SIGKILL ends it
#   usr1-on-1:  rank 1 has a SIGUSR1 handler, the others none
#   slow-term:  on SIGTERM, takes 1 s to write a checkpoint, then exits 0
WORKER = r'''
import json, os, signal, sys, time
d, mode = sys.argv[1], sys.argv[2]
r = os.environ["RANK"]
def note(name):
    def h(*_):
        with open(os.path.join(d, f"signals-{r}"), "a") as f:
            f.write(name + "\n")
    return h
if mode == "stubborn":
    signal.signal(signal.SIGINT, note("INT"))
    signal.signal(signal.SIGTERM, note("TERM"))
if mode == "usr1-on-1" and r == "1":
    # The launcher stops this rank with SIGTERM once another died of the forwarded SIGUSR1,
    # which can come before Python has run the SIGUSR1 handler, or while it runs (Python's
    # handlers nest). So SIGTERM waits, blocked, until the handler has written its line; then
    # it ends the rank as it would have.
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    def usr1(*_):
        note("USR1")()
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
    signal.signal(signal.SIGUSR1, usr1)
if mode == "slow-term":
    def slow_checkpoint(*_):
        time.sleep(1.0)
        with open(os.path.join(d, f"ckpt-{r}.pt"), "w") as f:
            f.write(f"rank {r} on SIGTERM")
        sys.exit(0)
    signal.signal(signal.SIGTERM, slow_checkpoint)
try:  # READY inside: a SIGINT right after the line must land where it is caught
    print("READY " + json.dumps([os.getpid(), os.getppid()]), flush=True)
    while True:
        time.sleep(1)
except KeyboardInterrupt:
    tmp = os.path.join(d, f"ckpt-{r}.tmp")
    with open(tmp, "w") as f:
        f.write(f"rank {r} step 42")
    os.rename(tmp, os.path.join(d, f"ckpt-{r}.pt"))
'''
