"""`import triton_python_backend_utils as pb_utils` for Triton python-backend models run by modelhost.

The implementation lives in `host.backends.python.pb_utils`; this package re-exports its public
API under the name Triton's models import.
"""

from host.backends.python.pb_utils import *  # noqa: F401,F403
from host.backends.python.pb_utils import __all__  # noqa: F401
