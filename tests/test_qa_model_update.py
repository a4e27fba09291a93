"""Instance-group updates and concurrent loads, as Triton's QA checks them (server repo
qa/L0_model_update instance_update_test.py; qa/L0_lifecycle's concurrent-load cases).

- A reload whose configuration differs from the serving one only in `instance_group` updates the
  version in place (Triton's TritonModel::UpdateInstanceGroup): instances whose group is unchanged
  (name and count aside) are kept, the difference is created or removed (a removed instance is
  finalized before the load returns, or, holding a sequence, when the sequence ends), the model
  stays ready; any other change loads the version again. A failed update leaves the version
  serving, and the load fails with "version 1 is at READY state: ...".
- Loads of different models run in parallel; a load and an unload of one model run one after the
  other; a model's instances load in parallel where the backend allows it (python: process mode).
- The rate limiter logs Triton's "Max Resource Map" after an instance comes or goes.

The models log their instances' initialize/finalize to a file outside the repository (a file in a
model's folder would count as a changed model file).
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from host.testing import serve

pytestmark = pytest.mark.modelhost_only

# Logs "init <instance>" / "fini <instance>" to <root>/<model>.events; refuses to initialize
# while <root>/<model>.fail exists; with parameter MEET, writes <root>/<model>.<instance> and
# waits (at most 20 s) until the markers named by MEET exist.
MODEL = '''
import json
import os
import time
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        cfg = json.loads(args["model_config"])
        model = args["model_name"]
        self.root = os.path.dirname(os.path.dirname(os.path.realpath(args["model_repository"])))
        self.events = os.path.join(self.root, model + ".events")
        self.name = args["model_instance_name"]
        if os.path.exists(os.path.join(self.root, model + ".fail")):
            raise pb_utils.TritonModelException("refused to initialize")
        meet = cfg.get("parameters", {}).get("MEET", {}).get("string_value", "")
        if meet:
            open(os.path.join(self.root, model + "." + self.name), "w").close()
            deadline = time.time() + 20
            while not all(os.path.exists(os.path.join(self.root, m)) for m in meet.split(",")):
                if time.time() > deadline:
                    raise pb_utils.TritonModelException("nobody came: " + meet)
                time.sleep(0.05)
        gate = cfg.get("parameters", {}).get("GATE", {}).get("string_value", "")
        if gate:
            open(os.path.join(self.root, model + ".started"), "w").close()
            deadline = time.time() + 30
            while not os.path.exists(os.path.join(self.root, gate)) and time.time() < deadline:
                time.sleep(0.05)
        with open(self.events, "a") as f:
            f.write("init " + self.name + "\\n")

    def execute(self, requests):
        return [pb_utils.InferenceResponse(
            [pb_utils.Tensor("OUT", pb_utils.get_input_tensor_by_name(r, "IN").as_numpy())])
            for r in requests]

    def finalize(self):
        with open(self.events, "a") as f:
            f.write("fini " + self.name + "\\n")
'''


def _config(name: str, groups: str, extra: str = "", batch: int = 0) -> str:
    return f"""
name: "{name}"
backend: "python"
max_batch_size: {batch}
input [ {{ name: "IN" data_type: TYPE_FP32 dims: [ -1 ] }} ]
output [ {{ name: "OUT" data_type: TYPE_FP32 dims: [ -1 ] }} ]
instance_group [ {groups} ]
{extra}
"""


def _cpu(count: int) -> str:
    return f"{{ count: {count} kind: KIND_CPU }}"


class Repo:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.models = root / "models"

    def write(self, name: str, groups: str, extra: str = "", batch: int = 0) -> None:
        folder = self.models / name
        if not (folder / "1" / "model.py").exists():
            (folder / "1").mkdir(parents=True)
            (folder / "1" / "model.py").write_text(MODEL)
        (folder / "config.pbtxt").write_text(_config(name, groups, extra, batch))

    def events(self, name: str) -> tuple[int, int]:
        path = self.root / f"{name}.events"
        lines = path.read_text().split() if path.exists() else []
        return lines.count("init"), lines.count("fini")

    def wait_events(self, name: str, expected: tuple[int, int]) -> tuple[int, int]:
        deadline = time.monotonic() + 30
        while self.events(name) != expected and time.monotonic() < deadline:
            time.sleep(0.05)
        return self.events(name)


@pytest.fixture(scope="module")
def repo(tmp_path_factory) -> Repo:
    r = Repo(tmp_path_factory.mktemp("update"))
    r.models.mkdir()
    return r


@pytest.fixture(scope="module")
def server(repo):
    with serve(repo.models, "--model-control-mode=explicit") as running:
        yield running


@pytest.fixture(scope="module")
def client(server):
    c = httpclient.InferenceServerClient(server.url, network_timeout=120)
    yield c
    c.close()


def _call(server, method: str, *args) -> None:
    """A control call on a client of its own (a client is not shared between threads)."""
    c = httpclient.InferenceServerClient(server.url, network_timeout=120)
    try:
        getattr(c, method)(*args)
    finally:
        c.close()


def _infer(client, name: str, batch: int = 0, **kwargs) -> None:
    data = np.arange(3, dtype=np.float32).reshape((1, 3) if batch else (3,))
    inp = httpclient.InferInput("IN", list(data.shape), "FP32")
    inp.set_data_from_numpy(data)
    result = client.infer(name, [inp], **kwargs)
    np.testing.assert_array_equal(result.as_numpy("OUT"), data)


@pytest.mark.parametrize("batch", [0, 2])
def test_instance_group_change_updates_in_place(repo, client, batch):
    name = f"counted_{batch}"
    extra = "dynamic_batching { }" if batch else ""
    repo.write(name, _cpu(2), extra, batch)
    client.load_model(name)
    assert repo.events(name) == (2, 0)
    repo.write(name, _cpu(3), extra, batch)  # one more: the two serving stay
    client.load_model(name)
    assert repo.events(name) == (3, 0)
    assert client.is_model_ready(name)
    assert client.get_model_config(name)["instance_group"][0]["count"] == 3
    _infer(client, name, batch)
    repo.write(name, _cpu(1), extra, batch)  # two fewer: finalized before the load answers
    client.load_model(name)
    assert repo.events(name) == (3, 2)
    _infer(client, name, batch)
    repo.write(name, "{ count: 0 kind: KIND_CPU }", extra, batch)  # count 0 is 1: no change
    client.load_model(name)
    assert repo.events(name) == (3, 2)
    # The group's other settings are part of the signature: a MODEL instance replaces the CPU one.
    repo.write(name, '{ name: "renamed" count: 1 kind: KIND_MODEL }', extra, batch)
    client.load_model(name)
    assert repo.events(name) == (4, 3)
    _infer(client, name, batch)
    # Anything else changed: the version loads again, every instance with it.
    repo.write(name, '{ count: 2 kind: KIND_CPU }', extra + '\nparameters { key: "x" value: { string_value: "1" } }',
               batch)
    client.load_model(name)
    assert repo.wait_events(name, (6, 4)) == (6, 4)
    client.unload_model(name)
    assert repo.wait_events(name, (6, 6)) == (6, 6)


def test_failed_update_keeps_the_version_serving(repo, client):
    name = "fragile"
    repo.write(name, _cpu(1))
    client.load_model(name)
    (repo.root / f"{name}.fail").touch()
    repo.write(name, _cpu(2))
    with pytest.raises(InferenceServerException) as failure:
        client.load_model(name)
    assert failure.value.message().startswith(
        f"load failed for model '{name}': version 1 is at READY state: ")
    assert failure.value.message().endswith(";\n")  # as Triton's, a newline last
    assert "refused to initialize" in failure.value.message()
    assert client.is_model_ready(name)
    _infer(client, name)
    assert repo.events(name) == (1, 0)
    (repo.root / f"{name}.fail").unlink()
    client.load_model(name)
    assert repo.events(name) == (2, 0)
    client.unload_model(name)
    assert repo.wait_events(name, (2, 2)) == (2, 2)


def test_removed_instance_with_a_sequence_lives_until_it_ends(repo, client):
    name = "sequenced"
    seq = "sequence_batching { direct { } max_sequence_idle_microseconds: 60000000 }"
    repo.write(name, _cpu(2), seq)
    client.load_model(name)
    _infer(client, name, sequence_id=7, sequence_start=True)
    repo.write(name, "{ count: 1 kind: KIND_MODEL }", seq)
    client.load_model(name)
    # the idle CPU instance goes at once, the one holding sequence 7 stays for it
    assert repo.events(name) == (3, 1)
    _infer(client, name, sequence_id=7)
    _infer(client, name, sequence_id=8, sequence_start=True, sequence_end=True)
    assert repo.events(name) == (3, 1)
    _infer(client, name, sequence_id=7, sequence_end=True)
    assert repo.wait_events(name, (3, 2)) == (3, 2)
    client.unload_model(name)
    assert repo.wait_events(name, (3, 3)) == (3, 3)


def test_loads_of_different_models_run_in_parallel(repo, server, client):
    # Each model's initialize waits for the other's: one after the other, the first gives up.
    names = ["meet_a", "meet_b"]
    for name, other in zip(names, reversed(names)):
        repo.write(name, _cpu(1),
                   f'parameters {{ key: "MEET" value: {{ string_value: "{other}.{other}_0_0" }} }}')
    errors: list[BaseException] = []

    def load(name: str) -> None:
        try:
            _call(server, "load_model", name)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=load, args=(n,)) for n in names]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    assert all(client.is_model_ready(n) for n in names)
    for n in names:
        client.unload_model(n)


def test_instances_of_a_model_load_in_parallel(repo, client):
    # Process mode, as Triton's python backend: each instance waits for the other's initialize.
    name = "meet_self"
    repo.write(name, _cpu(2),
               f'parameters [ {{ key: "MEET" value: {{ string_value: "{name}.{name}_0_0,{name}.{name}_0_1" }} }},'
               ' { key: "EXECUTION_MODE" value: { string_value: "process" } } ]')
    client.load_model(name)
    assert client.is_model_ready(name)
    assert repo.events(name) == (2, 0)
    client.unload_model(name)


def test_unload_waits_for_the_load_of_the_same_model(repo, server, client):
    name = "gated"
    repo.write(name, _cpu(1), f'parameters {{ key: "GATE" value: {{ string_value: "{name}.go" }} }}')
    loader = threading.Thread(target=_call, args=(server, "load_model", name))
    loader.start()
    deadline = time.monotonic() + 30
    while not (repo.root / f"{name}.started").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    unloader = threading.Thread(target=_call, args=(server, "unload_model", name))
    unloader.start()
    unloader.join(1.0)
    assert unloader.is_alive()  # it waits for the load under way
    (repo.root / f"{name}.go").touch()
    loader.join(60)
    unloader.join(60)
    assert not client.is_model_ready(name)  # the unload came last
    assert repo.wait_events(name, (1, 1)) == (1, 1)


def test_rate_limiter_logs_the_resource_map(caplog):
    from host.proto import model_config_pb2
    from host.rate_limiter import RateLimiter

    def needs(count: int) -> model_config_pb2.ModelRateLimiter:
        limiter = model_config_pb2.ModelRateLimiter()
        limiter.resources.add(name="R1", count=count)
        return limiter

    limiter = RateLimiter()
    first, second = object(), object()
    with caplog.at_level(logging.DEBUG, logger="host.rate_limiter"):
        limiter.add_instance(first, needs(4), 0)
        limiter.add_instance(second, needs(3), 0)
        assert "Resource: R1\t Count: 3" not in caplog.text
        limiter.remove_instance(first)
    assert "\nMax Resource Map===>\n\tDevice: 0\n\t\tResource: R1\t Count: 3\n" in caplog.text
