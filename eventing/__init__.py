"""eventing: Couchbase-Eventing-style mutation processing on Ray, with event-time windows on PySpark.

Handler authors need only `eventing.handler` (Meta, DeleteOptions, log); bindings arrive as globals.
"""

from eventing.errors import EventingError

__version__ = "0.1.0"

__all__ = ["EventingError", "__version__"]
