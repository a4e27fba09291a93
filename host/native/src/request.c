/* TRITONBACKEND_* requests, inputs, responses, outputs and response factories.
 *
 * A backend request is built from the host's InferenceRequest once per execute (GIL held):
 * ids, flags and parameters are copied, input tensors are not: each input points into the
 * host's numpy array through the buffer protocol (BYTES tensors are serialized once into
 * Triton's length-prefixed form). Output buffers are allocated here and handed to the host
 * without a copy when the response is sent (host.native.bridge turns them into arrays). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bridge.h"

/* Python-side helpers and interned attribute names (module.c). */
extern PyObject *mh_py_serialize_bytes, *mh_py_contiguous, *mh_py_deliver;
extern PyObject *mh_attr_id, *mh_attr_sequence_id, *mh_attr_sequence_start,
    *mh_attr_sequence_end, *mh_attr_timeout_us, *mh_attr_inputs, *mh_attr_outputs,
    *mh_attr_parameters, *mh_attr_datatype, *mh_attr_shape, *mh_attr_data, *mh_attr_name,
    *mh_attr_cancelled;
PyObject* mh_buffer_new(void* data, size_t size); /* takes ownership of malloc'd data */

__thread mh_batch* mh_current_batch;

/* --- the shared reference to the host request ---------------------------------------------- */

static mh_pyref* pyref_new(PyObject* request) {
  mh_pyref* ref = malloc(sizeof(*ref));
  atomic_init(&ref->refs, 1);
  atomic_init(&ref->factory, false);
  atomic_init(&ref->response_index, 0);
  Py_INCREF(request);
  ref->request = request;
  return ref;
}

static mh_pyref* pyref_ref(mh_pyref* ref) {
  atomic_fetch_add(&ref->refs, 1);
  return ref;
}

static void call_deliver(PyObject* request, PyObject* outputs, PyObject* params,
                         TRITONSERVER_Error* error, uint32_t flags);

/* The backend let go of a request it took a response factory for (its last response, factory
 * and the request itself are gone) without a final response: fail the request, as the host
 * fails a non-decoupled request unanswered when execute returns, rather than leave it open.
 * GIL held. */
static void fail_if_unanswered(PyObject* request) {
  PyObject* done = PyObject_GetAttrString(request, "completed");
  int completed = done == NULL ? 1 : PyObject_IsTrue(done);
  Py_XDECREF(done);
  if (completed == 0) {
    PyObject* name = PyObject_GetAttrString(request, "model_name");
    const char* text = name != NULL ? PyUnicode_AsUTF8(name) : NULL;
    char message[512];
    snprintf(message, sizeof(message), "model '%s' sent no response for the request",
             text != NULL ? text : "");
    Py_XDECREF(name);
    PyErr_Clear();
    TRITONSERVER_Error* error = TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_INTERNAL, message);
    call_deliver(request, NULL, NULL, error, TRITONSERVER_RESPONSE_COMPLETE_FINAL);
    TRITONSERVER_ErrorDelete(error);
  }
  PyErr_Clear();
}

void mh_pyref_unref(mh_pyref* ref) {
  if (atomic_fetch_sub(&ref->refs, 1) != 1) return;
  PyGILState_STATE gil = PyGILState_Ensure();
  if (atomic_load(&ref->factory)) fail_if_unanswered(ref->request);
  Py_DECREF(ref->request);
  PyGILState_Release(gil);
  free(ref);
}

/* --- building a request from the host's InferenceRequest ---------------------------------- */

static char* utf8_dup(PyObject* s) {
  const char* text = PyUnicode_Check(s) ? PyUnicode_AsUTF8(s) : NULL;
  if (text == NULL) {
    PyErr_Clear();
    return mh_strdup("");
  }
  return mh_strdup(text);
}

static int fill_input(TRITONBACKEND_Input* in, PyObject* name, PyObject* tensor) {
  in->name = utf8_dup(name);
  PyObject* dt = PyObject_GetAttr(tensor, mh_attr_datatype);
  if (dt == NULL) return -1;
  const char* dts = PyUnicode_AsUTF8(dt);
  in->datatype = dts ? mh_datatype(dts) : TRITONSERVER_TYPE_INVALID;
  Py_DECREF(dt);
  if (dts == NULL) return -1;
  PyObject* shape = PyObject_GetAttr(tensor, mh_attr_shape);
  if (shape == NULL) return -1;
  PyObject* seq = PySequence_Fast(shape, "tensor shape must be a sequence");
  Py_DECREF(shape);
  if (seq == NULL) return -1;
  Py_ssize_t dims = PySequence_Fast_GET_SIZE(seq);
  in->dims_count = (uint32_t)dims;
  in->shape = malloc(sizeof(int64_t) * (size_t)(dims ? dims : 1));
  for (Py_ssize_t d = 0; d < dims; d++)
    in->shape[d] = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(seq, d));
  Py_DECREF(seq);
  if (PyErr_Occurred()) return -1;

  PyObject* data = PyObject_GetAttr(tensor, mh_attr_data);
  if (data == NULL) return -1;
  PyObject* source = NULL;
  if (in->datatype == TRITONSERVER_TYPE_BYTES) {
    source = PyObject_CallOneArg(mh_py_serialize_bytes, data);
  } else if (PyObject_GetBuffer(data, &in->view, PyBUF_C_CONTIGUOUS) == 0) {
    Py_DECREF(data);
    goto have_view;
  } else {
    PyErr_Clear(); /* not contiguous: one copy */
    source = PyObject_CallOneArg(mh_py_contiguous, data);
  }
  Py_DECREF(data);
  if (source == NULL) return -1;
  int rc = PyObject_GetBuffer(source, &in->view, PyBUF_C_CONTIGUOUS);
  Py_DECREF(source); /* the view holds its own reference */
  if (rc != 0) return -1;
have_view:
  in->data = in->view.buf;
  in->byte_size = (uint64_t)in->view.len;
  in->attributes.byte_size = (size_t)in->view.len;
  in->attributes.memory_type = TRITONSERVER_MEMORY_CPU;
  return 0;
}

/* Triton parameters from a dict of str -> bool/int/float/str (GIL held): a value of another type
 * is skipped (no Triton parameter type for it). A value that fails to convert (an int beyond int64)
 * returns -1 with the Python error set when `strict`, and is skipped otherwise. The one converter for
 * requests handed to backends (strict) and for responses returned to them through the in-process
 * server API (infer.c). */
int mh_params_from_dict(PyObject* params, mh_param** out, uint32_t* count, bool strict) {
  if (params == NULL || !PyDict_Check(params) || PyDict_Size(params) == 0) return 0;
  *out = calloc((size_t)PyDict_Size(params), sizeof(mh_param));
  Py_ssize_t pos = 0;
  PyObject *key, *value;
  while (PyDict_Next(params, &pos, &key, &value)) {
    mh_param* p = &(*out)[*count];
    if (PyBool_Check(value)) {
      p->type = TRITONSERVER_PARAMETER_BOOL;
      p->value.b = value == Py_True;
    } else if (PyLong_Check(value)) {
      p->type = TRITONSERVER_PARAMETER_INT;
      p->value.i = PyLong_AsLongLong(value);
    } else if (PyFloat_Check(value)) {
      p->type = TRITONSERVER_PARAMETER_DOUBLE;
      p->value.d = PyFloat_AsDouble(value);
    } else if (PyUnicode_Check(value)) {
      p->type = TRITONSERVER_PARAMETER_STRING;
      p->value.s = utf8_dup(value);
    } else {
      continue;
    }
    if (PyErr_Occurred()) {
      if (strict) return -1;
      PyErr_Clear();
      if (p->type == TRITONSERVER_PARAMETER_STRING) free(p->value.s);
      memset(p, 0, sizeof(*p));
      continue;
    }
    p->key = utf8_dup(key);
    (*count)++;
  }
  return 0;
}

void mh_params_free(mh_param* params, uint32_t count) {
  for (uint32_t i = 0; i < count; i++) {
    free(params[i].key);
    if (params[i].type == TRITONSERVER_PARAMETER_STRING) free(params[i].value.s);
  }
  free(params);
}

static int fill_outputs(TRITONBACKEND_Request* r, PyObject* outputs) {
  TRITONBACKEND_Model* model = r->instance->model;
  Py_ssize_t n = outputs ? PySequence_Length(outputs) : 0;
  if (n < 0) return -1;
  if (n == 0) { /* the client named none: all of the model's outputs */
    r->output_count = model->output_count;
    r->output_names = calloc(model->output_count ? model->output_count : 1, sizeof(char*));
    for (uint32_t i = 0; i < model->output_count; i++)
      r->output_names[i] = mh_strdup(model->output_names[i]);
    return 0;
  }
  r->output_names = calloc((size_t)n, sizeof(char*));
  for (Py_ssize_t i = 0; i < n; i++) {
    PyObject* item = PySequence_GetItem(outputs, i);
    if (item == NULL) return -1;
    PyObject* name = PyObject_GetAttr(item, mh_attr_name);
    Py_DECREF(item);
    if (name == NULL) return -1;
    r->output_names[r->output_count++] = utf8_dup(name);
    Py_DECREF(name);
  }
  return 0;
}

static void request_free(TRITONBACKEND_Request* r, bool gil_held) {
  PyGILState_STATE gil = PyGILState_LOCKED;
  if (!gil_held) gil = PyGILState_Ensure();
  for (uint32_t i = 0; i < r->input_count; i++)
    if (r->inputs[i].view.obj != NULL) PyBuffer_Release(&r->inputs[i].view);
  if (r->py) mh_pyref_unref(r->py);
  mh_states_free(r->states); /* may release views of the host's state buffers: GIL held */
  if (!gil_held) PyGILState_Release(gil);
  for (uint32_t i = 0; i < r->input_count; i++) {
    free(r->inputs[i].name);
    free(r->inputs[i].shape);
  }
  free(r->inputs);
  for (uint32_t i = 0; i < r->output_count; i++) free(r->output_names[i]);
  free(r->output_names);
  mh_params_free(r->params, r->param_count);
  free(r->id);
  free(r->correlation_id_string);
  free(r);
}

TRITONBACKEND_Request* mh_request_new(TRITONBACKEND_ModelInstance* instance, PyObject* request) {
  TRITONBACKEND_Request* r = calloc(1, sizeof(*r));
  r->instance = instance;
  atomic_init(&r->owners, 2);
  r->py = pyref_new(request);
  PyObject *id = NULL, *seq = NULL, *inputs = NULL, *outputs = NULL, *params = NULL, *o = NULL;

  if ((id = PyObject_GetAttr(request, mh_attr_id)) == NULL) goto fail;
  r->id = utf8_dup(id);
  if ((seq = PyObject_GetAttr(request, mh_attr_sequence_id)) == NULL) goto fail;
  if (PyUnicode_Check(seq)) {
    r->correlation_id_string = utf8_dup(seq);
  } else {
    r->correlation_id = PyLong_AsUnsignedLongLongMask(seq); /* string stays NULL */
  }
  if ((o = PyObject_GetAttr(request, mh_attr_sequence_start)) == NULL) goto fail;
  if (PyObject_IsTrue(o) == 1) r->flags |= TRITONSERVER_REQUEST_FLAG_SEQUENCE_START;
  Py_CLEAR(o);
  if ((o = PyObject_GetAttr(request, mh_attr_sequence_end)) == NULL) goto fail;
  if (PyObject_IsTrue(o) == 1) r->flags |= TRITONSERVER_REQUEST_FLAG_SEQUENCE_END;
  Py_CLEAR(o);
  if ((o = PyObject_GetAttr(request, mh_attr_timeout_us)) == NULL) goto fail;
  r->timeout_us = PyLong_AsUnsignedLongLongMask(o);
  Py_CLEAR(o);

  if ((inputs = PyObject_GetAttr(request, mh_attr_inputs)) == NULL) goto fail;
  if (!PyDict_Check(inputs)) {
    PyErr_SetString(PyExc_TypeError, "request inputs must be a dict");
    goto fail;
  }
  r->inputs = calloc((size_t)PyDict_Size(inputs) + 1, sizeof(TRITONBACKEND_Input));
  Py_ssize_t pos = 0;
  PyObject *name, *tensor;
  while (PyDict_Next(inputs, &pos, &name, &tensor)) {
    r->input_count++; /* counted first so a failure frees what was filled */
    if (fill_input(&r->inputs[r->input_count - 1], name, tensor) != 0) goto fail;
  }
  if ((outputs = PyObject_GetAttr(request, mh_attr_outputs)) == NULL) goto fail;
  if (fill_outputs(r, outputs) != 0) goto fail;
  if ((params = PyObject_GetAttr(request, mh_attr_parameters)) == NULL) goto fail;
  if (mh_params_from_dict(params, &r->params, &r->param_count, true) != 0) goto fail;
  Py_DECREF(id);
  Py_DECREF(seq);
  Py_DECREF(inputs);
  Py_DECREF(outputs);
  Py_DECREF(params);
  return r;
fail:
  Py_XDECREF(id);
  Py_XDECREF(seq);
  Py_XDECREF(inputs);
  Py_XDECREF(outputs);
  Py_XDECREF(params);
  Py_XDECREF(o);
  request_free(r, true);
  return NULL;
}

void mh_request_unref(TRITONBACKEND_Request* request) {
  if (atomic_fetch_sub(&request->owners, 1) == 1) request_free(request, false);
}

/* --- request API ------------------------------------------------------------------------------ */

MH_EXPORT TRITONSERVER_Error* TRITONBACKEND_RequestId(TRITONBACKEND_Request* request,
                                                      const char** id) {
  *id = request->id;
  return NULL;
}

static bool is_cancelled(mh_pyref* py) {
  PyGILState_STATE gil = PyGILState_Ensure();
  PyObject* flag = PyObject_GetAttr(py->request, mh_attr_cancelled);
  bool cancelled = flag != NULL && PyObject_IsTrue(flag) == 1;
  Py_XDECREF(flag);
  PyErr_Clear();
  PyGILState_Release(gil);
  return cancelled;
}

MH_EXPORT TRITONSERVER_Error* TRITONBACKEND_RequestIsCancelled(TRITONBACKEND_Request* request,
                                                               bool* is_cancelled_out) {
  *is_cancelled_out = is_cancelled(request->py);
  return NULL;
}

MH_EXPORT TRITONSERVER_Error* TRITONBACKEND_ResponseFactoryIsCancelled(
    TRITONBACKEND_ResponseFactory* factory, bool* is_cancelled_out) {
  *is_cancelled_out = is_cancelled(factory->py);
  return NULL;
}

MH_EXPORT TRITONSERVER_Error* TRITONBACKEND_InferenceRequestTimeoutMicroseconds(
    TRITONBACKEND_Request* request, uint64_t* timeout) {
  *timeout = request->timeout_us;
  return NULL;
}

MH_EXPORT TRITONSERVER_Error* TRITONBACKEND_RequestParameterCount(TRITONBACKEND_Request* request,
                                                                  uint32_t* count) {
  *count = request->param_count;
  return NULL;
}

MH_EXPORT TRITONSERVER_Error* TRITONBACKEND_RequestParameter(TRITONBACKEND_Request* request,
                                                             const uint32_t index, const char** key,
                                                             TRITONSERVER_ParameterType* type,
                                                             const void** vvalue) {
  if (index >= request->param_count)
    return mh_error(TRITONSERVER_ERROR_INVALID_ARG,
                    "out of bounds index %u: request has %u parameters", index,
                    request->param_count);
  mh_param* p = &request->params[index];
  *key = p->key;
  *type = p->type;
  *vvalue = p->type == TRITONSERVER_PARAMETER_STRING ? (const void*)p->value.s
                                                      : (const void*)&p->value;
  return NULL;
}

MH_EXPORT TRITONSERVER_Error* TRITONBACKEND_RequestInputCount(TRITONBACKEND_Request* request,
                                                              uint32_t* count) {
  *count = request->input_count;
  return NULL;
}

MH_EXPORT TRITONSERVER_Error* TRITONBACKEND_RequestInputName(TRITONBACKEND_Request* request,
                                                             const uint32_t index,
                                                             const char** input_name) {
  if (index >= request->input_count)
    return mh_error(TRITONSERVER_ERROR_INVALID_ARG,
                    "out of bounds index %u: request has %u inputs", index, request->input_count);
  *input_name = request->inputs[index].name;
  return NULL;
}

MH_EXPORT TRITONSERVER_Error* TRITONBACKEND_RequestInput(TRITONBACKEND_Request* request,
                                                         const char* name,
                                                         TRITONBACKEND_Input** input) {
  for (uint32_t i = 0; i < request->input_count; i++) {
    if (strcmp(request->inputs[i].name, name) == 0) {
      *input = &request->inputs[i];
      return NULL;
    }
  }
  return mh_error(TRITONSERVER_ERROR_INVALID_ARG, "unknown request input name %s", name);
}

MH_EXPORT TRITONSERVER_Error* TRITONBACKEND_RequestInputByIndex(TRITONBACKEND_Request* request,
                                                                const uint32_t index,
                                                                TRITONBACKEND_Input** input) {
  if (index >= request->input_count)
    return mh_error(TRITONSERVER_ERROR_INVALID_ARG,
                    "out of bounds index %u: request has %u inputs", index, request->input_count);
  *input = &request->inputs[index];
  return NULL;
}

MH_EXPORT TRITONSERVER_Error* TRITONBACKEND_RequestOutputCount(TRITONBACKEND_Request* request,
                                                               uint32_t* count) {
  *count = request->output_count;
  return NULL;
}

MH_EXPORT TRITONSERVER_Error* TRITONBACKEND_RequestOutputName(TRITONBACKEND_Request* request,
                                                              const uint32_t index,
                                                              const char** output_name) {
  if (index >= request->output_count)
    return mh_error(TRITONSERVER_ERROR_INVALID_ARG,
                    "out of bounds index %u: request has %u requested outputs", index,
                    request->output_count);
  *output_name = request->output_names[index];
  return NULL;
}

/* Every output buffer the host hands out is host memory. */
MH_EXPORT TRITONSERVER_Error* TRITONBACKEND_RequestOutputBufferProperties(
    TRITONBACKEND_Request* request, const char* name, size_t* byte_size,
    TRITONSERVER_MemoryType* memory_type, int64_t* memory_type_id) {
  (void)request;
  (void)name;
  (void)byte_size;
  if (memory_type) *memory_type = TRITONSERVER_MEMORY_CPU;
  if (memory_type_id) *memory_type_id = 0;
  return NULL;
}

MH_EXPORT TRITONSERVER_Error* TRITONBACKEND_RequestRelease(TRITONBACKEND_Request* request,
                                                           uint32_t release_flags) {
  if (release_flags & TRITONSERVER_REQUEST_RELEASE_RESCHEDULE) {
    /* An iterative sequence's request runs again (host.sequence.batcher): the host queues the
     * same request anew, and this handle is done. Any other model refuses, with Triton's error;
     * the backend then releases the request with RELEASE_ALL. */
    if (atomic_load(&request->released))
      return mh_error(TRITONSERVER_ERROR_INVALID_ARG, "request '%s' was already released",
                      request->id);
    PyGILState_STATE gil = PyGILState_Ensure();
    PyObject* why = PyObject_CallMethod(request->py->request, "reschedule", NULL);
    TRITONSERVER_Error* err = NULL;
    if (why == NULL) {
      PyErr_Clear();
      err = mh_error(TRITONSERVER_ERROR_INTERNAL, "failed to reschedule request '%s'", request->id);
    } else if (PyUnicode_Check(why) && PyUnicode_GetLength(why) > 0) {
      err = mh_error(TRITONSERVER_ERROR_INVALID_ARG, "%s", PyUnicode_AsUTF8(why));
    }
    Py_XDECREF(why);
    PyGILState_Release(gil);
    if (err != NULL) return err;
    atomic_store(&request->released, true);
    mh_request_unref(request);
    return NULL;
  }
  if (atomic_exchange(&request->released, true))
    return mh_error(TRITONSERVER_ERROR_INVALID_ARG, "request '%s' was already released", request->id);
  mh_request_unref(request);
  return NULL;
}

/* No tracing in the host: a request has no trace, as in Triton with tracing off. */
MH_EXPORT TRITONSERVER_Error* TRITONBACKEND_RequestTrace(TRITONBACKEND_Request* request,
                                                         TRITONSERVER_InferenceTrace** trace) {
  (void)request;
  *trace = NULL;
  return NULL;
}

/* --- inputs ------------------------------------------------------------------------------------ */

MH_EXPORT TRITONSERVER_Error* TRITONBACKEND_InputProperties(TRITONBACKEND_Input* input,
                                                            const char** name,
                                                            TRITONSERVER_DataType* datatype,
                                                            const int64_t** shape,
                                                            uint32_t* dims_count,
                                                            uint64_t* byte_size,
                                                            uint32_t* buffer_count) {
  if (name) *name = input->name;
  if (datatype) *datatype = input->datatype;
  if (shape) *shape = input->shape;
  if (dims_count) *dims_count = input->dims_count;
  if (byte_size) *byte_size = input->byte_size;
  if (buffer_count) *buffer_count = 1;
  return NULL;
}

MH_EXPORT TRITONSERVER_Error* TRITONBACKEND_InputPropertiesForHostPolicy(
    TRITONBACKEND_Input* input, const char* host_policy_name, const char** name,
    TRITONSERVER_DataType* datatype, const int64_t** shape, uint32_t* dims_count,
    uint64_t* byte_size, uint32_t* buffer_count) {
  (void)host_policy_name;
  return TRITONBACKEND_InputProperties(input, name, datatype, shape, dims_count, byte_size,
                                       buffer_count);
}

MH_EXPORT TRITONSERVER_Error* TRITONBACKEND_InputBuffer(TRITONBACKEND_Input* input,
                                                        const uint32_t index, const void** buffer,
                                                        uint64_t* buffer_byte_size,
                                                        TRITONSERVER_MemoryType* memory_type,
                                                        int64_t* memory_type_id) {
  if (index != 0)
    return mh_error(TRITONSERVER_ERROR_INVALID_ARG,
                    "out of bounds index %u: input '%s' has 1 buffer", index, input->name);
  *buffer = input->data;
  *buffer_byte_size = input->byte_size;
  *memory_type = TRITONSERVER_MEMORY_CPU;
  *memory_type_id = 0;
  return NULL;
}

MH_EXPORT TRITONSERVER_Error* TRITONBACKEND_InputBufferForHostPolicy(
    TRITONBACKEND_Input* input, const char* host_policy_name, const uint32_t index,
    const void** buffer, uint64_t* buffer_byte_size, TRITONSERVER_MemoryType* memory_type,
    int64_t* memory_type_id) {
  (void)host_policy_name;
  return TRITONBACKEND_InputBuffer(input, index, buffer, buffer_byte_size, memory_type,
                                   memory_type_id);
}

MH_EXPORT TRITONSERVER_Error* TRITONBACKEND_InputBufferAttributes(
    TRITONBACKEND_Input* input, const uint32_t index, const void** buffer,
    TRITONSERVER_BufferAttributes** buffer_attributes) {
  if (index != 0)
    return mh_error(TRITONSERVER_ERROR_INVALID_ARG,
                    "out of bounds index %u: input '%s' has 1 buffer", index, input->name);
  *buffer = input->data;
  *buffer_attributes = &input->attributes;
  return NULL;
}

/* --- responses ------------------------------------------------------------------------------------ */

static TRITONBACKEND_Response* response_new(mh_pyref* py, TRITONBACKEND_Model* model) {
  TRITONBACKEND_Response* r = calloc(1, sizeof(*r));
  r->py = pyref_ref(py);
  r->model = model;
  return r;
}

MH_EXPORT TRITONSERVER_Error* TRITONBACKEND_ResponseNew(TRITONBACKEND_Response** response,
                                                        TRITONBACKEND_Request* request) {
  *response = response_new(request->py, request->instance->model);
  return NULL;
}

MH_EXPORT TRITONSERVER_Error* TRITONBACKEND_ResponseFactoryNew(
    TRITONBACKEND_ResponseFactory** factory, TRITONBACKEND_Request* request) {
  TRITONBACKEND_ResponseFactory* f = malloc(sizeof(*f));
  f->py = pyref_ref(request->py);
  f->model = request->instance->model;
  *factory = f;
  /* The backend may now answer after its execute returned, decoupled or not (Triton's repeat
   * backend does): the host waits for it (host.scheduler.execute_batch). */
  if (!atomic_exchange(&f->py->factory, true)) {
    PyGILState_STATE gil = PyGILState_Ensure();
    if (PyObject_SetAttrString(f->py->request, "factory_held", Py_True) != 0) PyErr_Clear();
    PyGILState_Release(gil);
  }
  return NULL;
}

MH_EXPORT TRITONSERVER_Error* TRITONBACKEND_ResponseFactoryDelete(
    TRITONBACKEND_ResponseFactory* factory) {
  mh_pyref_unref(factory->py);
  free(factory);
  return NULL;
}

MH_EXPORT TRITONSERVER_Error* TRITONBACKEND_ResponseFactorySendFlags(
    TRITONBACKEND_ResponseFactory* factory, const uint32_t send_flags) {
  mh_deliver_flags(factory->py, send_flags);
  return NULL;
}

MH_EXPORT TRITONSERVER_Error* TRITONBACKEND_ResponseNewFromFactory(
    TRITONBACKEND_Response** response, TRITONBACKEND_ResponseFactory* factory) {
  *response = response_new(factory->py, factory->model);
  return NULL;
}

void mh_response_free(TRITONBACKEND_Response* response) {
  for (uint32_t i = 0; i < response->output_count; i++) {
    TRITONBACKEND_Output* o = response->outputs[i];
    free(o->name);
    free(o->shape);
    free(o->buffer); /* NULL once handed to the host */
    free(o);
  }
  free(response->outputs);
  for (uint32_t i = 0; i < response->param_count; i++) {
    free(response->params[i].key);
    if (response->params[i].type == TRITONSERVER_PARAMETER_STRING) free(response->params[i].value.s);
  }
  free(response->params);
  mh_pyref_unref(response->py);
  free(response);
}

MH_EXPORT TRITONSERVER_Error* TRITONBACKEND_ResponseDelete(TRITONBACKEND_Response* response) {
  mh_response_free(response);
  return NULL;
}

static mh_param* add_param(TRITONBACKEND_Response* r, const char* name,
                           TRITONSERVER_ParameterType type) {
  if (r->param_count == r->param_capacity) {
    r->param_capacity = r->param_capacity ? 2 * r->param_capacity : 4;
    r->params = realloc(r->params, r->param_capacity * sizeof(mh_param));
  }
  mh_param* p = &r->params[r->param_count++];
  p->key = mh_strdup(name);
  p->type = type;
  return p;
}

MH_EXPORT TRITONSERVER_Error* TRITONBACKEND_ResponseSetStringParameter(
    TRITONBACKEND_Response* response, const char* name, const char* value) {
  add_param(response, name, TRITONSERVER_PARAMETER_STRING)->value.s = mh_strdup(value);
  return NULL;
}

MH_EXPORT TRITONSERVER_Error* TRITONBACKEND_ResponseSetIntParameter(
    TRITONBACKEND_Response* response, const char* name, const int64_t value) {
  add_param(response, name, TRITONSERVER_PARAMETER_INT)->value.i = value;
  return NULL;
}

MH_EXPORT TRITONSERVER_Error* TRITONBACKEND_ResponseSetBoolParameter(
    TRITONBACKEND_Response* response, const char* name, const bool value) {
  add_param(response, name, TRITONSERVER_PARAMETER_BOOL)->value.b = value;
  return NULL;
}

MH_EXPORT TRITONSERVER_Error* TRITONBACKEND_ResponseSetDoubleParameter(
    TRITONBACKEND_Response* response, const char* name, const double value) {
  add_param(response, name, TRITONSERVER_PARAMETER_DOUBLE)->value.d = value;
  return NULL;
}

MH_EXPORT TRITONSERVER_Error* TRITONBACKEND_ResponseOutput(TRITONBACKEND_Response* response,
                                                           TRITONBACKEND_Output** output,
                                                           const char* name,
                                                           const TRITONSERVER_DataType datatype,
                                                           const int64_t* shape,
                                                           const uint32_t dims_count) {
  for (uint32_t i = 0; i < response->output_count; i++)
    if (strcmp(response->outputs[i]->name, name) == 0)
      return mh_error(TRITONSERVER_ERROR_ALREADY_EXISTS, "response already has output '%s'", name);
  TRITONBACKEND_Output* o = calloc(1, sizeof(*o));
  o->name = mh_strdup(name);
  o->datatype = datatype;
  o->dims_count = dims_count;
  o->shape = malloc(sizeof(int64_t) * (dims_count ? dims_count : 1));
  if (dims_count) memcpy(o->shape, shape, sizeof(int64_t) * dims_count);
  if (response->output_count == response->output_capacity) {
    response->output_capacity = response->output_capacity ? 2 * response->output_capacity : 4;
    response->outputs =
        realloc(response->outputs, response->output_capacity * sizeof(TRITONBACKEND_Output*));
  }
  response->outputs[response->output_count++] = o;
  *output = o;
  return NULL;
}

/* The host's allocator for output tensors: host memory, handed to numpy without a copy. */
MH_EXPORT TRITONSERVER_Error* TRITONBACKEND_OutputBuffer(TRITONBACKEND_Output* output,
                                                         void** buffer,
                                                         const uint64_t buffer_byte_size,
                                                         TRITONSERVER_MemoryType* memory_type,
                                                         int64_t* memory_type_id) {
  if (output->buffer != NULL)
    return mh_error(TRITONSERVER_ERROR_ALREADY_EXISTS, "output '%s' already has a buffer",
                    output->name);
  output->buffer = malloc(buffer_byte_size ? buffer_byte_size : 1);
  if (output->buffer == NULL)
    return mh_error(TRITONSERVER_ERROR_UNAVAILABLE, "out of memory allocating %llu bytes",
                    (unsigned long long)buffer_byte_size);
  output->byte_size = buffer_byte_size;
  output->attributes.byte_size = buffer_byte_size;
  output->attributes.memory_type = TRITONSERVER_MEMORY_CPU;
  *buffer = output->buffer;
  *memory_type = TRITONSERVER_MEMORY_CPU;
  *memory_type_id = 0;
  return NULL;
}

MH_EXPORT TRITONSERVER_Error* TRITONBACKEND_OutputBufferAttributes(
    TRITONBACKEND_Output* output, TRITONSERVER_BufferAttributes** buffer_attributes) {
  *buffer_attributes = &output->attributes;
  return NULL;
}

MH_EXPORT TRITONSERVER_Error* TRITONBACKEND_InferenceResponseOutput(
    TRITONBACKEND_Response* response, const uint32_t index, const char** name,
    TRITONSERVER_DataType* datatype, const int64_t** shape, uint64_t* dim_count) {
  if (index >= response->output_count)
    return mh_error(TRITONSERVER_ERROR_INVALID_ARG,
                    "out of bounds index %u: response has %u outputs", index,
                    response->output_count);
  TRITONBACKEND_Output* o = response->outputs[index];
  *name = o->name;
  *datatype = o->datatype;
  *shape = o->shape;
  *dim_count = o->dims_count;
  return NULL;
}

MH_EXPORT TRITONSERVER_Error* TRITONBACKEND_InferenceResponseOutputByName(
    TRITONBACKEND_Response* response, const char* name, TRITONSERVER_DataType* datatype,
    const int64_t** shape, uint64_t* dim_count) {
  for (uint32_t i = 0; i < response->output_count; i++) {
    TRITONBACKEND_Output* o = response->outputs[i];
    if (strcmp(o->name, name) == 0) {
      *datatype = o->datatype;
      *shape = o->shape;
      *dim_count = o->dims_count;
      return NULL;
    }
  }
  return mh_error(TRITONSERVER_ERROR_NOT_FOUND, "response has no output '%s'", name);
}

MH_EXPORT TRITONSERVER_Error* TRITONBACKEND_ResponseSend(TRITONBACKEND_Response* response,
                                                         const uint32_t send_flags,
                                                         TRITONSERVER_Error* error) {
  mh_batch* batch = mh_current_batch;
  if (batch == NULL || response->model->decoupled) {
    /* Decoupled responses go out at once, in the order sent, from whichever thread. */
    mh_deliver(response, send_flags, error);
    return NULL;
  }
  if (batch->pending_count == batch->pending_capacity) {
    uint32_t cap = batch->pending_capacity ? 2 * batch->pending_capacity : 16;
    batch->pending = realloc(batch->pending, cap * sizeof(*batch->pending));
    batch->pending_flags = realloc(batch->pending_flags, cap * sizeof(uint32_t));
    batch->pending_errors = realloc(batch->pending_errors, cap * sizeof(TRITONSERVER_Error*));
    batch->pending_capacity = cap;
  }
  uint32_t i = batch->pending_count++;
  batch->pending[i] = response;
  batch->pending_flags[i] = send_flags;
  /* The caller keeps ownership of `error`: keep a copy until delivery. */
  batch->pending_errors[i] = error ? mh_error(error->code, "%s", error->message) : NULL;
  return NULL;
}

/* --- handing responses to the host ------------------------------------------------------------- */

static PyObject* outputs_list(TRITONBACKEND_Response* response) {
  PyObject* list = PyList_New(response->output_count);
  if (list == NULL) return NULL;
  for (uint32_t i = 0; i < response->output_count; i++) {
    TRITONBACKEND_Output* o = response->outputs[i];
    PyObject* shape = PyTuple_New(o->dims_count);
    for (uint32_t d = 0; d < o->dims_count; d++)
      PyTuple_SET_ITEM(shape, d, PyLong_FromLongLong(o->shape[d]));
    PyObject* buf;
    if (o->buffer != NULL) {
      buf = mh_buffer_new(o->buffer, o->byte_size);
      o->buffer = NULL; /* now owned by the Python buffer object */
    } else {
      Py_INCREF(Py_None);
      buf = Py_None; /* the backend never asked for a buffer */
    }
    PyObject* item = Py_BuildValue("(ssNN)", o->name, TRITONSERVER_DataTypeString(o->datatype),
                                   shape, buf);
    if (item == NULL) {
      Py_DECREF(list);
      return NULL;
    }
    PyList_SET_ITEM(list, i, item);
  }
  return list;
}

static PyObject* params_dict(TRITONBACKEND_Response* response) {
  PyObject* dict = PyDict_New();
  for (uint32_t i = 0; dict && i < response->param_count; i++) {
    mh_param* p = &response->params[i];
    PyObject* v = NULL;
    switch (p->type) {
      case TRITONSERVER_PARAMETER_STRING: v = PyUnicode_FromString(p->value.s); break;
      case TRITONSERVER_PARAMETER_INT: v = PyLong_FromLongLong(p->value.i); break;
      case TRITONSERVER_PARAMETER_BOOL: v = PyBool_FromLong(p->value.b); break;
      case TRITONSERVER_PARAMETER_DOUBLE: v = PyFloat_FromDouble(p->value.d); break;
      default: continue;
    }
    if (v == NULL) {
      PyErr_Clear();
      continue;
    }
    PyDict_SetItemString(dict, p->key, v);
    Py_DECREF(v);
  }
  return dict;
}

static void call_deliver(PyObject* request, PyObject* outputs, PyObject* params,
                         TRITONSERVER_Error* error, uint32_t flags) {
  PyObject* err = Py_None;
  Py_INCREF(err);
  if (error != NULL) {
    Py_DECREF(err);
    err = Py_BuildValue("(is)", (int)error->code, error->message);
  }
  PyObject* final = PyBool_FromLong(flags & TRITONSERVER_RESPONSE_COMPLETE_FINAL);
  PyObject* result = NULL;
  if (err != NULL)
    result = PyObject_CallFunctionObjArgs(mh_py_deliver, request, outputs ? outputs : Py_None,
                                          params ? params : Py_None, err, final, NULL);
  if (result == NULL) PyErr_WriteUnraisable(mh_py_deliver);
  Py_XDECREF(result);
  Py_XDECREF(err);
  Py_DECREF(final);
}

void mh_deliver(TRITONBACKEND_Response* response, uint32_t flags, TRITONSERVER_Error* error) {
  PyGILState_STATE gil = PyGILState_Ensure();
  PyObject* outputs = error ? NULL : outputs_list(response);
  PyObject* params = error ? NULL : params_dict(response);
  if (!error && (outputs == NULL || params == NULL)) PyErr_WriteUnraisable(mh_py_deliver);
  else call_deliver(response->py->request, outputs, params, error, flags);
  Py_XDECREF(outputs);
  Py_XDECREF(params);
  mh_response_free(response);
  PyGILState_Release(gil);
}

void mh_deliver_flags(mh_pyref* py, uint32_t flags) {
  PyGILState_STATE gil = PyGILState_Ensure();
  call_deliver(py->request, NULL, NULL, NULL, flags);
  PyGILState_Release(gil);
}
