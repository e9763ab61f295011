"""The out-of-band run log: what handlers did, written beside conveyor, never through it.

Every process appends JSON lines to its own file in the directory named by
``CHAOS_RUNLOG`` with ``O_APPEND`` (one ``write`` per record), so a record is on disk as
soon as the handler moves on, whatever conveyor's own tables say. Times are
``CLOCK_MONOTONIC`` (one clock for every process of the machine; faketime is told not to
fake it) and the process's wall clock (which faketime does fake).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ENV = "CHAOS_RUNLOG"


def write(event: str, **fields: Any) -> None:
    """Append one record for this process; a no-op when no run log is configured."""
    directory = os.environ.get(ENV)
    if not directory:
        return
    record = {"e": event, "p": os.getpid(), "m": time.monotonic(), "w": time.time(), **fields}
    line = (json.dumps(record, separators=(",", ":")) + "\n").encode()
    fd = os.open(
        os.path.join(directory, f"{os.getpid()}.jsonl"), os.O_WRONLY | os.O_APPEND | os.O_CREAT
    )
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


@dataclass
class Record:
    event: str
    pid: int
    mono: float
    wall: float
    job: str = ""
    type: str = ""
    attempt: int = 0
    token: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


def read(directory: Path) -> list[Record]:
    """Every record of every process, in monotonic order (a torn last line is skipped)."""
    records = []
    for path in sorted(directory.glob("*.jsonl")):
        for line in path.read_text(errors="replace").splitlines():
            try:
                raw = json.loads(line)
            except ValueError:
                continue
            records.append(
                Record(
                    event=raw.pop("e"),
                    pid=raw.pop("p"),
                    mono=raw.pop("m"),
                    wall=raw.pop("w"),
                    job=raw.pop("j", ""),
                    type=raw.pop("t", ""),
                    attempt=raw.pop("a", 0),
                    token=raw.pop("k", 0),
                    extra=raw,
                )
            )
    records.sort(key=lambda r: r.mono)
    return records
