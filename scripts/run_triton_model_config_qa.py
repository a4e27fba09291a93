#!/usr/bin/env python3
"""Run the cases of Triton's `qa/L0_model_config` against `modelhost serve`, as its test.sh does.

Not used by CI, and fetches nothing: point it at a copy of triton-inference-server/server's
`qa/` folder. Each case is a model folder (or a repository) and one or more `expected*` files:

- `special_cases/*`, `noautofill_platform/*` (once per platform: tensorrt_plan,
  onnxruntime_onnx, pytorch_libtorch, with `--strict-model-config=true`) and
  `autofill_noplatform/{python,ensemble,custom,common}/*`: the server must fail to start, and
  its log must hold an error line (`^E<MMDD>`) that matches an `expected*` text (a grep pattern);
- `autofill_noplatform_success/{python,ensemble,custom}/*`: the server must start, and the
  model's configuration must equal an `expected*` one (as `compare_status.py` compares: the HTTP
  JSON, else the gRPC message). On a host without GPUs an expectation written on a GPU machine
  (`KIND_GPU`, `gpus: [0]`) is also tried with that group on the CPU, and reported as such.

The other folders need files from Triton's QA data (TensorRT plans, ONNX, OpenVINO, TorchScript
models) and are skipped. Triton's test backends `identity` and `repeat` must be built first
(scripts/build_triton_example_backends.sh) and given with --backend-dir (`<dir>/<name>/libtriton_<name>.so`).

    scripts/run_triton_model_config_qa.py QA_DIR --backend-dir DIR [--repeat-lib PATH] [FILTER ...]

Triton's default `--exit-on-error=true` is passed, as the cases rely on it (docs/triton_compat.md).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request

PLATFORMS = ("tensorrt_plan", "onnxruntime_onnx", "pytorch_libtorch")
FAILING_KINDS = ("python", "ensemble", "custom", "common")
PASSING_KINDS = ("python", "ensemble", "custom")


class Runner:
    def __init__(self, args: argparse.Namespace) -> None:
        self.qa = os.path.join(args.qa, "L0_model_config")
        self.autocomplete_model = os.path.join(args.qa, "python_models", "auto_complete", "model.py")
        self.backend_dir, self.repeat_lib = args.backend_dir, args.repeat_lib
        self.work = tempfile.mkdtemp(prefix="model_config_qa_")
        self.models = os.path.join(self.work, "models")
        self.ports = args.ports
        self.filters = args.filter
        self.results: list[tuple[str, str]] = []

    # --- the server -------------------------------------------------------------------------
    def start(self, flags: list[str], log: str) -> subprocess.Popen | None:
        """The server, once live; None when it exited (the cases that must fail)."""
        http, grpc, metrics = self.ports
        proc = subprocess.Popen(
            [sys.executable, "-m", "host", "serve", f"--model-repository={self.models}", *flags,
             "--exit-on-error=true", f"--backend-directory={self.backend_dir}",
             f"--http-port={http}", f"--grpc-port={grpc}", f"--metrics-port={metrics}"],
            stdout=open(log, "w"), stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                return None
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{http}/v2/health/live", timeout=1):
                    return proc
            except OSError:
                time.sleep(0.2)
        return proc

    @staticmethod
    def stop(proc: subprocess.Popen) -> None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()

    # --- cases ----------------------------------------------------------------------------------
    def wanted(self, name: str) -> bool:
        return not self.filters or any(f in name for f in self.filters)

    def fresh(self) -> None:
        shutil.rmtree(self.models, ignore_errors=True)
        os.makedirs(self.models)

    def copy_case(self, source: str) -> str:
        """A model folder copied as one model, or a repository's models copied; returns the
        folder that holds the `expected*` files."""
        if os.path.exists(os.path.join(source, "config.pbtxt")) or source.endswith("no_config"):
            target = os.path.join(self.models, os.path.basename(source))
            shutil.copytree(source, target)
            return target
        for entry in os.listdir(source):
            path = os.path.join(source, entry)
            (shutil.copytree if os.path.isdir(path) else shutil.copy)(path, os.path.join(self.models, entry))
        return self.models

    def add_versions(self, kind: str) -> None:
        """Version folders as test.sh makes them: python models get their model.py (or the QA's
        auto_complete one), ensemble and custom models an empty version 1."""
        for model in glob.glob(os.path.join(self.models, "*", "")):
            version = os.path.join(model, "1")
            os.makedirs(version, exist_ok=True)
            if kind == "python":
                own = os.path.join(model, "model.py")
                shutil.copy(own if os.path.exists(own) else self.autocomplete_model, version)
            if os.path.basename(model.rstrip("/")) == "repeat_int32" and self.repeat_lib:
                shutil.copy(self.repeat_lib, version)

    def must_fail(self, name: str, flags: list[str], expected_dir: str) -> None:
        log = os.path.join(self.work, name.replace("/", ".") + ".log")
        proc = self.start(flags, log)
        if proc is not None:
            self.stop(proc)
            self.results.append((name, "FAIL: the server started"))
            return
        texts = [open(e).read() for e in sorted(glob.glob(os.path.join(expected_dir, "expected*")))]
        for text in texts:
            if subprocess.run(["grep", "^E[0-9][0-9][0-9][0-9].*" + text, log],
                              capture_output=True).returncode == 0:
                self.results.append((name, "ok"))
                return
        self.results.append((name, "FAIL: no error line matches " + " | ".join(t.strip() for t in texts)
                             + f" (log: {log})"))

    def must_serve(self, name: str, model: str, expected_dir: str) -> None:
        import tritonclient.grpc as grpcclient
        import tritonclient.grpc.model_config_pb2 as mc
        import tritonclient.http as httpclient
        from google.protobuf import json_format, text_format

        log = os.path.join(self.work, name.replace("/", ".") + ".log")
        proc = self.start([], log)
        if proc is None:
            self.results.append((name, f"FAIL: the server did not start (log: {log})"))
            return
        try:
            http_json = httpclient.InferenceServerClient(f"127.0.0.1:{self.ports[0]}").get_model_config(model)
            message = grpcclient.InferenceServerClient(f"127.0.0.1:{self.ports[1]}").get_model_config(model).config
            verdict = f"FAIL: configuration differs (got {json_format.MessageToJson(message)})"
            for path in sorted(glob.glob(os.path.join(expected_dir, "expected*"))):
                expected = text_format.Parse(open(path).read(), mc.ModelConfig())
                as_json = json.loads(json_format.MessageToJson(expected, preserving_proto_field_name=True))
                if as_json == http_json or expected == message:
                    verdict = "ok"
                    break
                for group in expected.instance_group:  # written on a GPU machine
                    if group.kind == mc.ModelInstanceGroup.KIND_GPU and list(group.gpus) == [0]:
                        group.kind = mc.ModelInstanceGroup.KIND_CPU
                        del group.gpus[:]
                if expected == message:
                    verdict = "ok (its GPU expectation, with the group on the CPU)"
            self.results.append((name, verdict))
        finally:
            self.stop(proc)

    def run(self) -> int:
        for target in sorted(os.listdir(os.path.join(self.qa, "special_cases"))):
            name = "special_cases/" + target
            if self.wanted(name):
                self.fresh()
                where = self.copy_case(os.path.join(self.qa, "special_cases", target))
                flags = ["--disable-auto-complete-config"] if target == "invalid_platform" else []
                self.must_fail(name, flags, where)
        for platform in PLATFORMS:
            for target in sorted(os.listdir(os.path.join(self.qa, "noautofill_platform"))):
                name = f"noautofill_platform/{platform}/{target}"
                if not self.wanted(name):
                    continue
                self.fresh()
                where = self.copy_case(os.path.join(self.qa, "noautofill_platform", target))
                config = os.path.join(where, "config.pbtxt")
                if os.path.exists(config):
                    lines = [line for line in open(config) if "platform:" not in line]
                    open(config, "w").write("".join(lines) + f'platform: "{platform}"\n')
                self.must_fail(name, ["--strict-model-config=true"], where)
        for case in sorted(glob.glob(os.path.join(self.qa, "autofill_noplatform", "*", "*"))):
            name = os.path.relpath(case, self.qa)
            kind = name.split("/")[1]
            if kind in FAILING_KINDS and self.wanted(name):
                self.fresh()
                where = self.copy_case(case)
                self.add_versions(kind)
                self.must_fail(name, ["--strict-model-config=false"], where)
        for case in sorted(glob.glob(os.path.join(self.qa, "autofill_noplatform_success", "*", "*"))):
            name = os.path.relpath(case, self.qa)
            kind = name.split("/")[1]
            if kind in PASSING_KINDS and self.wanted(name):
                self.fresh()
                self.copy_case(case)
                self.add_versions(kind)
                model = os.path.basename(case)
                self.must_serve(name, model, os.path.join(self.models, model))
        passed = 0
        for name, verdict in self.results:
            ok = verdict.startswith("ok")
            passed += ok
            note = verdict[2:].strip(" ()") if ok else verdict.removeprefix("FAIL: ")
            print(("PASS " if ok else "FAIL ") + name + (f"  [{note}]" if note else ""))
        print(f"{passed}/{len(self.results)} cases pass (logs in {self.work})")
        return 0 if passed == len(self.results) else 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("qa", help="a copy of triton-inference-server/server's qa/ folder")
    ap.add_argument("--backend-dir", required=True, help="holds identity/ and repeat/ (Triton's test backends)")
    ap.add_argument("--repeat-lib", help="libtriton_repeat.so, copied into repeat_int32 models as test.sh does")
    ap.add_argument("--ports", type=int, nargs=3, default=[18851, 18852, 18853], metavar=("HTTP", "GRPC", "METRICS"))
    ap.add_argument("filter", nargs="*", help="only the cases whose name holds one of these")
    return Runner(ap.parse_intermixed_args()).run()


if __name__ == "__main__":
    sys.exit(main())
