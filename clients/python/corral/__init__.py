"""corral: the Python client of corrald, the supervisor that runs tool
commands for AI agents (https://github.com/corral-dev/corral).

Standard library only. Blocking:

    import corral
    r = corral.run(["python3", "-c", "print(6*7)"], timeout_ms=10000)
    r.ok, r.exit_code, r.stdout          # True, 0, b"42\\n"

    with corral.Client() as c:           # $CORRAL_SOCKET or /run/corral/corrald.sock
        rec = c.start(["sleep", "5"], labels={"tool_call": "t1"})
        for ev in c.follow(rec.id):      # OutputEvent, StateEvent, HeartbeatEvent, EndEvent
            ...
        c.cancel(rec.id)

asyncio: corral.aio.connect(), corral.aio.AsyncClient, corral.aio.run.
Errors answered by corrald raise CorralError with .code (corral.NOT_FOUND,
corral.INVALID_PARAMS, ...); a dropped connection raises ConnectionClosed.
"""

from ._wire import (  # noqa: F401
    DEFAULT_SOCKET,
    IDEMPOTENCY_CONFLICT,
    INTERNAL_ERROR,
    INVALID_PARAMS,
    INVALID_REQUEST,
    METHOD_NOT_FOUND,
    NOT_FOUND,
    OVER_CAPACITY,
    PARSE_ERROR,
    PERMISSION_DENIED,
    SHUTTING_DOWN,
    STATES,
    ConnectionClosed,
    CorralError,
    EndEvent,
    Event,
    HeartbeatEvent,
    Info,
    Output,
    OutputEvent,
    Owner,
    Record,
    Result,
    StateEvent,
    StreamInfo,
    TTYSize,
    Usage,
    default_socket,
)
from .client import Client, run  # noqa: F401
from . import aio  # noqa: F401

__version__ = "0.1.0"
