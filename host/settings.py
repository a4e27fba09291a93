"""Where `modelhost serve` takes its settings from: flags, MODELHOST_* variables, a config file.

Every flag of the `serve` parser has, derived from its long name and nothing else:
- a config-file key: `--http-port` is `http-port` (or `http_port`) in a TOML or YAML file,
- an environment variable: `--http-port` is `MODELHOST_HTTP_PORT`.

One precedence rule, per setting: a flag given on the command line wins over the environment,
which wins over the config file, which wins over the default. A repeatable flag
(`--model-repository`, `--cache-config`, ...) takes all its values from the one source that wins;
the sources are never mixed. Values from the file and the environment are turned back into flag
tokens and parsed by the same parser, so they meet the same types, choices and checks as flags.

Nothing here knows any particular flag: a flag added to the parser has its key and variable.
"""

from __future__ import annotations

import argparse
import difflib
import os
import tomllib
from pathlib import Path
from typing import Any, Mapping, Sequence

ENV_PREFIX = "MODELHOST_"
CONFIG_FLAG = "--config-file"
# A repeatable setting in one environment variable: values separated by ';' (values such as
# `--cache-config redis,host=h` hold commas, paths may hold ':').
ENV_LIST_SEPARATOR = ";"


class SettingsError(Exception):
    """A config file or environment value that cannot be used; the message names where it came from."""


def settable(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    """The parser's actions that are settings: every optional flag but --help and --config-file."""
    return [a for a in parser._actions
            if a.option_strings and a.dest != argparse.SUPPRESS
            and not isinstance(a, (argparse._HelpAction, argparse._VersionAction))
            and CONFIG_FLAG not in a.option_strings]


def long_name(action: argparse.Action) -> str:
    """`--http-port` for the action: its first long option string."""
    return next(o for o in action.option_strings if o.startswith("--"))


def key_of(action: argparse.Action) -> str:
    return long_name(action)[2:]


def env_of(action: argparse.Action) -> str:
    return ENV_PREFIX + key_of(action).upper().replace("-", "_")


def given_on_command_line(parser: argparse.ArgumentParser, argv: Sequence[str]) -> set[str]:
    """The dests that `argv` sets (argparse itself parses, so abbreviations and `--x=v` count)."""
    marker = _Unset()
    namespace = argparse.Namespace(**{a.dest: marker for a in settable(parser)})
    parsed, _ = parser.parse_known_args(list(argv), namespace)
    return {a.dest for a in settable(parser) if getattr(parsed, a.dest, marker) is not marker}


class _Unset(list):
    """A namespace value argparse leaves alone unless the flag is given (append copies it: a new object)."""


def resolve(parser: argparse.ArgumentParser, argv: Sequence[str],
            environ: Mapping[str, str] | None = None, config_file: str | None = None) -> list[str]:
    """`argv` preceded by the tokens of the settings that come from the environment or the file.

    Raises SettingsError naming the variable or the file key when a value is not acceptable.
    """
    environ = os.environ if environ is None else environ
    on_command_line = given_on_command_line(parser, argv)
    from_file = read_config_file(parser, config_file) if config_file else {}
    tokens: list[str] = []
    for action in settable(parser):
        if action.dest in on_command_line:
            continue
        name = env_of(action)
        if name in environ:
            values = [v.strip() for v in environ[name].split(ENV_LIST_SEPARATOR)] \
                if _repeatable(action) else [environ[name]]
            tokens += _tokens(action, values, f"environment variable {name}")
        elif action.dest in from_file:
            key, raw = from_file[action.dest]
            values = list(raw) if isinstance(raw, list) else [raw]
            tokens += _tokens(action, values, f"{config_file}: key '{key}'")
    return tokens + list(argv)


def read_config_file(parser: argparse.ArgumentParser, path: str) -> dict[str, tuple[str, Any]]:
    """The file's settings by dest: {dest: (key as written, value)}. TOML, or YAML (.yaml/.yml)."""
    file = Path(path)
    try:
        text = file.read_text()
    except OSError as exc:
        raise SettingsError(f"cannot read the config file '{path}': {exc.strerror or exc}") from None
    try:
        if file.suffix.lower() in (".yaml", ".yml"):
            import yaml

            data = yaml.safe_load(text) or {}
        else:
            data = tomllib.loads(text)
    except Exception as exc:  # noqa: BLE001 - any parse error is the file's fault
        raise SettingsError(f"the config file '{path}' is not valid "
                            f"{'YAML' if file.suffix.lower() in ('.yaml', '.yml') else 'TOML'}: "
                            f"{str(exc).splitlines()[0]}") from None
    if not isinstance(data, dict):
        raise SettingsError(f"the config file '{path}' must hold a table of settings (key = value)")
    by_key = {key_of(a): a for a in settable(parser)}
    settings: dict[str, tuple[str, Any]] = {}
    for key, value in data.items():
        action = by_key.get(str(key).replace("_", "-"))
        if action is None:
            close = difflib.get_close_matches(str(key).replace("_", "-"), by_key, n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            raise SettingsError(f"{path}: unknown setting '{key}'{hint}; the keys are the flags of "
                                f"`modelhost serve --help` without their leading '--'")
        settings[action.dest] = (str(key), value)
    return settings


def _repeatable(action: argparse.Action) -> bool:
    return isinstance(action, argparse._AppendAction) or action.nargs in ("*", "+")


def _tokens(action: argparse.Action, values: list[Any], source: str) -> list[str]:
    """Flag tokens for `values` of one setting, checked as argparse would check the flag."""
    flag = long_name(action)
    if isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction)):
        on = _truth(values[0], source)
        return [flag] if on == isinstance(action, argparse._StoreTrueAction) else []
    if isinstance(action, argparse._CountAction):
        return [flag] * int(_text(values[0]))
    if len(values) > 1 and not _repeatable(action):
        raise SettingsError(f"{source}: expected one value, got a list")
    texts = [_text(v) for v in values]
    for text in texts:
        _check(action, text, source)
    if isinstance(action, argparse._AppendAction):
        return [f"{flag}={t}" for t in texts]
    if action.nargs in ("*", "+"):
        return [flag, *texts]
    return [f"{flag}={texts[0]}"]


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _truth(value: Any, source: str) -> bool:
    text = _text(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off", ""):
        return False
    raise SettingsError(f"{source}: expected true or false, got '{value}'")


def _check(action: argparse.Action, text: str, source: str) -> None:
    value: Any = text
    if callable(action.type):
        try:
            value = action.type(text)
        except (TypeError, ValueError, argparse.ArgumentTypeError) as exc:
            kind = getattr(action.type, "__name__", "value")
            detail = str(exc) if isinstance(exc, argparse.ArgumentTypeError) else \
                f"invalid {kind} value: '{text}'"
            raise SettingsError(f"{source}: {detail}") from None
    if action.choices is not None and value not in action.choices:
        raise SettingsError(f"{source}: invalid choice '{text}' "
                            f"(choose from {', '.join(map(str, action.choices))})")
