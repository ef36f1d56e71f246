"""What torchrun's env:// rendezvous does with the variables a step's tasks get: rank 0
listens on MASTER_ADDR:MASTER_PORT, every other rank connects and sends its RANK, and
rank 0 checks that WORLD_SIZE ranks, each once, arrived. Prints one line per rank."""
import os
import socket
import sys
import time

env = {k: os.environ[k] for k in
       ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK",
        "LOCAL_WORLD_SIZE", "NODE_RANK")}
rank, world = int(env["RANK"]), int(env["WORLD_SIZE"])
addr = (env["MASTER_ADDR"], int(env["MASTER_PORT"]))
if rank == 0:
    srv = socket.create_server(addr, reuse_port=False)
    srv.settimeout(60)
    seen = {0}
    while len(seen) < world:
        conn, _ = srv.accept()
        with conn:
            r = int(conn.recv(16).decode())
            assert r not in seen, f"rank {r} twice"
            seen.add(r)
            conn.sendall(b"ok")
    print(f"rendezvous of {world} ranks at {addr[0]}:{addr[1]} complete", flush=True)
else:
    deadline = time.time() + 60
    while True:
        try:
            with socket.create_connection(addr, timeout=5) as c:
                c.sendall(str(rank).encode())
                assert c.recv(2) == b"ok"
                break
        except OSError:
            if time.time() > deadline:
                sys.exit(f"rank {rank}: nobody listens at {addr}")
            time.sleep(0.1)
print(" ".join(f"{k}={v}" for k, v in sorted(env.items())), flush=True)
