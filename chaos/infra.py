"""What the scenarios run on: a private PostgreSQL server, databases, a small disk, faketime.

The private PostgreSQL instance is this command's own (initdb into a temporary directory,
its own port, run as the ``postgres`` OS user), so stopping and restarting it disturbs
nobody else's server. fsync and synchronous_commit stay on.
"""

from __future__ import annotations

import glob
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

import psycopg

FAKETIME_LIB = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1"
SETUP = Path(__file__).resolve().parent / "setup.sh"


class InfraError(RuntimeError):
    """The machine lacks something a scenario needs."""


def ensure_faketime() -> str:
    """Install Debian's faketime when missing (idempotent); return the library's path."""
    if not os.path.exists(FAKETIME_LIB):
        done = subprocess.run(["bash", str(SETUP)], capture_output=True, text=True)
        if done.returncode != 0 or not os.path.exists(FAKETIME_LIB):
            raise InfraError(f"cannot install faketime:\n{done.stdout}\n{done.stderr}")
    return FAKETIME_LIB


def faketime_env(offset_seconds: float) -> dict[str, str]:
    """Environment that shifts a process's wall clock, leaving its monotonic clock alone."""
    return {
        "LD_PRELOAD": ensure_faketime(),
        "FAKETIME": f"{offset_seconds:+.0f}s",
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",
        "FAKETIME_NO_CACHE": "1",
    }


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _pg_bin(name: str) -> str:
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    if not found:
        raise InfraError(f"PostgreSQL's {name} not found under /usr/lib/postgresql/*/bin")
    return found[-1]


class PrivatePostgres:
    """A throwaway PostgreSQL server in a temporary directory, run as user ``postgres``."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="chaos-pg-"))
        self.data = self.dir / "data"
        self.port = _free_port()
        self.started = False

    def _as_postgres(self, *command: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        if os.geteuid() == 0:
            command = ("runuser", "-u", "postgres", "--", *command)
        return subprocess.run(command, capture_output=True, text=True, check=check)

    def init(self, extra_conf: str = "") -> None:
        if os.geteuid() == 0:
            shutil.chown(self.dir, "postgres", "postgres")
        self._as_postgres(
            _pg_bin("initdb"), "-D", str(self.data), "-U", "postgres", "-A", "trust", "--no-sync"
        )
        with open(self.data / "postgresql.conf", "a") as conf:
            conf.write(
                "\n# chaos suite: a private, durable server\n"
                f"port = {self.port}\nlisten_addresses = '127.0.0.1'\n"
                f"unix_socket_directories = '{self.dir}'\n"
                "fsync = on\nsynchronous_commit = on\nmax_connections = 200\n"
                "shared_buffers = 32MB\n" + extra_conf
            )
        self.start()

    def start(self) -> None:
        self._as_postgres(
            _pg_bin("pg_ctl"), "-D", str(self.data), "-l", str(self.dir / "server.log"),
            "-w", "-t", "60", "start",
        )  # fmt: skip
        self.started = True

    def stop(self, mode: str = "fast") -> None:
        self._as_postgres(_pg_bin("pg_ctl"), "-D", str(self.data), "-m", mode, "-w", "stop")
        self.started = False

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def create_database(self, prefix: str) -> str:
        name = f"chaos_{prefix.replace('-', '_')}_{uuid.uuid4().hex[:8]}"
        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return name

    def drop_database(self, name: str) -> None:
        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    def remove(self) -> None:
        if self.started:
            self._as_postgres(
                _pg_bin("pg_ctl"), "-D", str(self.data), "-m", "immediate", "-w", "stop",
                check=False,
            )  # fmt: skip
            self.started = False
        shutil.rmtree(self.dir, ignore_errors=True)


class ReplicatedPostgres:
    """A private primary with a synchronous streaming standby (``pg_basebackup -R``), for
    failovers: :meth:`kill_primary` SIGKILLs every process of the primary, :meth:`promote`
    makes the standby the primary. Clients use :meth:`url`, which names both servers with
    ``target_session_attrs=read-write``, so they find whichever one takes writes."""

    STANDBY = "chaos_standby"

    def __init__(self) -> None:
        self.primary = PrivatePostgres()
        self.standby_data = self.primary.dir / "standby"
        self.standby_port = _free_port()
        self.standby_started = False

    def init(self) -> None:
        pg = self.primary
        # Every commit waits until the standby has flushed it: a commit acknowledged to
        # a client survives the primary's death.
        pg.init(
            "wal_level = replica\nmax_wal_senders = 10\nwal_keep_size = 256MB\n"
            f"synchronous_standby_names = '{self.STANDBY}'\n"
        )
        pg._as_postgres(
            _pg_bin("pg_basebackup"), "-h", "127.0.0.1", "-p", str(pg.port), "-U", "postgres",
            "-D", str(self.standby_data), "-R", "-X", "stream", "-c", "fast",
        )  # fmt: skip
        with open(self.standby_data / "postgresql.conf", "a") as conf:
            conf.write(
                "\n# chaos suite: the synchronous standby\n"
                f"port = {self.standby_port}\ncluster_name = '{self.STANDBY}'\n"
                "synchronous_standby_names = ''\nhot_standby = on\n"
            )
        pg._as_postgres(
            _pg_bin("pg_ctl"), "-D", str(self.standby_data), "-l",
            str(pg.dir / "standby.log"), "-w", "-t", "60", "start",
        )  # fmt: skip
        self.standby_started = True
        deadline = time.monotonic() + 60
        while self.sync_state() != "sync":
            if time.monotonic() > deadline:
                raise InfraError(f"the standby never became synchronous ({self.sync_state()})")
            time.sleep(0.1)

    def sync_state(self) -> str | None:
        with psycopg.connect(self.primary.url(), autocommit=True, connect_timeout=5) as conn:
            row = conn.execute(
                "SELECT sync_state FROM pg_stat_replication WHERE application_name = %s",
                (self.STANDBY,),
            ).fetchone()
        return None if row is None else str(row[0])

    def url(self, database: str) -> str:
        return (
            f"postgresql://postgres@127.0.0.1:{self.primary.port},127.0.0.1:{self.standby_port}"
            f"/{database}?target_session_attrs=read-write"
        )

    def kill_primary(self) -> int:
        """SIGKILL the primary's postmaster and all its children at once; return how many."""
        postmaster = int((self.primary.data / "postmaster.pid").read_text().split()[0])
        victims = [postmaster]
        for stat in glob.glob("/proc/[0-9]*/stat"):
            try:
                fields = Path(stat).read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == postmaster:
                victims.append(int(stat.split("/")[2]))
        for pid in victims:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.primary.started = False
        return len(victims)

    def promote(self) -> None:
        self.primary._as_postgres(
            _pg_bin("pg_ctl"), "-D", str(self.standby_data), "-w", "-t", "60", "promote"
        )

    def remove(self) -> None:
        if self.standby_started:
            self.primary._as_postgres(
                _pg_bin("pg_ctl"), "-D", str(self.standby_data), "-m", "immediate", "-w",
                "stop", check=False,
            )  # fmt: skip
            self.standby_started = False
        self.primary.remove()


class SmallDisk:
    """A small tmpfs mounted on a temporary directory (root only); unmounted on close."""

    def __init__(self, size_mb: int) -> None:
        if os.geteuid() != 0:
            raise InfraError("the disk-full scenario mounts a tmpfs and needs root")
        self.path = Path(tempfile.mkdtemp(prefix="chaos-disk-"))
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size_mb}m", "tmpfs", str(self.path)],
            check=True,
        )
        self.filler = self.path / "filler"

    def fill(self) -> int:
        """Fill the disk to the last byte; return how many bytes the filler took."""
        written = 0
        fd = os.open(self.filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            for size in (1 << 20, 65536, 4096, 512, 1):
                chunk = b"\0" * size
                while True:
                    try:
                        n = os.write(fd, chunk)
                    except OSError:
                        break
                    written += n
                    if n < size:
                        break
        finally:
            os.close(fd)
        return written

    def free(self) -> None:
        self.filler.unlink(missing_ok=True)

    def close(self) -> None:
        for _ in range(20):
            done = subprocess.run(["umount", str(self.path)], capture_output=True)
            if done.returncode == 0:
                break
            time.sleep(0.25)
        shutil.rmtree(self.path, ignore_errors=True)
