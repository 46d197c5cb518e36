"""moto's DynamoDB-compatible server, applying one request at a time.

DynamoDB applies each conditional write atomically; moto's own threaded server
checks a condition and writes without holding a lock, so two concurrent claims of
one key can both pass their condition. Serializing the requests gives the tests
the atomicity DynamoDB promises. Usage: moto_serialized.py HOST PORT
"""

import sys
import threading

from moto.server import DomainDispatcherApplication, create_backend_app
from werkzeug.serving import run_simple

app = DomainDispatcherApplication(create_backend_app)
lock = threading.Lock()


def serialized(environ, start_response):
    with lock:
        # The whole answer is produced inside the lock.
        return list(app(environ, start_response))


if __name__ == "__main__":
    host, port = sys.argv[1], int(sys.argv[2])
    run_simple(host, port, serialized, threaded=True)
