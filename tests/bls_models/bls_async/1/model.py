"""BLS driver (`async def execute`; "gather": that many calls at once). SPEC keys, all optional
but "model":

op: "infer" (default), "ready", "load", "unload"; model, version; input_name ("INPUT0"), input_dtype
("float32"); outputs (requested, default ["OUTPUT0"]); out (the output read back, "OUTPUT0");
decoupled (exec(decoupled=True)); request_id, correlation_id, flags, timeout, parameters;
preferred_cpu (preferred_memory: CPU); next: the SPEC sent along to the callee (when it is a BLS
driver itself); batched (the callee batches: send a batch of one); config, files,
unload_dependents;
fail: raise in execute with this message.
"""

import json

import numpy as np
import triton_python_backend_utils as pb_utils


def bls_request(spec, in0):
    x = in0.astype(spec.get("input_dtype", "float32"))
    nested = np.array([json.dumps(spec.get("next", {})).encode()], dtype=np.object_)
    if spec.get("batched"):  # the callee batches: a batch of one
        x, nested = x[None], nested[None]
    inputs = [pb_utils.Tensor(spec.get("input_name", "INPUT0"), x)]
    if "next" in spec:
        inputs.append(pb_utils.Tensor("SPEC", nested))
    kwargs = {k: spec[k] for k in ("request_id", "correlation_id", "flags", "timeout", "parameters")
              if k in spec}
    if spec.get("preferred_cpu"):
        kwargs["preferred_memory"] = pb_utils.PreferredMemory(pb_utils.TRITONSERVER_MEMORY_CPU, 0)
    return pb_utils.InferenceRequest(
        model_name=spec["model"], model_version=spec.get("version", -1), inputs=inputs,
        requested_output_names=spec.get("outputs", ["OUTPUT0"]), **kwargs)


def describe(responses, spec, in0, sent=None):
    result, outs = [], []
    for r in responses:
        entry = {"outputs": sorted(t.name() for t in r.output_tensors()),
                 # parameters(): Triton 24.10's BLS responses have none
                 "params": json.loads(getattr(r, "parameters", lambda: "{}")() or "{}")}
        if r.has_error():
            entry["error"] = r.error().message()
            entry["code"] = int(r.error().code())
        t = pb_utils.get_output_tensor_by_name(r, spec.get("out", "OUTPUT0"))
        if t is not None:
            if sent is not None:  # did the callee's output come back as the very array we sent?
                entry["same_memory"] = t.as_numpy().ctypes.data == sent.as_numpy().ctypes.data
            outs.append(t.as_numpy().astype(np.float32).reshape(-1))
            entry["nested"] = _nested(r)
        result.append(entry)
    return result, (np.concatenate(outs) if outs else in0)


def _nested(response):
    t = pb_utils.get_output_tensor_by_name(response, "RESULT")
    return None if t is None else json.loads(t.as_numpy().reshape(-1)[0])


def control(spec):
    op = spec["op"]
    if op == "ready":
        return {"ready": pb_utils.is_model_ready(spec["model"], str(spec.get("version", "")))}
    if op == "load":
        files = {k: v.encode() for k, v in spec["files"].items()} if "files" in spec else None
        pb_utils.load_model(spec["model"], config=spec.get("config", ""), files=files)
        return {"loaded": True}
    pb_utils.unload_model(spec["model"], unload_dependents=spec.get("unload_dependents", False))
    return {"unloaded": True}


def respond(result, out0):
    return pb_utils.InferenceResponse(output_tensors=[
        pb_utils.Tensor("OUTPUT0", out0.astype(np.float32)),
        pb_utils.Tensor("RESULT", np.array([json.dumps(result).encode()], dtype=np.object_))])


import asyncio  # noqa: E402


class TritonPythonModel:
    async def execute(self, requests):
        responses = []
        for request in requests:
            spec = json.loads(pb_utils.get_input_tensor_by_name(request, "SPEC").as_numpy()[0])
            in0 = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            out0 = in0
            if "fail" in spec:  # the callee's own failure, for the error tests
                raise ValueError(spec["fail"])
            try:
                if spec.get("op", "infer") != "infer":
                    result = control(spec)
                elif spec.get("decoupled"):
                    iterator = await bls_request(spec, in0).async_exec(decoupled=True)
                    result, out0 = describe(list(iterator), spec, in0)
                else:
                    calls = [bls_request(spec, in0).async_exec() for _ in range(spec.get("gather", 1))]
                    result, out0 = describe(await asyncio.gather(*calls), spec, in0)
            except Exception as exc:
                result = {"raised": str(exc)}
            responses.append(respond(result, out0))
        return responses
