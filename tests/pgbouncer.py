"""A real PgBouncer in transaction pooling mode in front of one test database.

Debian's ``pgbouncer`` (``scripts/setup`` installs it) is started as user ``postgres`` on
a free port of 127.0.0.1, with its configuration in a directory of its own, and stopped
(SIGINT, then SIGKILL) when the ``with`` block ends. It serves only the given database,
under the same name, with ``pool_mode = transaction`` and ``default_pool_size`` server
connections: the setting in which session state (prepared statements, session ``SET``,
session advisory locks, LISTEN) does not survive from one transaction to the next.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from psycopg.conninfo import conninfo_to_dict

PGBOUNCER = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"


def free_port() -> int:
    """A TCP port of 127.0.0.1 that nothing listens on (at the time of asking)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass(frozen=True)
class Bouncer:
    """A running PgBouncer: ``url`` goes through it, ``direct_url`` to the server."""

    url: str
    direct_url: str
    port: int
    log_path: Path
    process: subprocess.Popen[bytes]

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


def _config(
    database: str, target: dict[str, str], port: int, where: Path, pool: int, mode: str
) -> str:
    host = target.get("host", "127.0.0.1")
    server = f"host={host} port={target.get('port', '5432')} dbname={database}"
    return f"""\
[databases]
{database} = {server}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {port}
unix_socket_dir =
auth_type = trust
auth_file = {where / "users.txt"}
pool_mode = {mode}
default_pool_size = {pool}
min_pool_size = 0
reserve_pool_size = 0
max_client_conn = 2000
max_db_connections = {pool}
ignore_startup_parameters = extra_float_digits
server_reset_query =
logfile = {where / "pgbouncer.log"}
pidfile = {where / "pgbouncer.pid"}
admin_users = postgres
"""


@contextlib.contextmanager
def pgbouncer(
    database_url: str, *, pool_size: int = 6, mode: str = "transaction", timeout: float = 30.0
) -> Iterator[Bouncer]:
    """Run PgBouncer (``mode``: its pool_mode, ``pool_size`` server connections) for the
    database of ``database_url``; yield its URLs once it accepts connections."""
    import psycopg

    if not os.path.exists(PGBOUNCER):
        raise RuntimeError(
            f"pgbouncer is not installed ({PGBOUNCER} is missing): run `bash scripts/setup` "
            "as root, or apt-get install pgbouncer"
        )
    target = conninfo_to_dict(database_url)
    database = str(target["dbname"])
    user = str(target.get("user", "postgres"))
    where = Path(tempfile.mkdtemp(prefix="conveyor-pgbouncer-"))
    postgres = pwd.getpwnam("postgres")
    os.chown(where, postgres.pw_uid, postgres.pw_gid)
    (where / "users.txt").write_text(f'"{user}" ""\n')
    port = free_port()
    config = where / "pgbouncer.ini"
    config.write_text(
        _config(database, {k: str(v) for k, v in target.items()}, port, where, pool_size, mode)
    )
    for path in where.iterdir():
        os.chown(path, postgres.pw_uid, postgres.pw_gid)
    command = [PGBOUNCER, "--quiet", str(config)]
    if os.getuid() == 0:
        # setpriv execs pgbouncer itself (runuser would stay its parent), so that the
        # signals below reach it; pgbouncer refuses to run as root.
        command = ["setpriv", "--reuid=postgres", "--regid=postgres", "--clear-groups", *command]
    with open(where / "stderr.txt", "wb") as stderr:
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=stderr)
    url = f"postgresql://{user}@127.0.0.1:{port}/{database}"
    bouncer = Bouncer(url, database_url, port, where / "pgbouncer.log", process)
    try:
        deadline = time.monotonic() + timeout
        while True:
            if process.poll() is not None:
                raise RuntimeError(
                    f"pgbouncer exited with {process.returncode}: "
                    f"{(where / 'stderr.txt').read_text(errors='replace')}{bouncer.log()}"
                )
            try:
                with psycopg.connect(url, connect_timeout=2, autocommit=True) as conn:
                    conn.execute("SELECT 1")
                break
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        yield bouncer
    finally:
        if process.poll() is None:
            process.send_signal(2)
            try:
                process.wait(5)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(5)
        shutil.rmtree(where, ignore_errors=True)
