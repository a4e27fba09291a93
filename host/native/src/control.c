/* The server calls a backend may make besides inference: health, model readiness and
 * properties, model control (explicit mode) and the JSON documents of the server and its
 * models. Each asks the host in this process (host.native.inprocess) with the GIL held. */
#include <stdlib.h>
#include <string.h>

#include "infer.h"

/* Call host.native.inprocess.<function>; *out gets the result (new reference) or NULL. */
#define ASK(out, function, ...)                                         \
  TRITONSERVER_Error* err_ = NULL;                                      \
  PyGILState_STATE gil_ = PyGILState_Ensure();                          \
  PyObject* out = mh_inprocess_call(function, __VA_ARGS__);             \
  if (out == NULL) err_ = mh_error_from_python();

#define DONE(out)          \
  Py_XDECREF(out);         \
  PyGILState_Release(gil_); \
  return err_

MH_EXPORT TRITONSERVER_Error* TRITONSERVER_ServerIsLive(TRITONSERVER_Server* server, bool* live) {
  ASK(result, "live", "()");
  if (result != NULL) *live = PyObject_IsTrue(PyTuple_GET_ITEM(result, 0));
  DONE(result);
}

MH_EXPORT TRITONSERVER_Error* TRITONSERVER_ServerIsReady(TRITONSERVER_Server* server, bool* ready) {
  ASK(result, "live", "()");
  if (result != NULL) *ready = PyObject_IsTrue(PyTuple_GET_ITEM(result, 1));
  DONE(result);
}

MH_EXPORT TRITONSERVER_Error* TRITONSERVER_ServerModelIsReady(TRITONSERVER_Server* server,
                                                              const char* model_name,
                                                              const int64_t model_version,
                                                              bool* ready) {
  ASK(result, "model_ready", "(sL)", model_name, (long long)model_version);
  if (result != NULL) *ready = PyObject_IsTrue(result);
  DONE(result);
}

MH_EXPORT TRITONSERVER_Error* TRITONSERVER_ServerModelTransactionProperties(
    TRITONSERVER_Server* server, const char* model_name, const int64_t model_version,
    uint32_t* txn_flags, void** voidp) {
  ASK(result, "model_properties", "(sL)", model_name, (long long)model_version);
  if (result != NULL) {
    *txn_flags = PyObject_IsTrue(PyTuple_GET_ITEM(result, 0)) ? TRITONSERVER_TXN_DECOUPLED
                                                                : TRITONSERVER_TXN_ONE_TO_ONE;
    if (voidp != NULL) *voidp = NULL;
  }
  DONE(result);
}

MH_EXPORT TRITONSERVER_Error* TRITONSERVER_ServerModelBatchProperties(
    TRITONSERVER_Server* server, const char* model_name, const int64_t model_version,
    uint32_t* flags, void** voidp) {
  ASK(result, "model_properties", "(sL)", model_name, (long long)model_version);
  if (result != NULL) {
    *flags = PyObject_IsTrue(PyTuple_GET_ITEM(result, 1)) ? TRITONSERVER_BATCH_FIRST_DIM
                                                            : TRITONSERVER_BATCH_UNKNOWN;
    if (voidp != NULL) *voidp = NULL;
  }
  DONE(result);
}

/* --- model control ------------------------------------------------------------------------ */

static TRITONSERVER_Error* load(const char* model_name, const TRITONSERVER_Parameter** parameters,
                                uint64_t count) {
  TRITONSERVER_Error* err = NULL;
  PyGILState_STATE gil = PyGILState_Ensure();
  PyObject* params = PyDict_New();
  for (uint64_t i = 0; params != NULL && i < count; i++) {
    const TRITONSERVER_Parameter* p = parameters[i];
    PyObject* value = NULL;
    if (p->type == TRITONSERVER_PARAMETER_STRING)
      value = PyUnicode_FromString(p->value.s);
    else if (p->type == TRITONSERVER_PARAMETER_BYTES)
      value = PyBytes_FromStringAndSize(p->bytes, (Py_ssize_t)p->byte_size);
    else
      continue;
    if (value == NULL || PyDict_SetItemString(params, p->name, value) < 0) Py_CLEAR(params);
    Py_XDECREF(value);
  }
  PyObject* result = params ? mh_inprocess_call("load_model", "(sO)", model_name, params) : NULL;
  if (result == NULL) err = mh_error_from_python();
  Py_XDECREF(result);
  Py_XDECREF(params);
  PyGILState_Release(gil);
  return err;
}

MH_EXPORT TRITONSERVER_Error* TRITONSERVER_ServerLoadModel(TRITONSERVER_Server* server,
                                                           const char* model_name) {
  return load(model_name, NULL, 0);
}

MH_EXPORT TRITONSERVER_Error* TRITONSERVER_ServerLoadModelWithParameters(
    TRITONSERVER_Server* server, const char* model_name,
    const TRITONSERVER_Parameter** parameters, const uint64_t parameter_count) {
  return load(model_name, parameters, parameter_count);
}

MH_EXPORT TRITONSERVER_Error* TRITONSERVER_ServerUnloadModel(TRITONSERVER_Server* server,
                                                             const char* model_name) {
  ASK(result, "unload_model", "(sO)", model_name, Py_False);
  DONE(result);
}

MH_EXPORT TRITONSERVER_Error* TRITONSERVER_ServerUnloadModelAndDependents(
    TRITONSERVER_Server* server, const char* model_name) {
  ASK(result, "unload_model", "(sO)", model_name, Py_True);
  DONE(result);
}

/* --- documents ------------------------------------------------------------------------------ */

static TRITONSERVER_Error* document(const char* what, const char* model_name, int64_t version,
                                    TRITONSERVER_Message** message) {
  ASK(result, "document", "(ssL)", what, model_name ? model_name : "", (long long)version);
  if (result != NULL) {
    Py_ssize_t size;
    const char* json = PyUnicode_AsUTF8AndSize(result, &size);
    if (json == NULL)
      err_ = mh_error_from_python();
    else
      *message = mh_message(json, (size_t)size);
  }
  DONE(result);
}

MH_EXPORT TRITONSERVER_Error* TRITONSERVER_ServerMetadata(TRITONSERVER_Server* server,
                                                          TRITONSERVER_Message** server_metadata) {
  return document("server", NULL, -1, server_metadata);
}

MH_EXPORT TRITONSERVER_Error* TRITONSERVER_ServerModelMetadata(
    TRITONSERVER_Server* server, const char* model_name, const int64_t model_version,
    TRITONSERVER_Message** model_metadata) {
  return document("metadata", model_name, model_version, model_metadata);
}

MH_EXPORT TRITONSERVER_Error* TRITONSERVER_ServerModelConfig(
    TRITONSERVER_Server* server, const char* model_name, const int64_t model_version,
    const uint32_t config_version, TRITONSERVER_Message** model_config) {
  if (config_version != 1)
    return mh_error(TRITONSERVER_ERROR_UNSUPPORTED,
                    "model configuration version %u not supported, supported versions are: 1",
                    config_version);
  return document("config", model_name, model_version, model_config);
}

MH_EXPORT TRITONSERVER_Error* TRITONSERVER_ServerModelStatistics(
    TRITONSERVER_Server* server, const char* model_name, const int64_t model_version,
    TRITONSERVER_Message** model_stats) {
  return document("statistics", model_name, model_version, model_stats);
}

MH_EXPORT TRITONSERVER_Error* TRITONSERVER_ServerModelIndex(TRITONSERVER_Server* server,
                                                            uint32_t flags,
                                                            TRITONSERVER_Message** model_index) {
  return document("index", NULL, (int64_t)(flags & TRITONSERVER_INDEX_FLAG_READY), model_index);
}
