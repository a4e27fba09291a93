"""Model configuration: parsing config.pbtxt and JSON, Triton's JSON form, defaults, validation.

The configuration is the `inference.ModelConfig` protobuf (host/proto/model_config.proto, wire-
compatible with Triton's). `normalize_config` reproduces what Triton's core does to a freshly read
config before a model loads (auto-complete of backend fields, defaults, validation), so that the
config a client reads back from us is the one Triton would have shown, and a config Triton rejects
is rejected here with Triton's message.

One module per concern; this package re-exports the public names:

- `parse`: config.pbtxt and JSON in and out;
- `platforms`: platform -> backend, model file -> backend, instance kind names;
- `versions`: the version policy's default and selection;
- `autocomplete`: Triton's auto-complete and defaults (`normalize_config`);
- `validate`: Triton's checks and messages.
"""

from host.config.autocomplete import (SEQUENCE_IDLE_DEFAULT_MICROSECONDS, normalize_config,
                                      normalize_instance_groups)
from host.config.parse import (CONFIG_FILENAME, config_from_json, config_to_json, load_config_file,
                               parse_config_text)
from host.config.platforms import (ENSEMBLE_PLATFORM, KNOWN_BACKENDS, MODEL_FILES, PLATFORM_BACKENDS,
                                   backend_for, infer_backend, instance_kind_name)
from host.config.validate import validate_io_config
from host.config.versions import default_policy, select_versions

__all__ = [
    "CONFIG_FILENAME", "ENSEMBLE_PLATFORM", "KNOWN_BACKENDS", "MODEL_FILES", "PLATFORM_BACKENDS",
    "SEQUENCE_IDLE_DEFAULT_MICROSECONDS", "backend_for", "config_from_json", "config_to_json",
    "default_policy", "infer_backend", "instance_kind_name", "load_config_file", "normalize_config",
    "normalize_instance_groups",
    "parse_config_text", "select_versions", "validate_io_config",
]
