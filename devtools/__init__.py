"""Development tooling, not shipped in the wheel: private servers, `relay` subprocesses, and
outbox and queue helpers shared by tests/, bench/ and examples/.

The ``relay`` package never imports this one (ruff's banned-api rule checks it).
"""
