"""What mutual TLS costs on the TCP data plane: ping-pong between two processes, plain vs TLS.

    uv run python bench/tcp_tls.py                      # 4 KiB and 64 MiB, 200 / 10 round trips
    uv run python bench/tcp_tls.py --sizes 4K,1M,64M --iters 500,200,10

Two spawned processes, each with a :class:`~cluster.transport.tcp.TcpDataPlane` connected to the
other (token handshake, then TLS 1.3 with certificates this script makes with ``cryptography``
when the row says TLS). Rank 0 sends a message, rank 1 sends it back; the table gives the median
round trip, and for large sizes the one-way throughput (2 x size / round trip). Loopback only:
on this path TLS costs what its encryption costs the CPU, the network costs nothing.
"""

from __future__ import annotations

import argparse
import datetime
import ipaddress
import multiprocessing as mp
import os
import queue
import ssl
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.record import Column, Figure, Table, write_result  # noqa: E402

__all__ = ["main", "result_table"]

_UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def _size(text: str) -> int:
    text = text.strip().upper()
    return int(text[:-1]) * _UNITS[text[-1]] if text[-1] in _UNITS else int(text)


def _make_pki(directory: str) -> dict[str, tuple[str, str, str]]:
    """A CA and one certificate per rank (SAN 127.0.0.1): {rank: (cert, key, ca)} files."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    def name(cn: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])

    now = datetime.datetime.now(datetime.UTC)

    def cert(subject: str, key, issuer_key, ca: bool) -> bytes:
        b = (x509.CertificateBuilder().subject_name(name(subject)).issuer_name(name("bench-ca"))
             .public_key(key.public_key()).serial_number(x509.random_serial_number())
             .not_valid_before(now - datetime.timedelta(minutes=5))
             .not_valid_after(now + datetime.timedelta(days=1))
             .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
        if not ca:
            b = b.add_extension(x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
        return b.sign(issuer_key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM)

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_file = os.path.join(directory, "ca.pem")
    with open(ca_file, "wb") as f:
        f.write(cert("bench-ca", ca_key, ca_key, True))
    files = {}
    for rank in (0, 1):
        key = ec.generate_private_key(ec.SECP256R1())
        cert_file, key_file = (os.path.join(directory, f"w{rank}.{e}") for e in ("pem", "key"))
        with open(cert_file, "wb") as f:
            f.write(cert(f"worker-{rank}", key, ca_key, False))
        with open(key_file, "wb") as f:
            f.write(key.private_bytes(serialization.Encoding.PEM,
                                      serialization.PrivateFormat.PKCS8,
                                      serialization.NoEncryption()))
        files[rank] = (cert_file, key_file, ca_file)
    return files


def _tls(files: tuple[str, str, str]):
    from cluster.transport._tcp_tls import DataPlaneTls

    contexts = []
    for side in (ssl.PROTOCOL_TLS_SERVER, ssl.PROTOCOL_TLS_CLIENT):
        context = ssl.SSLContext(side)
        context.verify_mode = ssl.CERT_REQUIRED
        context.load_cert_chain(files[0], files[1])
        context.load_verify_locations(files[2])
        contexts.append(context)
    return DataPlaneTls(server=contexts[0], client=contexts[1])


def _rank(rank: int, conn, files, sizes: list[int], iters: list[int]) -> None:
    import numpy as np

    from cluster.deadline import Deadline
    from cluster.transport.api import MessageKey, PeerInfo
    from cluster.transport.tcp import TcpDataPlane

    peers = [PeerInfo(r, f"worker:{r}", "127.0.0.1:1") for r in (0, 1)]
    inbox: queue.Queue = queue.Queue()
    plane = TcpDataPlane(peers[rank], peers, b"bench-token", "127.0.0.1",
                         tls=_tls(files[rank]) if files else None,
                         on_message=lambda src, key, got: inbox.put(got.payload),
                         on_lost=lambda *a: None, on_departed=lambda *a: None)
    conn.send(plane.port)
    other = conn.recv()
    plane.connect(peers[1 - rank], "127.0.0.1", other, Deadline.after(30))
    conn.send("connected")
    conn.recv()
    results = {}
    seq = 0
    for size, n in zip(sizes, iters, strict=True):
        payload = np.ones(size, np.uint8)
        times = []
        for i in range(n + 2):  # two untimed warm-up round trips
            seq += 1
            key = MessageKey("bench", seq, 0)
            if rank == 0:
                start = time.perf_counter()
                plane.send(1, key, memoryview(payload), "", Deadline.after(60))
                inbox.get(timeout=60)
                if i >= 2:
                    times.append(time.perf_counter() - start)
            else:
                got = inbox.get(timeout=60)
                plane.send(0, key, got, "", Deadline.after(60))
        results[size] = statistics.median(times) if times else 0.0
    conn.send(results)
    conn.recv()  # the other rank is done too
    plane.close(Deadline.after(5))


def _run(files, sizes: list[int], iters: list[int]) -> dict[int, float]:
    ctx = mp.get_context("spawn")
    pipes = [ctx.Pipe() for _ in (0, 1)]
    procs = [ctx.Process(target=_rank, args=(r, pipes[r][1], files, sizes, iters))
             for r in (0, 1)]
    for p in procs:
        p.start()
    try:
        ports = [pipes[r][0].recv() for r in (0, 1)]
        pipes[0][0].send(ports[1])
        pipes[1][0].send(ports[0])
        for r in (0, 1):
            assert pipes[r][0].recv() == "connected"
        for r in (0, 1):
            pipes[r][0].send("go")
        results = [pipes[r][0].recv() for r in (0, 1)]
        for r in (0, 1):
            pipes[r][0].send("done")
        for p in procs:
            p.join(30)
        return results[0]
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join(5)


def _fmt_time(seconds: float) -> str:
    return f"{seconds * 1e6:.0f} us" if seconds < 1e-2 else f"{seconds * 1e3:.1f} ms"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="4K,64M")
    parser.add_argument("--iters", default="200,10", help="round trips per size")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each mode, interleaved")
    parser.add_argument("--json", type=Path,
                        help="also write a result file here (bench/record.py)")
    args = parser.parse_args(argv)
    sizes = [_size(s) for s in args.sizes.split(",")]
    iters = [int(n) for n in args.iters.split(",")]
    if len(iters) != len(sizes):
        parser.error("--iters needs one count per size")
    with tempfile.TemporaryDirectory() as directory:
        files = _make_pki(directory)
        runs: dict[str, list[dict[int, float]]] = {"plain": [], "tls": []}
        for _ in range(args.repeats):  # interleaved, so drifting load hits both alike
            runs["plain"].append(_run(None, sizes, iters))
            runs["tls"].append(_run(files, sizes, iters))
    print("| size | plain round trip | TLS round trip | plain GB/s | TLS GB/s | TLS cost |")
    print("|---|---|---|---|---|---|")
    for size in sizes:
        plain = min(r[size] for r in runs["plain"])  # best of repeats: least disturbed
        tls = min(r[size] for r in runs["tls"])
        large = size >= (1 << 20)
        label = f"{size >> 20} MiB" if large else f"{size >> 10} KiB"
        rates = [f"{2 * size / t / 1e9:.2f}" if large else "-" for t in (plain, tls)]
        print(f"| {label} | {_fmt_time(plain)} | {_fmt_time(tls)} | {rates[0]} | {rates[1]} | "
              f"{tls / plain:.2f}x |")
    if args.json:
        table = result_table(sizes, runs)
        cost = table.column("TLS cost")
        write_result(args.json, name=args.json.stem, title="What TLS costs on the TCP data plane",
                     summary=("Two processes ping-pong one message over TcpDataPlane, plain "
                              "against TLS 1.3, interleaved repeats, best of the repeats; on "
                              "loopback TLS costs exactly its encryption."),
                     script="tcp_tls.py", argv=list(sys.argv[1:] if argv is None else argv),
                     tables=[table],
                     figures=[Figure(f"TLS cost at {row[0]}", row[cost], "x")
                              for row in table.rows])
    return 0


def result_table(sizes: list[int], runs: dict[str, list[dict[int, float]]]) -> Table:
    """Per size, the best round trip of each mode's repeats (the least disturbed), the one-way
    rate of sizes of 1 MiB and more, and TLS's time over plain's."""
    rows = []
    for size in sizes:
        plain = min(r[size] for r in runs["plain"])
        tls = min(r[size] for r in runs["tls"])
        large = size >= (1 << 20)
        label = f"{size >> 20} MiB" if large else f"{size >> 10} KiB"
        rate = [round(2 * size / t / 1e9, 2) if large else None for t in (plain, tls)]
        rows.append((label, round(plain * 1e3, 3), round(tls * 1e3, 3), *rate,
                     round(tls / plain, 2)))
    return Table(title="Round trips, best of the repeats",
                 columns=(Column("size"), Column("plain round trip", "ms"),
                          Column("TLS round trip", "ms"), Column("plain one way", "GB/s", 2),
                          Column("TLS one way", "GB/s", 2), Column("TLS cost", "x", 2)),
                 rows=tuple(rows))


if __name__ == "__main__":
    raise SystemExit(main())
