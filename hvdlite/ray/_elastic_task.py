"""What each worker of an elastic Ray job runs (``python -m hvdlite.ray._elastic_task``):
:mod:`hvdlite.runner.task`, under a number of its own rather than its rank."""
import secrets
import sys

from hvdlite.runner import task

if __name__ == "__main__":
    sys.exit(task.main(hello_id=secrets.randbelow(10 ** 12)))
