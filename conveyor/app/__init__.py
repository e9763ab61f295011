"""The application layer: the :class:`~conveyor.Conveyor` facade and the services behind it.

- ``client``: :class:`~conveyor.Conveyor`, the one object application code, workers, the
  API and the CLI use, and :class:`~conveyor.Health`;
- ``handles``: the values application code holds (submissions, job handles, handlers,
  pages); ``registry``: job types and their payload models; ``blocking``: the thin
  adapter for code that is not async (``app.sync``);
- ``_submit``: submissions checked against their types, before anything is stored;
- ``_trees``: manual retries and the failures of a tree; ``_tokens``: API tokens;
- ``locks``: named locks (``app.lease(name)``), distinct from the job leases a worker holds;
- ``tenants``: the operator's limits per tenant and one tenant's view (``TenantView``);
- ``ops``: the operator service (``app.ops``) the REST API and the dashboard use.

Nothing is imported here: import public names from :mod:`conveyor`.
"""
