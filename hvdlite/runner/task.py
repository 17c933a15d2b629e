"""What each rank of an :func:`hvdlite.run` job runs (``python -m hvdlite.runner.task``):
fetch the pickled call from the driver, run it, send back the result or the traceback.
See :mod:`hvdlite.runner.function` for the protocol."""
from __future__ import annotations

import os
import socket
import sys
import traceback

import cloudpickle

from hvdlite.runner.function import DRIVER_ENV, KEY_ENV, receive_message, send_message


def _rank() -> int:
    for name in ("OMPI_COMM_WORLD_RANK", "PMIX_RANK"):
        if os.environ.get(name, "").isdigit():
            return int(os.environ[name])
    raise RuntimeError("hvdlite.runner.task: no rank in the environment; this module is "
                       "started by hvdlite.run through mpirun")


def main(hello_id: int | None = None) -> int:
    """Run the driver's call; ``hello_id``: the number this process gives the driver
    (default its rank; an elastic job's workers give numbers of their own, since ranks
    repeat across the job's worlds)."""
    driver, key = os.environ.get(DRIVER_ENV), os.environ.get(KEY_ENV)
    if not driver or not key:
        print(f"hvdlite.runner.task: {DRIVER_ENV} and {KEY_ENV} are not set; this module is "
              f"started by hvdlite.run", file=sys.stderr)
        return 2
    rank = _rank() if hello_id is None else hello_id
    host, _, port = driver.rpartition(":")
    with socket.create_connection((host, int(port)), timeout=60.0) as sock:
        send_message(sock, f"{key} {rank}".encode("ascii"))
        func, args, kwargs = cloudpickle.loads(receive_message(sock))
        sock.settimeout(None)
        try:
            reply = ("ok", func(*args, **kwargs))
        except BaseException as exc:  # the driver reports it; this exit status ends the job
            # The traceback from the user's function down, without this module's frame.
            reply = ("error", "".join(traceback.format_exception(
                type(exc), exc, exc.__traceback__.tb_next if exc.__traceback__ else None)))
        try:
            data = cloudpickle.dumps(reply)
        except Exception:
            reply = ("error", f"the return value could not be pickled:\n{traceback.format_exc()}")
            data = cloudpickle.dumps(reply)
        send_message(sock, data)
    return 0 if reply[0] == "ok" else 1


if __name__ == "__main__":
    sys.exit(main())
