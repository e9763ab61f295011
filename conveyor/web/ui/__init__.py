"""The dashboard: see and steer jobs from a browser, at ``/ui`` of ``conveyor serve``.

Server-rendered HTML (Jinja2) on the same :class:`~conveyor.app.tenants.TenantView` operations
as the REST API; a small script of its own refreshes the live parts of a page. Sign in
with an API token: the session cookie is HttpOnly, SameSite=Strict and Secure over TLS;
every action is a POST with the session's CSRF token from the dashboard's own origin, and
is written to the audit log. An application can mount it as it mounts the API::

    main.mount("/jobs-ui", create_dashboard(jobs))

See docs/dashboard.md.
"""

from conveyor.web.ui._app import DashboardOptions, create_dashboard

__all__ = ["DashboardOptions", "create_dashboard"]
