"""The bench's target (bench/stacks/run.py): THREADS threads parked DEPTH Python frames deep, and
one spinning thread that watches its own clock. Whenever two consecutive looks at the clock are
more than GAP_US apart, the spinner was not running in between (descheduled, or stopped by
ptrace): it prints the gap's start and length on exit (time.monotonic, the bench's clock), so
the bench can tell whether its reads stopped the process, from the target's own point of view.
Ends when stdin closes."""
import os
import sys
import threading
import time

THREADS = int(os.environ.get("THREADS", "8"))
DEPTH = int(os.environ.get("DEPTH", "30"))
GAP_US = int(os.environ.get("GAP_US", "500"))
park = threading.Event()
done = threading.Event()
gaps = []


def nest(n):
    if n == 0:
        park.wait()
    else:
        nest(n - 1)


def spin():
    # The one thread that runs: the others are parked, so the GIL does not cut this loop.
    now = time.monotonic
    limit = GAP_US / 1e6
    last = now()
    while not done.is_set():
        t = now()
        if t - last > limit:
            gaps.append((last, t - last))
        last = t


threads = [threading.Thread(target=nest, args=(DEPTH,), daemon=True) for _ in range(THREADS)]
for t in threads:
    t.start()
spinner = threading.Thread(target=spin)
spinner.start()
print("ready", flush=True)
sys.stdin.read()
done.set()
spinner.join()
for start, length in gaps:
    print(f"gap {start:.6f} {length * 1e3:.3f}")
