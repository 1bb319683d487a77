"""torch 2.x's own TCPStore server (the libuv one, the default since 2.4), the peer ddpstore is
benchmarked against in the 2.x dialect. Prints "listening on 127.0.0.1:PORT" and serves until
SIGTERM/SIGINT. Run with the torch 2.x venv's interpreter.

usage: torch2_store_host.py [--port P]     (P = 0 picks a free port)"""
import signal
import sys

import torch.distributed as dist


def main():
    port = int(sys.argv[2]) if len(sys.argv) == 3 and sys.argv[1] == "--port" else 0
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})
    store = dist.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False,
                          use_libuv=True)
    print(f"listening on 127.0.0.1:{store.port}", flush=True)
    signal.sigwait({signal.SIGTERM, signal.SIGINT})


if __name__ == "__main__":
    main()
