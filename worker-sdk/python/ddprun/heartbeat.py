"""heartbeat(): tells ddprun's hang detection (--hang-timeout) that this worker makes progress.

One datagram to the Unix socket ddprun names in DDPRUN_HEARTBEAT_SOCKET; the agent knows the
sender from the kernel. It never blocks and never raises: call it once per training step. The
first call also starts the flight-recorder responder (ddprun/flight_recorder.py).
"""
import os
import socket

from ddprun.flight_recorder import serve_flight_recorder

_sock = None
_owner = None  # the pid that opened _sock: a forked child (a DataLoader worker) opens its own


def heartbeat():
    global _sock, _owner
    path = os.environ.get("DDPRUN_HEARTBEAT_SOCKET")
    if not path:
        return
    try:
        if _sock is None or _owner != os.getpid():
            _sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            _sock.setblocking(False)
            _owner = os.getpid()
            serve_flight_recorder()  # a hang can then name its collective
        _sock.sendto(b"", path)
    except OSError:
        pass  # the agent is busy or gone: a missed beat is not an error
