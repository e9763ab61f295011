"""The pure core of conveyor: job model, lifecycle (state machine) and retry policy.

Nothing in this package performs I/O, reads a clock or imports asyncio or a database
driver. It decides; the worker, the backends and the web layer carry out.
"""
