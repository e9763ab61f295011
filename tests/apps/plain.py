"""An application whose handlers all take JSON's plain values (str, int, float, bool).

Its worker runs their jobs without importing pydantic (tests/test_registry.py): each job's
result says whether pydantic was loaded in the worker's process when the job ran.
"""

from __future__ import annotations

import os
import sys

from conveyor import Conveyor, JobContext

app = Conveyor(os.environ.get("CONVEYOR_DATABASE_URL", "sqlite:///conveyor-test-unused.db"))


@app.job()
async def scale(
    ctx: JobContext, x: float, factor: int = 2, label: str = "scaled"
) -> dict[str, object]:
    return {"value": x * factor, "label": label, "pydantic": "pydantic" in sys.modules}


@app.job()
def flag(ctx: JobContext, on: bool) -> dict[str, object]:
    return {"on": on, "pydantic": "pydantic" in sys.modules}
