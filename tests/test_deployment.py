"""The systemd units docs/deployment.md ships (docs/deploy/*.service) are valid units
whose ExecStart is a real conveyor command: parsed as systemd reads them (keys in
sections, no key twice), checked by ``systemd-analyze verify``, and each command line
parsed by conveyor's own CLI, so a renamed or mistyped option fails here."""

from __future__ import annotations

import configparser
import shlex
import shutil
import subprocess
from importlib.metadata import entry_points
from pathlib import Path

import click
import pytest

ROOT = Path(__file__).resolve().parent.parent
UNITS = {
    "worker": ROOT / "docs/deploy/conveyor-worker.service",
    "serve": ROOT / "docs/deploy/conveyor-server.service",
}


def read_unit(path: Path) -> configparser.ConfigParser:
    """A unit file as sections of keys; a key given twice in a section is an error."""
    unit = configparser.ConfigParser(strict=True, interpolation=None, comment_prefixes=("#", ";"))
    unit.optionxform = str  # type: ignore[assignment,method-assign]  # keys are case-sensitive
    unit.read_string(path.read_text(), source=str(path))
    return unit


def parse_command(line: str) -> click.Context:
    """Parse an ExecStart line with conveyor's own CLI, as the installed script would,
    without running it; return the subcommand's context (its options converted)."""
    argv = shlex.split(line)
    assert Path(argv[0]).name == "conveyor", f"{argv[0]} is not the conveyor script"
    (script,) = entry_points(group="console_scripts", name="conveyor")
    group: click.Group = script.load()
    parent = click.Context(group, info_name="conveyor")
    command = group.get_command(parent, argv[1])
    assert command is not None, f"conveyor has no command {argv[1]!r}"
    return command.make_context(argv[1], argv[2:], parent=parent)


@pytest.mark.parametrize("command", sorted(UNITS))
def test_a_shipped_unit_runs_a_real_conveyor_command(command: str) -> None:
    unit = read_unit(UNITS[command])
    assert set(unit.sections()) == {"Unit", "Service", "Install"}
    service = unit["Service"]
    assert service["KillSignal"] == "SIGTERM"  # the signal conveyor stops gracefully on
    assert service["Restart"] == "always" and unit["Install"]["WantedBy"]
    ctx = parse_command(service["ExecStart"])
    assert ctx.info_name == command
    assert ctx.params["app_spec"] == "app.jobs:app"
    if command == "worker":
        # systemd's patience outlasts the worker's own: grace, then the cancel grace.
        stop = float(service["TimeoutStopSec"])
        assert stop > ctx.params["grace"] + ctx.params["cancel_grace"]
        assert service["KillMode"] == "mixed"  # isolated handlers' children are the worker's
    else:
        assert ctx.params["host"] == "0.0.0.0"


def test_a_mistyped_option_in_an_exec_start_is_caught() -> None:
    with pytest.raises(click.NoSuchOption):
        parse_command("/srv/app/.venv/bin/conveyor worker app.jobs:app --concurency 50")
    with pytest.raises(click.BadParameter):
        parse_command("/srv/app/.venv/bin/conveyor worker app.jobs:app --lease soon")


@pytest.mark.parametrize("command", sorted(UNITS))
def test_systemd_accepts_the_unit(command: str, tmp_path: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.fail(
            "systemd-analyze is missing: scripts/setup installs it (apt-get install systemd)"
        )
    # Point the unit at this checkout's conveyor, which exists here, and at a real
    # directory; everything else is verified as shipped.
    conveyor = shutil.which("conveyor", path=str(Path(shutil.which("python") or "").parent))
    text = UNITS[command].read_text()
    text = text.replace("/srv/app/.venv/bin/conveyor", str(conveyor or ROOT / ".venv/bin/conveyor"))
    text = text.replace("/srv/app", str(tmp_path))
    copy = tmp_path / UNITS[command].name
    copy.write_text(text)
    out = subprocess.run([analyze, "verify", str(copy)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout + out.stderr == "", out.stdout + out.stderr
