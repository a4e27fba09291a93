"""`modelhost serve` settings: flags, MODELHOST_* variables and a config file, one precedence rule;
`serve --help` documents every flag with its default; typos show `serve`'s usage."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

from host import cli, settings

pytestmark = pytest.mark.modelhost_only


def _args(argv, env=None):
    return cli.parse_serve_args(cli.build_parser(), argv, env or {})


def _serve_parser() -> argparse.ArgumentParser:
    return cli.build_parser()._subparsers._group_actions[0].choices["serve"]


def test_every_flag_has_a_key_and_a_variable_derived_from_its_name():
    actions = settings.settable(_serve_parser())
    names = {settings.long_name(a) for a in actions}
    assert {"--http-port", "--model-repository", "--cache-config", "--exit-on-error"} <= names
    port = next(a for a in actions if settings.long_name(a) == "--http-port")
    assert settings.key_of(port) == "http-port" and settings.env_of(port) == "MODELHOST_HTTP_PORT"
    repo = next(a for a in actions if settings.long_name(a) == "--model-repository")
    assert settings.env_of(repo) == "MODELHOST_MODEL_REPOSITORY"  # the first long name, not dest


def test_precedence_flag_over_environment_over_file_over_default(tmp_path):
    toml = tmp_path / "modelhost.toml"
    toml.write_text('http-port = 9100\ngrpc_port = 9101\nmetrics-port = 9102\n'
                    'model-repository = ["/a", "/b"]\nexit-on-error = true\n'
                    'cache-config = ["local,size=4096"]\n')
    env = {"MODELHOST_GRPC_PORT": "9201", "MODELHOST_METRICS_PORT": "9202"}
    args = _args(["--config-file", str(toml), "--metrics-port", "9302"], env)
    assert (args.http_port, args.grpc_port, args.metrics_port) == (9100, 9201, 9302)
    assert args.repos == [Path("/a"), Path("/b")] and args.exit_on_error is True
    assert args.cache_config == [("local", "size", "4096")]
    assert args.allow_grpc is True and args.log_verbose == 0  # defaults where nothing says
    # the file can also be named by the environment
    assert _args([], {"MODELHOST_CONFIG_FILE": str(toml)}).http_port == 9100


def test_a_repeatable_flag_takes_its_values_from_one_source(tmp_path):
    toml = tmp_path / "c.toml"
    toml.write_text('model-repository = ["/file"]\n')
    env = {"MODELHOST_MODEL_REPOSITORY": "/env1;/env2",
           "MODELHOST_CACHE_CONFIG": "redis,host=r;redis,port=6379"}
    args = _args(["--config-file", str(toml)], env)
    assert args.repos == [Path("/env1"), Path("/env2")]  # not mixed with the file's
    assert args.cache_config == [("redis", "host", "r"), ("redis", "port", "6379")]
    args = _args(["--config-file", str(toml), "--model-repository", "/flag"], env)
    assert args.repos == [Path("/flag")]


def test_yaml_config_and_boolean_forms(tmp_path):
    yml = tmp_path / "modelhost.yaml"
    yml.write_text("allow-grpc: false\nlog-format: json\nload-model: [a, b]\n"
                   "model-control-mode: explicit\n")
    args = _args(["--config-file", str(yml)], {"MODELHOST_ALLOW_METRICS": "off"})
    assert args.allow_grpc is False and args.allow_metrics is False and args.log_format == "json"
    assert args.load_model == ["a", "b"] and args.model_control_mode == "explicit"


def _run(*argv, env=None, cwd=None):
    return subprocess.run([sys.executable, "-m", "host", *argv], capture_output=True, text=True,
                          timeout=60, env={**_base_env(), **(env or {})}, cwd=cwd)


def _base_env():
    import os
    return {k: v for k, v in os.environ.items() if not k.startswith("MODELHOST_")}


@pytest.mark.parametrize("env, file_text, expected", [
    ({"MODELHOST_HTTP_PORT": "eighty"}, None,
     "environment variable MODELHOST_HTTP_PORT: invalid int value: 'eighty'"),
    ({"MODELHOST_MODEL_CONTROL_MODE": "sometimes"}, None,
     "environment variable MODELHOST_MODEL_CONTROL_MODE: invalid choice 'sometimes'"),
    ({}, "htp-port = 1\n", "unknown setting 'htp-port' (did you mean 'http-port'?)"),
    ({}, "http-port = [1, 2]\n", "key 'http-port': expected one value, got a list"),
    ({}, "http-port = \n", "is not valid TOML"),
])
def test_bad_settings_are_one_line_naming_their_source(tmp_path, env, file_text, expected):
    argv = ["serve"]
    if file_text is not None:
        (tmp_path / "m.toml").write_text(file_text)
        argv += ["--config-file", str(tmp_path / "m.toml")]
    result = _run(*argv, env=env)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and expected in lines[0], result.stderr
    assert "Traceback" not in result.stderr


def test_typos_show_the_usage_of_serve():
    result = _run("serve", "--htp-port", "8000")
    assert result.returncode == 2
    assert result.stderr.startswith("usage: modelhost serve ")
    assert result.stderr.strip().splitlines()[-1] == \
        "modelhost serve: error: unrecognized arguments: --htp-port 8000"
    result = _run("serve", "--http-port", "x")
    assert result.returncode == 2 and "usage: modelhost serve " in result.stderr
    assert "argument --http-port: invalid int value: 'x'" in result.stderr


def test_help_shows_every_flag_with_help_and_default():
    parser = _serve_parser()
    formatter = parser._get_formatter()
    for action in settings.settable(parser):
        assert action.help, f"{settings.long_name(action)} has no help text"
        assert "default" in formatter._get_help_string(action), settings.long_name(action)
    text = _run("serve", "--help").stdout
    assert "(default: 8000)" in text and "MODELHOST_HTTP_PORT" in text
    for action in settings.settable(parser):
        assert settings.long_name(action) in text


def test_flags_added_elsewhere_get_their_variable_and_key_too(tmp_path):
    # --id, --backend-config and --disable-auto-complete-config come from host.cli_triton: no
    # code of host.settings names them
    toml = tmp_path / "m.toml"
    toml.write_text('backend-config = ["onnxruntime,default-max-batch-size=4"]\n'
                    "disable-auto-complete-config = true\n")
    args = _args(["--config-file", str(toml)], {"MODELHOST_ID": "replica-7"})
    assert args.server_id == "replica-7" and args.disable_auto_complete_config is True
    assert args.backend_config and "onnxruntime" in str(args.backend_config[0])
    off = _args(["--config-file", str(toml)], {"MODELHOST_DISABLE_AUTO_COMPLETE_CONFIG": "false"})
    assert off.disable_auto_complete_config is False  # a store_true flag turned off by the env
