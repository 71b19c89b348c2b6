#!/usr/bin/python3
"""PyTorch's own TCPStore server (Debian's 1.13: the legacy poll() daemon), for bench/store/run.sh.
Prints "listening on 127.0.0.1:PORT" and serves until killed."""
import datetime
import sys
import time

import torch.distributed as dist

port = int(sys.argv[1]) if len(sys.argv) > 1 else 0
store = dist.TCPStore("127.0.0.1", port, None, True, timeout=datetime.timedelta(hours=1),
                      wait_for_workers=False)
print(f"listening on 127.0.0.1:{store.port}", flush=True)
while True:
    time.sleep(3600)
