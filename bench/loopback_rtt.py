"""A loopback TCP round trip (docs/CLUSTER.md section 3): 16 bytes each way with TCP_NODELAY, a Python ping-pong between two
threads of one process. Usage: taskset -c 0 python bench/loopback_rtt.py"""
import socket, threading, time
s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen(1); port = s.getsockname()[1]
def srv():
    c, _ = s.accept(); c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    while True:
        d = c.recv(64)
        if not d: break
        c.sendall(d)
threading.Thread(target=srv, daemon=True).start()
c = socket.create_connection(("127.0.0.1", port)); c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
n = 5000; t0 = time.perf_counter()
for _ in range(n):
    c.sendall(b"x" * 16); c.recv(64)
print(f"loopback TCP round trip: {1e6 * (time.perf_counter() - t0) / n:.1f} us (n={n}, python, one process two threads)")
