"""``/docs``: Swagger UI from files shipped in packages (no CDN), behind an API token.

The page itself holds nothing but a sign-in form: it fetches ``/openapi.json`` with the
token typed in (the document needs a token of any role), and Swagger UI then sends that
token with the requests it tries, to this server only. Swagger UI's own files come from
the ``swagger-ui-bundle-v2`` package (Swagger UI 5, Apache-2.0; OpenAPI 3.1).
"""

from __future__ import annotations

import html
from importlib import resources
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from starlette.responses import FileResponse, HTMLResponse, JSONResponse, Response

from conveyor.web._auth import Reader
from conveyor.web._problems import ProblemError

_OURS = {"docs.js": "text/javascript", "docs.css": "text/css"}
_VENDORED = {"swagger-ui-bundle.js": "text/javascript", "swagger-ui.css": "text/css"}


def _swagger_dir() -> Path | None:
    try:
        import swagger_ui_bundle  # type: ignore[import-untyped]
    except ImportError:
        return None
    return Path(swagger_ui_bundle.swagger_ui_path)


def _ours(name: str) -> str:
    return resources.files("conveyor.web").joinpath("docs_static", name).read_text("utf-8")


def install_docs(api: FastAPI) -> None:
    """Add ``/docs`` and its assets, and put ``/openapi.json`` behind a token."""
    page = _ours("docs.html")

    @api.get("/docs", include_in_schema=False)
    async def docs(request: Request) -> Response:
        base = html.escape(str(request.scope.get("root_path", "")).rstrip("/"))
        return HTMLResponse(page.replace("{base}", base), headers={"Cache-Control": "no-store"})

    @api.get("/docs/{name}", include_in_schema=False)
    async def asset(name: str) -> Response:
        if name in _OURS:
            return Response(_ours(name), media_type=_OURS[name])
        folder = _swagger_dir()
        if name in _VENDORED and folder is not None:
            return FileResponse(folder / name, media_type=_VENDORED[name])
        raise ProblemError(404, f"no file {name!r} under /docs")


def install_openapi_route(api: FastAPI) -> None:
    """``/openapi.json``, for a token of any role."""

    @api.get("/openapi.json", include_in_schema=False)
    async def openapi(view: Reader) -> Any:
        return JSONResponse(api.openapi())
