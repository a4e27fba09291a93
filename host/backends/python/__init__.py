"""The builtin "python" backend: Triton python-backend models (`model.py`) run in process.

`backend` holds the Backend/Model/Instance classes, `pb_utils` the `triton_python_backend_utils`
API the models import, and `plugin` the pluggy registration.
"""
