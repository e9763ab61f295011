"""Worker processes for the conveyor workloads, and what the benchmark reads about them.

Workers are real ``python -m conveyor worker bench.app:app`` processes, started
with the run's database in ``CONVEYOR_DATABASE_URL``.  Their CPU time comes from
``/proc`` while they run and from ``wait4`` once they exit; their output goes to a
log file that is shown when one of them fails.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import psycopg

import bench

# The directory holding the ``bench`` package, so that workers can import bench.app
# whatever their working directory is.
_BENCH_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(bench.__file__)))
_TICKS = os.sysconf("SC_CLK_TCK")

APP = "bench.app:app"


@dataclass
class WorkerProcess:
    """One ``conveyor worker`` process."""

    popen: subprocess.Popen[bytes]
    log: Path
    cpu_at_exit: float | None = field(default=None)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def cpu_seconds(self) -> float:
        """User plus system CPU time of every thread so far (or in all, once exited)."""
        if self.cpu_at_exit is not None:
            return self.cpu_at_exit
        fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        # After the command name: state is field 3, utime field 14, stime field 15.
        return (int(fields[11]) + int(fields[12])) / _TICKS

    def rss_mb(self) -> float:
        """Resident set size now, in MB (10^6 bytes)."""
        return _status_kb(self.pid, "VmRSS") * 1024 / 1e6

    def peak_rss_mb(self) -> float:
        """The highest resident set size so far, in MB."""
        return _status_kb(self.pid, "VmHWM") * 1024 / 1e6

    def terminate(self) -> None:
        """Ask the worker to shut down gracefully (SIGTERM)."""
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)

    def wait(self, timeout: float) -> int:
        """Wait for the process to exit; return its exit code and keep its CPU time."""
        deadline = time.monotonic() + timeout
        while True:
            if self.popen.returncode is not None:  # already reaped by poll()
                return self.popen.returncode
            pid, status, usage = os.wait4(self.pid, os.WNOHANG)
            if pid == self.pid:
                self.cpu_at_exit = usage.ru_utime + usage.ru_stime
                code = os.waitstatus_to_exitcode(status)
                self.popen.returncode = code
                return code
            if time.monotonic() > deadline:
                raise TimeoutError(f"worker {self.pid} did not exit in {timeout:.0f}s{self.tail()}")
            time.sleep(0.005)

    def kill(self) -> None:
        """Stop the process at once (cleanup after a failure)."""
        if self.popen.returncode is None and self.popen.poll() is None:
            self.popen.kill()
            self.popen.wait()

    def tail(self, lines: int = 20) -> str:
        """The end of the worker's output, to explain a failure."""
        try:
            text = self.log.read_text(errors="replace").splitlines()[-lines:]
        except OSError:
            return ""
        return "\n--- worker output ---\n" + "\n".join(text) if text else ""


class Workers:
    """Starts worker processes and makes sure none outlives the workload."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.started: list[WorkerProcess] = []
        self._logs = Path(tempfile.mkdtemp(prefix="conveyor_bench_logs_"))

    def start(
        self,
        *,
        concurrency: int,
        burst: bool,
        extra: Sequence[str] = (),
        prefix: Sequence[str] = (),
        env_extra: Mapping[str, str] | None = None,
    ) -> WorkerProcess:
        """Start one worker; ``prefix`` wraps the command (e.g. a profiler)."""
        env = dict(os.environ) | dict(env_extra or {})
        env["CONVEYOR_DATABASE_URL"] = self.url
        env["PYTHONPATH"] = os.pathsep.join(
            [_BENCH_ROOT, *filter(None, [os.environ.get("PYTHONPATH")])]
        )
        command = [
            *prefix,
            sys.executable,
            "-m",
            "conveyor",
            "worker",
            APP,
            "--concurrency",
            str(concurrency),
            *(["--burst"] if burst else []),
            *extra,
        ]
        log = self._logs / f"worker{len(self.started) + 1}.log"
        with log.open("wb") as out:
            popen = subprocess.Popen(
                command, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )
        worker = WorkerProcess(popen, log)
        self.started.append(worker)
        return worker

    def wait_all(self, timeout: float) -> None:
        """Wait for every started worker to exit; fail if one exited with an error."""
        deadline = time.monotonic() + timeout
        for worker in self.started:
            if worker.popen.returncode is None:
                code = worker.wait(max(0.0, deadline - time.monotonic()))
                if code != 0:
                    raise RuntimeError(f"worker {worker.pid} exited with {code}{worker.tail()}")

    def stop_all(self, timeout: float = 60.0) -> None:
        """SIGTERM every running worker and wait for them."""
        for worker in self.started:
            worker.terminate()
        self.wait_all(timeout)

    def check_alive(self) -> None:
        """Fail early when a worker died instead of letting the workload wait for it."""
        for worker in self.started:
            if worker.popen.returncode is None and worker.popen.poll() is not None:
                raise RuntimeError(
                    f"worker {worker.pid} exited with {worker.popen.returncode}{worker.tail()}"
                )

    def close(self) -> None:
        """Kill whatever still runs and remove the logs."""
        for worker in self.started:
            worker.kill()
        shutil.rmtree(self._logs, ignore_errors=True)


def _status_kb(pid: int, key: str) -> int:
    match = re.search(rf"^{key}:\s+(\d+) kB", Path(f"/proc/{pid}/status").read_text(), re.M)
    if match is None:
        raise RuntimeError(f"no {key} in /proc/{pid}/status")
    return int(match.group(1))


class SyscallCounter:
    """Counts some system calls of a running process (all its threads) with ``strace -c``.

    The counts are what the figures cannot fake: on PostgreSQL every statement is
    one ``sendto`` to the server, on SQLite every commit one ``fdatasync`` (or
    ``fsync``) of the WAL.  Tracing slows the traced calls, so CPU time is never
    measured while a counter runs.
    """

    CALLS = ("sendto", "recvfrom", "fsync", "fdatasync", "pwrite64")

    def __init__(self, pid: int) -> None:
        descriptor, name = tempfile.mkstemp(prefix="conveyor_bench_strace_")
        os.close(descriptor)
        self.output = Path(name)
        self._popen = subprocess.Popen(
            [
                "strace",
                "-f",
                "-c",
                "-e",
                "trace=" + ",".join(self.CALLS),
                "-o",
                str(self.output),
                "-p",
                str(pid),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        # strace attaches to each thread in turn; give it a moment before counting.
        time.sleep(0.3)

    @staticmethod
    def available() -> bool:
        """Whether strace is installed."""
        return shutil.which("strace") is not None

    def stop(self) -> dict[str, int]:
        """Detach and return the number of calls of each traced system call."""
        self._popen.send_signal(signal.SIGINT)
        self._popen.wait(timeout=30)
        counts = dict.fromkeys(self.CALLS, 0)
        row = re.compile(r"^\s*[\d.]+\s+[\d.]+\s+\d+\s+(\d+)\s+(?:\d+\s+)?(\w+)\s*$")
        for line in self.output.read_text().splitlines():
            match = row.match(line)
            if match and match.group(2) in counts:
                counts[match.group(2)] = int(match.group(1))
        self.output.unlink(missing_ok=True)
        return counts


class PostgresCpu:
    """Adds up the CPU time of the server processes serving one database.

    PostgreSQL runs a process per connection.  While a workload runs, the
    benchmark lists the backends connected to the run's database (from
    ``pg_stat_activity``) every ``interval`` seconds and reads their CPU time
    from ``/proc``; a backend's share is its last reading minus its first.  What a
    backend spends in its last ``interval`` before it exits is missed.
    """

    def __init__(self, url: str, interval: float = 0.05) -> None:
        self._conn = psycopg.connect(url, autocommit=True)
        self._interval = interval
        self._first: dict[int, float] = {}
        self._last: dict[int, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        while not self._stop.wait(self._interval):
            rows = self._conn.execute(
                "SELECT pid FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"
            ).fetchall()
            for (pid,) in rows:
                try:
                    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                except OSError:
                    continue
                cpu = (int(fields[11]) + int(fields[12])) / _TICKS
                self._first.setdefault(pid, cpu)
                self._last[pid] = cpu

    def stop(self) -> float:
        """Stop sampling; return the CPU seconds the backends used meanwhile."""
        self._stop.set()
        self._thread.join()
        self._conn.close()
        return sum(self._last[pid] - self._first[pid] for pid in self._last)
