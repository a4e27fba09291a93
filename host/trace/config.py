"""The start-up trace configuration: Triton's --trace-config flags and their deprecated forms."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

TIMESTAMPS, TENSORS = 0x4, 0x8  # TRITONSERVER_InferenceTraceLevel bits
OFF = 0
MODES = ("triton", "opentelemetry")
INT32_MAX, UINT32_MAX = 2**31 - 1, 2**32 - 1
_BSP_DEFAULTS = (("bsp_max_queue_size", "OTEL_BSP_MAX_QUEUE_SIZE", "2048"),
                 ("bsp_schedule_delay", "OTEL_BSP_SCHEDULE_DELAY", "5000"),
                 ("bsp_max_export_batch_size", "OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "512"))


@dataclass
class TraceConfig:
    """The start-up trace configuration (Triton's defaults)."""

    level: int = OFF
    rate: int = 1000
    count: int = -1
    log_frequency: int = 0
    file: str = ""
    mode: str = "triton"
    # The mode's own settings in the order given ("url", "resource", "bsp_*" for opentelemetry);
    # answered by the settings API as Triton does, except file and log-frequency.
    options: list[tuple[str, str]] = field(default_factory=list)


def parse_level(text: str) -> int:
    """A --trace-config level value (Triton's ParseTraceLevelOption)."""
    value = text.lower()
    if value in ("false", "off"):
        return OFF
    if value in ("true", "on", "min", "max", "timestamps"):
        return TIMESTAMPS
    if value == "tensors":
        return TENSORS
    raise ValueError(f"invalid value for trace level option: {value}")


def _parse_mode(text: str) -> str:
    value = text.lower()
    if value not in MODES:
        raise ValueError(f'invalid value for trace mode option: {value}. Available options are '
                         '"triton" and "opentelemetry"')
    return value


def split_setting(text: str) -> tuple[str, str, str]:
    """`<mode>,<setting>=<value>` or `<setting>=<value>` -> (mode or "", setting, value)."""
    mode, comma, rest = text.partition(",")
    if not comma:
        mode, rest = "", text
    elif not mode:
        raise ValueError("No trace mode specified. --trace-config option format is <trace mode>,"
                         f"<setting>=<value> or <setting>=<value>. Got {text}")
    else:
        mode = _parse_mode(mode)
    setting, eq, value = rest.partition("=")
    if not eq or not setting or not value:
        raise ValueError(f"--trace-config option format is '<trace mode>,<setting>=<value>'. Got {text}")
    return mode, setting, value


def _int(text: str, low: int, high: int) -> int:
    try:
        value = int(text.strip())
    except ValueError:
        raise ValueError(f"invalid integer '{text}'") from None
    if not low <= value <= high:
        raise ValueError(f"'{text}' is out of range [{low}, {high}]")
    return value


def parse_config(settings: list[tuple[str, str, str]], deprecated: dict[str, Any] | None = None
                 ) -> TraceConfig:
    """Settings from --trace-config (as `split_setting` triples) plus the deprecated flags
    (--trace-file, --trace-level, --trace-rate, --trace-count, --trace-log-frequency), which
    --trace-config overrides, as Triton's command line parser does. Raises ValueError."""
    cfg = TraceConfig()
    old = deprecated or {}
    disabled = False
    for level in old.get("level") or []:
        parsed = parse_level(level)
        disabled |= parsed == OFF
        cfg.level |= parsed
    if old.get("rate") is not None:
        cfg.rate = old["rate"]
    if old.get("count") is not None:
        cfg.count = old["count"]
    if old.get("file") is not None:
        cfg.file = old["file"]
    if old.get("log_frequency") is not None:
        cfg.log_frequency = old["log_frequency"]
    for mode, key, value in settings:
        if mode:
            continue
        try:
            if key == "rate":
                cfg.rate = _int(value, -INT32_MAX - 1, INT32_MAX) & UINT32_MAX
            elif key == "level":
                parsed = parse_level(value)
                disabled |= parsed == OFF
                cfg.level |= parsed
            elif key == "mode":
                cfg.mode = _parse_mode(value)
            elif key == "count":
                cfg.count = _int(value, -INT32_MAX - 1, INT32_MAX)
            elif key in ("log-frequency", "log_frequency"):  # a triton-mode setting, given bare
                cfg.log_frequency = _int(value, 0, INT32_MAX)
        except ValueError as exc:
            raise ValueError(f'Bad option: "--trace-config {key}".\n{exc}') from None
    for mode, key, value in settings:
        if mode != cfg.mode:
            continue
        try:
            if mode == "triton" and key == "file":
                cfg.file = value
            elif mode == "triton" and key in ("log-frequency", "log_frequency"):
                cfg.log_frequency = _int(value, 0, INT32_MAX)
            elif mode == "opentelemetry":
                if key.startswith("bsp_"):
                    _int(value, 0, UINT32_MAX)
                cfg.options.append((key, value))
            else:
                cfg.options.append((key, value))
        except ValueError as exc:
            raise ValueError(f'Bad option: "--trace-config {mode},{key}".\n{exc}') from None
    if cfg.mode == "opentelemetry":
        given = {k for k, _ in cfg.options}
        for key, env, default in _BSP_DEFAULTS:
            if key not in given:
                value = os.environ.get(env, default)
                try:
                    _int(value, 0, UINT32_MAX)
                except ValueError as exc:
                    raise ValueError(f'Bad option: "{env}".\n{exc}') from None
                cfg.options.append((key, value))
    if disabled:
        cfg.level = OFF
    return cfg
