"""Reading and writing a model configuration: config.pbtxt (protobuf text), and Triton's JSON form."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any, Callable

from google.protobuf import json_format, text_format
from google.protobuf.descriptor import Descriptor, FieldDescriptor

from host.errors import InvalidArgumentError
from host.proto.model_config_pb2 import ModelConfig

CONFIG_FILENAME = "config.pbtxt"

_INT64_TYPES = frozenset({
    FieldDescriptor.TYPE_INT64, FieldDescriptor.TYPE_UINT64, FieldDescriptor.TYPE_SINT64,
    FieldDescriptor.TYPE_FIXED64, FieldDescriptor.TYPE_SFIXED64,
})


def parse_config_text(text: str, source: str) -> ModelConfig:
    """Parse config.pbtxt text; errors name `source` so a user can find the broken file."""
    config = ModelConfig()
    try:
        text_format.Parse(text, config)
    except text_format.ParseError as exc:
        detail = _cpp_parse_error(str(exc))
        if (source, text) not in _REPORTED:  # a config is read more than once per load
            _REPORTED[(source, text)] = None
            _libprotobuf_error(detail)
        raise InvalidArgumentError(f"failed to read text proto from {source}: {detail}") from None
    return config


_REPORTED: dict[tuple[str, str], None] = {}  # broken configs whose line was written


def _libprotobuf_error(detail: str) -> None:
    """The line the C++ protobuf library writes to stderr when Triton fails to parse a config,
    unescaped (Triton's QA greps it: `Expected integer, got: "invalid_value"`)."""
    found = re.match(r"(\d+):(\d+) : '.*': (.*)$", detail, re.S)
    where, what = (f"{found.group(1)}:{found.group(2)}", found.group(3)) if found else ("", detail)
    print("[libprotobuf ERROR google/protobuf/text_format.cc:337] Error parsing text-format "
          f"inference.ModelConfig: {where + ': ' if where else ''}{what}", file=sys.stderr, flush=True)


def _cpp_parse_error(message: str) -> str:
    """Python's text-format integer errors in the words of the C++ parser Triton uses (its QA
    greps them): `Expected integer, got: <token>` for a token that is no integer (a string, a
    float, a minus sign before an unsigned field's value), `Integer out of range (<n>)`."""
    found = re.search(r"Couldn't parse integer: (.*)$", message)
    if found:
        return f"{message[:found.start()]}Expected integer, got: {found.group(1)}"
    found = re.search(r"Value out of range: (-?)(\d+)$", message)
    if found:
        sign, digits = found.groups()
        # A negative value out of range below int32's limit can only be an unsigned field's.
        text = "Expected integer, got: -" if sign and int(digits) <= 2**31 \
            else f"Integer out of range ({digits})"
        return message[:found.start()] + text
    return message


def load_config_file(model_dir: Path, custom_name: str = "") -> ModelConfig | None:
    """Read `<model_dir>/config.pbtxt`; None when absent (Triton may then auto-complete one).

    With `custom_name` (--model-config-name), `<model_dir>/configs/<custom_name>.pbtxt` is read
    instead where it exists, as Triton does.
    """
    path = Path(model_dir) / CONFIG_FILENAME
    if custom_name:
        custom = Path(model_dir) / "configs" / f"{custom_name}.pbtxt"
        if custom.is_file():
            path = custom
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:  # unreadable, a directory, not UTF-8
        raise InvalidArgumentError(f"failed to read text proto from {path}: {exc}") from None
    return parse_config_text(text, str(path))


def config_from_json(data: str | bytes | dict) -> ModelConfig:
    """Parse a JSON config (the "load with config override" form), as Triton's JsonToModelConfig.

    Unknown fields are errors; enum names are matched case-insensitively, as Triton does.
    """
    try:
        if isinstance(data, (bytes, bytearray)):
            data = data.decode()
        if isinstance(data, str):
            data = json.loads(_quote_bare_keys(data))
        if not isinstance(data, dict):
            raise InvalidArgumentError(
                f"model configuration JSON must be an object, got {type(data).__name__}")
        return json_format.ParseDict(_upper_enum_names(data, ModelConfig.DESCRIPTOR), ModelConfig())
    except (json_format.ParseError, ValueError, TypeError) as exc:
        raise InvalidArgumentError(f"failed to parse model configuration JSON: {exc}") from None


# A string, or an identifier used as an object key (`direct: {...}`). Triton parses config
# overrides with protobuf's JSON parser, which takes such bare-word keys (Triton's own QA sends
# them); the standard JSON reader here does not, so they are quoted first. Strings are matched
# whole, so nothing inside one is touched.
_KEY_OR_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\b([A-Za-z_][A-Za-z0-9_]*)(?=\s*:)')


def _quote_bare_keys(text: str) -> str:
    def quote(match: re.Match) -> str:
        word = match.group(1)
        if word is None or word in ("true", "false", "null"):
            return match.group(0)
        return f'"{word}"'

    return _KEY_OR_STRING.sub(quote, text)


def config_to_json(cfg: ModelConfig) -> dict[str, Any]:
    """The JSON form of Triton's `GET /v2/models/<m>/config`.

    Proto field names, enum names, fields without presence printed with their defaults, and
    64-bit integers as JSON numbers (protobuf's JSON mapping quotes them; Triton unquotes them).
    """
    doc = json_format.MessageToDict(
        cfg, preserving_proto_field_name=True, always_print_fields_with_no_presence=True)
    return _walk_json(doc, cfg.DESCRIPTOR, _unquote_int64)


def _unquote_int64(field: FieldDescriptor, value: Any) -> Any:
    """Turn a quoted 64-bit integer back into a number."""
    if field.type in _INT64_TYPES and isinstance(value, str):
        return int(value)
    return value


def _upper_enum_names(doc: dict, descriptor: Descriptor) -> dict:
    """Copy of a JSON config whose unknown lowercase enum names are upper-cased (Triton's rule)."""
    def fix(field: FieldDescriptor, value: Any) -> Any:
        if (field.enum_type is not None and isinstance(value, str)
                and value not in field.enum_type.values_by_name
                and value.upper() in field.enum_type.values_by_name):
            return value.upper()
        return value
    return _walk_json(doc, descriptor, fix)


def _walk_json(doc: Any, descriptor: Descriptor,
               fix: Callable[[FieldDescriptor, Any], Any]) -> Any:
    """Rebuild a JSON object of message `descriptor`, passing every scalar through `fix`.

    Follows nested messages, repeated fields and map values (map keys stay strings: JSON object
    keys can't be numbers). Keys may be proto names or lowerCamel JSON names. Keys come out in
    the .proto's declaration order, as Triton prints them.
    """
    if not isinstance(doc, dict):
        return doc  # malformed input: leave it for json_format to report
    out = {}
    for field in descriptor.fields:
        for key in (field.name, field.json_name):
            if key in doc and key not in out:
                out[key] = _walk_field(field, doc[key], fix)
    for key, value in doc.items():  # unknown keys: kept for json_format to report
        out.setdefault(key, value)
    return out


def _walk_field(field: FieldDescriptor, value: Any,
                fix: Callable[[FieldDescriptor, Any], Any]) -> Any:
    """Apply `fix` to one field's JSON value (map, repeated, message or scalar)."""
    message_type = field.message_type
    if message_type is not None and message_type.GetOptions().map_entry:
        if not isinstance(value, dict):
            return value
        value_field = message_type.fields_by_name["value"]
        return {k: _walk_field(value_field, v, fix) for k, v in value.items()}
    if _is_repeated(field):
        # protobuf's C++ JSON parser, which Triton's JsonToModelConfig uses, takes one value
        # where a list is expected as a list of that value (`"instance_group": {...}`)
        values = value if isinstance(value, list) else [] if value is None else [value]
        return [_walk_single(field, v, fix) for v in values]
    return _walk_single(field, value, fix)


def _walk_single(field: FieldDescriptor, value: Any,
                 fix: Callable[[FieldDescriptor, Any], Any]) -> Any:
    """Apply `fix` to one non-repeated value of `field`."""
    if field.message_type is not None:
        return _walk_json(value, field.message_type, fix)
    return fix(field, value)


def _is_repeated(field: FieldDescriptor) -> bool:
    """Repeated-ness across protobuf versions (`label` is deprecated in newer runtimes)."""
    is_repeated = getattr(field, "is_repeated", None)
    if is_repeated is not None:
        return bool(is_repeated)
    return field.label == FieldDescriptor.LABEL_REPEATED
