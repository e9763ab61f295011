"""``python -m chaos``: run the chaos scenarios against real workers and check the invariants.

Exit status: 0 when no invariant broke, 1 on any violation, 2 on a usage or setup error.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import shutil
import sys
import tempfile
import time
import traceback
from pathlib import Path

from chaos.checker import check
from chaos.harness import Run
from chaos.infra import (
    InfraError,
    PrivatePostgres,
    ReplicatedPostgres,
    SmallDisk,
    ensure_faketime,
)
from chaos.network import NETWORK_SCENARIOS
from chaos.report import Result, print_results, write_doc
from chaos.scenarios import SCENARIOS, Scenario

NOT_FAULTS = frozenset({"cont", "unlock", "pg-start", "disk-free", "heal", "pg-promote"})
ALL_SCENARIOS = [*SCENARIOS, *NETWORK_SCENARIOS]


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m chaos", description=__doc__)
    p.add_argument("--backend", choices=("sqlite", "postgres", "both"), default="both")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--short", action="store_true", help="CI subset, small counts (default)")
    mode.add_argument("--full", action="store_true", help="every scenario, larger counts")
    p.add_argument(
        "--scenario", action="append", default=[], help="run only this scenario (repeatable)"
    )
    p.add_argument("--seed", type=int, default=None, help="random seed (default: random)")
    p.add_argument(
        "--write-docs",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="rewrite docs/reliability.md (default: on with --full over every scenario)",
    )
    p.add_argument("--keep", action="store_true", help="keep every scenario's directory")
    p.add_argument("--list", action="store_true", help="list the scenarios and exit")
    return p.parse_args(argv)


def chosen(args: argparse.Namespace) -> list[Scenario]:
    known = {s.name: s for s in ALL_SCENARIOS}
    for name in args.scenario:
        if name not in known:
            raise SystemExit(f"chaos: unknown scenario {name!r}; known: {', '.join(known)}")
    if args.scenario:
        return [known[n] for n in args.scenario]
    return [s for s in ALL_SCENARIOS if args.full or s.short]


async def run_one(
    sc: Scenario, backend: str, pg: PrivatePostgres | None, full: bool, seed: int, keep: bool
) -> Result:
    tmp = Path(tempfile.mkdtemp(prefix=f"chaos-{sc.name}-{backend}-"))
    disk = SmallDisk(24) if sc.needs_small_disk else None
    database = None
    replica = None
    if backend == "sqlite":
        url = f"sqlite:///{(disk.path if disk else tmp) / 'chaos.db'}"
    elif sc.replicated:
        replica = ReplicatedPostgres()
        try:
            await asyncio.to_thread(replica.init)
            url = replica.url(replica.primary.create_database(sc.name))
        except BaseException:
            replica.remove()  # no server of a half-made pair outlives the command
            raise
    else:
        assert pg is not None
        database = pg.create_database(sc.name)
        url = pg.url(database)
    run = Run(sc.name, backend, url, tmp, full, seed, options=sc.options, pg=pg, replica=replica)
    if disk is not None:
        run.metrics["disk"] = disk
    started = time.monotonic()
    print(f"chaos: {sc.name} on {backend} ...", flush=True)
    try:
        app = await run.client()
        await app.migrate()
        async with asyncio.timeout(900 if full else 300):
            await sc.body(run)
    except Exception:
        run.violations.append(f"[harness] the scenario did not complete:\n{traceback.format_exc()}")
    finally:
        await run.close()
    try:
        verdict = check(run, run.records(), run.jobs(), run.lost_attempts())
    except Exception:
        verdict = check(run, run.records(), {})
        verdict.violations.append(f"[harness] reading the database:\n{traceback.format_exc()}")
    run.metrics.pop("disk", None)
    tracebacks = sum(w.log.read_text(errors="replace").count("Traceback") for w in run.workers)
    if tracebacks:
        run.notes.append(f"{tracebacks} tracebacks in worker logs")
    if run.crash_exits:
        run.notes.append(f"{run.crash_exits} workers exited by themselves (restarted)")
    result = Result(
        scenario=sc.name,
        backend=backend,
        jobs=len(run.expected),
        runs=int(verdict.metrics.get("runs", 0)),
        faults=sum(1 for f in run.faults if f.kind not in NOT_FAULTS),
        seconds=time.monotonic() - started,
        violations=verdict.violations,
        metrics=verdict.metrics | run.metrics,
        notes=run.notes,
    )
    if disk is not None:
        disk.close()
    if replica is not None:
        replica.remove()
    if database is not None and pg is not None:
        try:
            pg.drop_database(database)
        except Exception as exc:
            result.notes.append(f"dropping {database}: {exc}")
    if result.violations or keep:
        result.kept = str(tmp)
        faults = [f"{f.mono:.3f} {f.kind} {f.pid} {f.detail}" for f in run.faults]
        (tmp / "faults.txt").write_text("\n".join(faults) + "\n")
    else:
        shutil.rmtree(tmp, ignore_errors=True)
    status = f"{len(result.violations)} violations" if result.violations else "ok"
    print(f"chaos: {sc.name} on {backend}: {status} ({result.seconds:.0f}s) {result.figure()}")
    for note in result.notes:
        print(f"        note: {note}")
    return result


async def main_async(
    args: argparse.Namespace, scenarios: list[Scenario], seed: int
) -> list[Result]:
    backends = ("sqlite", "postgres") if args.backend == "both" else (args.backend,)
    results: list[Result] = []
    pg: PrivatePostgres | None = None
    try:
        for backend in backends:
            for sc in scenarios:
                if backend not in sc.backends:
                    continue
                if backend == "postgres" and pg is None and not sc.replicated:
                    pg = PrivatePostgres()
                    await asyncio.to_thread(pg.init)
                results.append(await run_one(sc, backend, pg, args.full, seed, args.keep))
    finally:
        if pg is not None:
            pg.remove()
    return results


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.list:
        for sc in ALL_SCENARIOS:
            print(f"{sc.name:20} {'short' if sc.short else 'full '} {', '.join(sc.backends)}")
            print(f"{'':20} {sc.summary}")
        return 0
    scenarios = chosen(args)
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    try:
        ensure_faketime()
    except InfraError as exc:
        print(f"chaos: {exc}", file=sys.stderr)
        return 2
    mode = "--full" if args.full else "--short"
    command = f"python -m chaos --backend {args.backend} {mode} --seed {seed}"
    if args.scenario:
        command += "".join(f" --scenario {n}" for n in args.scenario)
    print(f"chaos: {command}", flush=True)
    started = time.monotonic()
    try:
        results = asyncio.run(main_async(args, scenarios, seed))
    except InfraError as exc:
        print(f"chaos: {exc}", file=sys.stderr)
        return 2
    print_results(results)
    print(f"chaos: {time.monotonic() - started:.0f}s in all; seed {seed}")
    write = args.write_docs if args.write_docs is not None else (args.full and not args.scenario)
    if write:
        write_doc(results, command, ALL_SCENARIOS, partial=bool(args.scenario))
        print("chaos: wrote docs/reliability.md")
    return 1 if any(r.violations for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
