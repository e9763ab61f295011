"""The chaos suite: real worker processes, injected faults, an out-of-band run log and a
checker for conveyor's guarantees. Not part of the test run: ``python -m chaos --help``."""
