"""``conveyor serve`` against hostile clients, over real sockets to a real server process:
idle and trickling connections are closed within the configured timeouts while other
clients are served, connections over the cap are turned away, a page of big jobs to slow
readers stays within bounded memory, and forwarded headers count only when configured."""

from __future__ import annotations

import asyncio
import json
import secrets
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from conveyor import Submission
from tests.apps.api import build
from tests.servers import Served, serving_process

pytestmark = pytest.mark.processes


def _closed_by_server(sock: socket.socket, deadline: float) -> float | None:
    """Seconds until the server closed ``sock`` (None: still open at ``deadline``)."""
    started = time.monotonic()
    sock.settimeout(0.2)
    while time.monotonic() < deadline:
        try:
            data = sock.recv(65536)
        except TimeoutError:
            continue
        except ConnectionError:
            return time.monotonic() - started
        if not data:
            return time.monotonic() - started
    return None


def _trickle(sock: socket.socket, data: bytes, stop: threading.Event) -> None:
    """Send ``data`` a byte every 0.2 s, as a slowloris does, until the server closes."""
    for byte in data:
        if stop.wait(0.2):
            return
        try:
            sock.sendall(bytes([byte]))
        except OSError:
            return


def test_idle_and_trickling_connections_are_closed_while_others_are_served(
    tmp_path: Path,
) -> None:
    db = f"sqlite:///{tmp_path / 'c.db'}"
    with serving_process(
        db, tmp_path, "--request-timeout", "2", "--keep-alive-timeout", "1"
    ) as served:
        host = ("127.0.0.1", served.port)
        idle = socket.create_connection(host)
        head = socket.create_connection(host)
        body = socket.create_connection(host)
        kept = socket.create_connection(host)
        body.sendall(
            b"POST /jobs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 400\r\n\r\n"
        )
        kept.sendall(b"GET /health/live HTTP/1.1\r\nHost: x\r\n\r\n")
        assert b"200 OK" in kept.recv(65536)
        stop = threading.Event()
        trickles = [
            threading.Thread(
                target=_trickle, args=(head, b"GET /health/live HTTP/1.1\r\n" * 9, stop)
            ),
            threading.Thread(target=_trickle, args=(body, b"{" + b" " * 398 + b"}", stop)),
        ]
        for t in trickles:
            t.start()
        # Meanwhile another client is served as usual.
        auth = {"Authorization": f"Bearer {served.token}"}
        with httpx.Client(base_url=served.base, headers=auth, timeout=30) as client:
            for _ in range(5):
                assert client.get("/jobs").status_code == 200
        deadline = time.monotonic() + 60
        try:
            closed = {
                name: _closed_by_server(sock, deadline)
                for name, sock in [("idle", idle), ("head", head), ("body", body), ("kept", kept)]
            }
        finally:
            stop.set()
            for t in trickles:
                t.join()
            for sock in (idle, head, body, kept):
                sock.close()
        assert all(seconds is not None for seconds in closed.values()), closed
        with httpx.Client(base_url=served.base, headers=auth, timeout=30) as client:
            assert client.get("/jobs").status_code == 200


def test_connections_over_the_cap_are_closed_at_once(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'c.db'}"
    with serving_process(db, tmp_path, "--max-connections", "3") as served:
        host = ("127.0.0.1", served.port)
        held = [socket.create_connection(host) for _ in range(3)]
        try:
            extra = socket.create_connection(host)
            # The server closes it at once: well before the 10 s request timeout.
            assert _closed_by_server(extra, time.monotonic() + 8) is not None
            extra.close()
        finally:
            for sock in held:
                sock.close()


def test_forwarded_headers_count_only_from_configured_proxies(tmp_path: Path) -> None:
    forwarded = {"X-Forwarded-Proto": "https", "X-Forwarded-For": "203.0.113.9"}
    with serving_process(f"sqlite:///{tmp_path / 'a.db'}", tmp_path) as served:
        r = httpx.get(f"{served.base}/health/live", headers=forwarded)
        # Believed, the scheme would be https and the answer would carry HSTS.
        assert "strict-transport-security" not in r.headers
        assert r.headers["x-content-type-options"] == "nosniff"
    trusting = ("--forwarded-allow-ips", "127.0.0.1")
    with serving_process(f"sqlite:///{tmp_path / 'b.db'}", tmp_path, *trusting) as served:
        r = httpx.get(f"{served.base}/health/live", headers=forwarded)
        assert r.headers["strict-transport-security"].startswith("max-age=")


def _slow_read(served: Served, path: str, first: int, ready: threading.Barrier) -> bytes:
    """GET ``path`` on a socket with a small receive buffer: read ``first`` bytes slowly
    (the server holds the rest meanwhile), then the remainder at full speed."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16 * 1024)
    sock.connect(("127.0.0.1", served.port))
    sock.sendall(
        f"GET {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {served.token}\r\n"
        "Connection: close\r\n\r\n".encode()
    )
    ready.wait()
    chunks = []
    received = 0
    while True:
        data = sock.recv(16 * 1024)
        if not data:
            break
        chunks.append(data)
        received += len(data)
        if received < first:
            time.sleep(0.02)
    sock.close()
    return b"".join(chunks)


def _max_rss_while(served: Served, work: Callable[[], None]) -> int:
    peak = served.rss_bytes()
    done = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, served.rss_bytes())
            done.wait(0.02)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        work()
    finally:
        done.set()
        sampler.join()
    return peak


JOBS = 100  # x 900 KB: 90 MB per full page, enough to show a page held whole in memory
BIG = 900 * 1024


async def test_big_pages_to_slow_readers_keep_the_server_rss_bounded(
    db_url: str, tmp_path: Path
) -> None:
    app = build(db_url)
    try:
        for start in range(0, JOBS, 10):
            await app.submit_many(
                [
                    Submission("explode", {"message": f"{i:04d}" + "x" * BIG})
                    for i in range(start, start + 10)
                ]
            )
    finally:
        await app.close()
    with serving_process(db_url, tmp_path) as served:
        auth = {"Authorization": f"Bearer {served.token}"}
        with httpx.Client(base_url=served.base, headers=auth, timeout=60) as client:
            assert client.get("/jobs?limit=2").status_code == 200  # warm up
        baseline = served.rss_bytes()
        pages: list[bytes] = []
        ready = threading.Barrier(3)

        def readers() -> None:
            threads = [
                threading.Thread(
                    target=lambda: pages.append(
                        _slow_read(served, "/jobs?limit=1000", 1024 * 1024, ready)
                    )
                )
                for _ in range(3)
            ]
            for t in threads:
                t.start()
            for t in threads:
                t.join()

        peak = _max_rss_while(served, readers)
        growth = peak - baseline
        assert growth < 100 * 1024 * 1024, f"RSS grew {growth / 2**20:.0f} MB"
        assert len(pages) == 3
        # Every job is reachable by following the pages (each well under a full 90 MB).
        seen = []
        with httpx.Client(base_url=served.base, headers=auth, timeout=60) as client:
            url: str | None = "/jobs?limit=1000"
            while url is not None:
                r = client.get(url)
                assert r.status_code == 200 and len(r.content) < 8 * 1024 * 1024
                document = json.loads(r.content)
                seen += [job["id"] for job in document["jobs"]]
                url = document["next"]
        assert len(seen) == len(set(seen)) == JOBS


Connection = tuple[asyncio.StreamReader, asyncio.StreamWriter]


async def _request(port: int, authorization: str, connection: Connection | None = None) -> int:
    """One ``GET /jobs`` on a connection of its own (opened now unless given); the answer's
    status code."""
    reader, writer = connection or await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(
            f"GET /jobs?limit=100 HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: {authorization}"
            "\r\nConnection: close\r\n\r\n".encode()
        )
        await writer.drain()
        status = await reader.readline()
        await reader.read()
        return int(status.split()[1])
    finally:
        writer.close()


async def _flood(
    served: Served, burst: list[str], steady: str, streams: int = 5
) -> tuple[Counter[int], Counter[int], int]:
    """Send a request with each authorization of ``burst`` at once (on connections opened
    first) while ``streams`` clients of ``steady`` send one request after another until
    the burst is answered; return the burst's codes, the steady ones, and how many steady
    requests were sent while the burst was still being answered."""
    connected = [asyncio.open_connection("127.0.0.1", served.port) for _ in burst]
    connections = await asyncio.gather(*connected)

    tasks = [
        asyncio.create_task(_request(served.port, auth, connection))
        for connection, auth in zip(connections, burst, strict=True)
    ]
    codes: Counter[int] = Counter()
    during = 0

    async def stream() -> None:
        nonlocal during
        while not all(t.done() for t in tasks) or sum(codes.values()) < 20:
            pending = not all(t.done() for t in tasks)
            codes[await _request(served.port, steady)] += 1
            during += pending

    await asyncio.gather(*(stream() for _ in range(streams)))
    return Counter([await t for t in tasks]), codes, during


@pytest.mark.parametrize("backend", ["postgres"])
async def test_one_tokens_burst_leaves_every_other_tenant_served(
    db_url: str, tmp_path: Path
) -> None:
    # One token's 600 requests at once queued the others behind them in the database pool
    # until their token checks ran out of time (503); its share is capped instead (429).
    # The deadline of a token check is longer than the default, so that what is measured
    # is the pool's queue and not this busy machine's scheduling of the server process.
    with serving_process(db_url, tmp_path, "--db-timeout", "5") as served:
        app = build(db_url)
        try:
            _, loud = await app.create_token(tenant="loud", role="read")
            _, quiet = await app.create_token(tenant="quiet", role="read")
            for start in range(0, 200, 50):
                await app.submit_many(
                    [
                        Submission("add", {"a": i, "b": i}, tenant="loud")
                        for i in range(start, start + 50)
                    ]
                )
        finally:
            await app.close()
        loud, quiet = f"Bearer {loud}", f"Bearer {quiet}"
        # Both clients have been served before (the server knows their tokens are valid).
        assert await _request(served.port, loud) == await _request(served.port, quiet) == 200
        answers, codes, during = await _flood(served, [loud] * 600, quiet)
        assert during > 0, "the steady requests all came after the burst"
        assert set(codes) == {200}, codes
        # Its own share is served (a 503 there is this machine's database being slow to
        # open a connection of the pool, which the burst makes grow), the rest refused.
        assert set(answers) <= {200, 429, 503} and answers[429] > 0, answers
        # A flood of made-up tokens (each one looked up once) takes one share, not the pool.
        made_up = [
            f"Bearer cvt_{secrets.token_hex(6)}_{secrets.token_urlsafe(32)}" for _ in range(600)
        ]
        answers, codes, during = await _flood(served, made_up, quiet)
        assert during > 0, "the steady requests all came after the flood"
        assert set(codes) == {200}, codes
        assert set(answers) <= {401, 429, 503} and answers[429] > 0, answers
