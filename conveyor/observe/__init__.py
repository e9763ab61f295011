"""What a process tells of its jobs: log formats (``logs``), Prometheus metrics
(``metrics``), callbacks per attempt (``hooks``) and OpenTelemetry spans (``tracing``).

These modules depend on the core only, so every other layer may use them.
"""
