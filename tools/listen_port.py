"""A port for a server the tests or benchmarks start, below the kernel's ephemeral range.

Every socket bound to port 0 and every outgoing connection gets a port of that range
(/proc/sys/net/ipv4/ip_local_port_range), Open MPI's among them: a port picked there could be taken between the
pick and the server's bind (CI saw `Address already in use` from an mpirun world). Below the range only another
explicit bind can take it, and the pick checks that none has.
"""
import random
import socket

LOWEST = 10000


def ephemeral_range():
    try:
        low, high = map(int, open("/proc/sys/net/ipv4/ip_local_port_range").read().split())
        return low, high
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default


def free_port():
    low, _ = ephemeral_range()
    if low - LOWEST >= 1000:
        for _ in range(100):
            port = random.randrange(LOWEST, low)
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    continue
                return port
    with socket.socket() as s:  # a machine whose ephemeral range starts low: the kernel's choice
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
