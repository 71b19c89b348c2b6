"""A Python process for tests/integration/stacks: the main thread is stuck_here(), blocked
reading the pipe the test holds (its fd in STACKS_TEST_FD); three threads wait in worker_wait()
on an Event. It prints "ready" once every thread has started; a byte on the pipe lets it exit 0."""
import os
import threading

FD = int(os.environ["STACKS_TEST_FD"])
release = threading.Event()


def worker_wait(n):
    release.wait()  # WORKER_LINE


def stuck_here():
    os.read(FD, 1)  # STUCK_LINE


def main():
    threads = [threading.Thread(target=worker_wait, args=(i,), name=f"w{i}") for i in range(3)]
    for t in threads:
        t.start()
    print("ready", flush=True)
    stuck_here()
    release.set()
    for t in threads:
        t.join()


main()
