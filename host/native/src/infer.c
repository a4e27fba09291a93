/* The in-process inference API: TRITONSERVER_InferenceRequest (built by a backend),
 * TRITONSERVER_ServerInferAsync (sends it to the host: host.native.inprocess.infer) and
 * TRITONSERVER_InferenceResponse (what the backend's response callback gets).
 *
 * Memory: inputs reach the host as views of the backend's buffers (no copy); the backend keeps
 * them valid until the release callback, which runs after the final response. Outputs are
 * copied once into buffers the backend's response allocator provides.
 *
 * Threads: every backend callback (allocator, response, release) runs with the GIL released. */
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "infer.h"

/* --- calling host.native.inprocess ------------------------------------------------------- */

static PyObject* inprocess_module;

PyObject* mh_inprocess_call(const char* function, const char* format, ...) {
  if (inprocess_module == NULL) {
    inprocess_module = PyImport_ImportModule("host.native.inprocess");
    if (inprocess_module == NULL) return NULL;
  }
  PyObject* fn = PyObject_GetAttrString(inprocess_module, function);
  if (fn == NULL) return NULL;
  va_list ap;
  va_start(ap, format);
  PyObject* args = Py_VaBuildValue(format, ap);
  va_end(ap);
  PyObject* result = NULL;
  if (args != NULL) {
    if (!PyTuple_Check(args)) { /* a single argument */
      PyObject* t = PyTuple_Pack(1, args);
      Py_DECREF(args);
      args = t;
    }
    if (args != NULL) result = PyObject_Call(fn, args, NULL);
  }
  Py_XDECREF(args);
  Py_DECREF(fn);
  return result;
}

TRITONSERVER_Error* mh_error_from_python(void) {
  PyObject *type, *value, *tb;
  PyErr_Fetch(&type, &value, &tb);
  PyErr_NormalizeException(&type, &value, &tb);
  TRITONSERVER_Error* err = NULL;
  PyObject* args = value ? PyObject_GetAttrString(value, "args") : NULL;
  if (args != NULL && PyTuple_Check(args) && PyTuple_GET_SIZE(args) == 2 &&
      PyLong_Check(PyTuple_GET_ITEM(args, 0)) && PyUnicode_Check(PyTuple_GET_ITEM(args, 1))) {
    err = mh_error((TRITONSERVER_Error_Code)PyLong_AsLong(PyTuple_GET_ITEM(args, 0)), "%s",
                   PyUnicode_AsUTF8(PyTuple_GET_ITEM(args, 1)));
  } else {
    PyObject* text = value ? PyObject_Str(value) : NULL;
    err = mh_error(TRITONSERVER_ERROR_INTERNAL, "%s",
                   text && PyUnicode_Check(text) ? PyUnicode_AsUTF8(text) : "unknown error");
    Py_XDECREF(text);
  }
  PyErr_Clear();
  Py_XDECREF(args);
  Py_XDECREF(type);
  Py_XDECREF(value);
  Py_XDECREF(tb);
  return err;
}

/* --- requests ------------------------------------------------------------------------------- */

typedef struct {
  const void* base;
  size_t size;
} mh_chunk;

typedef struct {
  char* name;
  TRITONSERVER_DataType datatype;
  int64_t* shape;
  uint64_t dims;
  mh_chunk* chunks;
  uint32_t chunk_count;
} mh_input;

typedef struct mh_handle mh_handle;

struct TRITONSERVER_InferenceRequest {
  char* model;
  int64_t version;
  char* id;
  uint64_t correlation_id;
  char* correlation_id_string; /* non-NULL: the correlation id is this string */
  uint32_t flags, priority;
  uint64_t timeout_us;
  mh_input* inputs;
  uint32_t input_count;
  char** outputs;
  uint32_t output_count;
  mh_param* params;
  uint32_t param_count;
  TRITONSERVER_InferenceRequestReleaseFn_t release_fn;
  void* release_userp;
  TRITONSERVER_ResponseAllocator* allocator;
  void* allocator_userp;
  TRITONSERVER_InferenceResponseCompleteFn_t response_fn;
  void* response_userp;
  PyObject* host_request; /* while in flight (GIL): to cancel it */
  mh_handle* handle;      /* while in flight */
  bool cancelled;
};

/* What the host's response callback holds: the request, until its final response. */
struct mh_handle {
  TRITONSERVER_InferenceRequest* request;
};

#define CHECK_REQUEST(r) \
  if ((r) == NULL) return mh_error(TRITONSERVER_ERROR_INVALID_ARG, "inference request is NULL")

MH_EXPORT TRITONSERVER_Error* TRITONSERVER_InferenceRequestNew(
    TRITONSERVER_InferenceRequest** inference_request, TRITONSERVER_Server* server,
    const char* model_name, const int64_t model_version) {
  if (inference_request == NULL || model_name == NULL)
    return mh_error(TRITONSERVER_ERROR_INVALID_ARG, "inference request needs a model name");
  TRITONSERVER_InferenceRequest* r = calloc(1, sizeof(*r));
  r->model = mh_strdup(model_name);
  r->version = model_version;
  r->id = mh_strdup("");
  *inference_request = r;
  return NULL;
}

static void free_input(mh_input* in) {
  free(in->name);
  free(in->shape);
  free(in->chunks);
}


MH_EXPORT TRITONSERVER_Error* TRITONSERVER_InferenceRequestDelete(
    TRITONSERVER_InferenceRequest* r) {
  if (r == NULL) return NULL;
  if (r->host_request != NULL || r->handle != NULL) { /* deleted while in flight */
    PyGILState_STATE gil = PyGILState_Ensure();
    Py_CLEAR(r->host_request);
    if (r->handle != NULL) r->handle->request = NULL;
    PyGILState_Release(gil);
  }
  for (uint32_t i = 0; i < r->input_count; i++) free_input(&r->inputs[i]);
  free(r->inputs);
  for (uint32_t i = 0; i < r->output_count; i++) free(r->outputs[i]);
  free(r->outputs);
  mh_params_free(r->params, r->param_count);
  free(r->model);
  free(r->id);
  free(r->correlation_id_string);
  free(r);
  return NULL;
}

MH_EXPORT TRITONSERVER_Error* TRITONSERVER_InferenceRequestId(TRITONSERVER_InferenceRequest* r,
                                                              const char** id) {
  CHECK_REQUEST(r);
  *id = r->id;
  return NULL;
}

MH_EXPORT TRITONSERVER_Error* TRITONSERVER_InferenceRequestSetId(TRITONSERVER_InferenceRequest* r,
                                                                 const char* id) {
  CHECK_REQUEST(r);
  free(r->id);
  r->id = mh_strdup(id);
  return NULL;
}

MH_EXPORT TRITONSERVER_Error* TRITONSERVER_InferenceRequestFlags(TRITONSERVER_InferenceRequest* r,
                                                                 uint32_t* flags) {
  CHECK_REQUEST(r);
  *flags = r->flags;
  return NULL;
}

MH_EXPORT TRITONSERVER_Error* TRITONSERVER_InferenceRequestSetFlags(
    TRITONSERVER_InferenceRequest* r, uint32_t flags) {
  CHECK_REQUEST(r);
  r->flags = flags;
  return NULL;
}

MH_EXPORT TRITONSERVER_Error* TRITONSERVER_InferenceRequestCorrelationId(
    TRITONSERVER_InferenceRequest* r, uint64_t* correlation_id) {
  CHECK_REQUEST(r);
  if (r->correlation_id_string != NULL)
    return mh_error(TRITONSERVER_ERROR_INVALID_ARG,
                    "given request's correlation id is not an unsigned int");
  *correlation_id = r->correlation_id;
  return NULL;
}

MH_EXPORT TRITONSERVER_Error* TRITONSERVER_InferenceRequestCorrelationIdString(
    TRITONSERVER_InferenceRequest* r, const char** correlation_id) {
  CHECK_REQUEST(r);
  if (r->correlation_id_string == NULL)
    return mh_error(TRITONSERVER_ERROR_INVALID_ARG,
                    "given request's correlation id is not a string");
  *correlation_id = r->correlation_id_string;
  return NULL;
}

MH_EXPORT TRITONSERVER_Error* TRITONSERVER_InferenceRequestSetCorrelationId(
    TRITONSERVER_InferenceRequest* r, uint64_t correlation_id) {
  CHECK_REQUEST(r);
  free(r->correlation_id_string);
  r->correlation_id_string = NULL;
  r->correlation_id = correlation_id;
  return NULL;
}

MH_EXPORT TRITONSERVER_Error* TRITONSERVER_InferenceRequestSetCorrelationIdString(
    TRITONSERVER_InferenceRequest* r, const char* correlation_id) {
  CHECK_REQUEST(r);
  free(r->correlation_id_string);
  r->correlation_id_string = mh_strdup(correlation_id);
  r->correlation_id = 0;
  return NULL;
}

MH_EXPORT TRITONSERVER_Error* TRITONSERVER_InferenceRequestPriority(
    TRITONSERVER_InferenceRequest* r, uint32_t* priority) {
  CHECK_REQUEST(r);
  *priority = r->priority;
  return NULL;
}

MH_EXPORT TRITONSERVER_Error* TRITONSERVER_InferenceRequestSetPriority(
    TRITONSERVER_InferenceRequest* r, uint32_t priority) {
  CHECK_REQUEST(r);
  r->priority = priority;
  return NULL;
}

MH_EXPORT TRITONSERVER_Error* TRITONSERVER_InferenceRequestPriorityUInt64(
    TRITONSERVER_InferenceRequest* r, uint64_t* priority) {
  CHECK_REQUEST(r);
  *priority = r->priority;
  return NULL;
}

MH_EXPORT TRITONSERVER_Error* TRITONSERVER_InferenceRequestSetPriorityUInt64(
    TRITONSERVER_InferenceRequest* r, uint64_t priority) {
  CHECK_REQUEST(r);
  r->priority = (uint32_t)priority;
  return NULL;
}

MH_EXPORT TRITONSERVER_Error* TRITONSERVER_InferenceRequestTimeoutMicroseconds(
    TRITONSERVER_InferenceRequest* r, uint64_t* timeout_us) {
  CHECK_REQUEST(r);
  *timeout_us = r->timeout_us;
  return NULL;
}

MH_EXPORT TRITONSERVER_Error* TRITONSERVER_InferenceRequestSetTimeoutMicroseconds(
    TRITONSERVER_InferenceRequest* r, uint64_t timeout_us) {
  CHECK_REQUEST(r);
  r->timeout_us = timeout_us;
  return NULL;
}

MH_EXPORT TRITONSERVER_Error* TRITONSERVER_InferenceRequestIsCancelled(
    TRITONSERVER_InferenceRequest* r, bool* is_cancelled) {
  CHECK_REQUEST(r);
  *is_cancelled = r->cancelled;
  return NULL;
}

MH_EXPORT TRITONSERVER_Error* TRITONSERVER_InferenceRequestCancel(
    TRITONSERVER_InferenceRequest* r) {
  CHECK_REQUEST(r);
  r->cancelled = true;
  TRITONSERVER_Error* err = NULL;
  PyGILState_STATE gil = PyGILState_Ensure();
  if (r->host_request != NULL) {
    PyObject* result = mh_inprocess_call("cancel", "(O)", r->host_request);
    if (result == NULL) err = mh_error_from_python();
    Py_XDECREF(result);
  }
  PyGILState_Release(gil);
  return err;
}

/* --- inputs -------------------------------------------------------------------------------- */

static mh_input* find_input(TRITONSERVER_InferenceRequest* r, const char* name) {
  for (uint32_t i = 0; i < r->input_count; i++)
    if (strcmp(r->inputs[i].name, name) == 0) return &r->inputs[i];
  return NULL;
}

MH_EXPORT TRITONSERVER_Error* TRITONSERVER_InferenceRequestAddInput(
    TRITONSERVER_InferenceRequest* r, const char* name, const TRITONSERVER_DataType datatype,
    const int64_t* shape, uint64_t dim_count) {
  CHECK_REQUEST(r);
  if (find_input(r, name) != NULL)
    return mh_error(TRITONSERVER_ERROR_INVALID_ARG,
                    "input '%s' already exists in request", name);
  r->inputs = realloc(r->inputs, (r->input_count + 1) * sizeof(mh_input));
  mh_input* in = &r->inputs[r->input_count++];
  memset(in, 0, sizeof(*in));
  in->name = mh_strdup(name);
  in->datatype = datatype;
  in->dims = dim_count;
  in->shape = malloc((dim_count ? dim_count : 1) * sizeof(int64_t));
  if (dim_count) memcpy(in->shape, shape, dim_count * sizeof(int64_t));
  return NULL;
}

MH_EXPORT TRITONSERVER_Error* TRITONSERVER_InferenceRequestAddRawInput(
    TRITONSERVER_InferenceRequest* r, const char* name) {
  return mh_error(TRITONSERVER_ERROR_UNSUPPORTED,
                  "raw inputs are not supported by modelhost: add input '%s' with its datatype "
                  "and shape", name);
}

MH_EXPORT TRITONSERVER_Error* TRITONSERVER_InferenceRequestRemoveInput(
    TRITONSERVER_InferenceRequest* r, const char* name) {
  CHECK_REQUEST(r);
  mh_input* in = find_input(r, name);
  if (in == NULL)
    return mh_error(TRITONSERVER_ERROR_INVALID_ARG, "input '%s' does not exist in request", name);
  free_input(in);
  uint32_t index = (uint32_t)(in - r->inputs);
  memmove(in, in + 1, (r->input_count - index - 1) * sizeof(mh_input));
  r->input_count--;
  return NULL;
}

MH_EXPORT TRITONSERVER_Error* TRITONSERVER_InferenceRequestRemoveAllInputs(
    TRITONSERVER_InferenceRequest* r) {
  CHECK_REQUEST(r);
  for (uint32_t i = 0; i < r->input_count; i++) free_input(&r->inputs[i]);
  r->input_count = 0;
  return NULL;
}

static TRITONSERVER_Error* append_data(TRITONSERVER_InferenceRequest* r, const char* name,
                                       const void* base, size_t byte_size,
                                       TRITONSERVER_MemoryType memory_type) {
  CHECK_REQUEST(r);
  mh_input* in = find_input(r, name);
  if (in == NULL)
    return mh_error(TRITONSERVER_ERROR_INVALID_ARG, "input '%s' does not exist in request", name);
  if (memory_type == TRITONSERVER_MEMORY_GPU)
    return mh_error(TRITONSERVER_ERROR_UNSUPPORTED,
                    "input '%s': modelhost's in-process API takes input data in CPU memory", name);
  in->chunks = realloc(in->chunks, (in->chunk_count + 1) * sizeof(mh_chunk));
  in->chunks[in->chunk_count++] = (mh_chunk){base, byte_size};
  return NULL;
}

MH_EXPORT TRITONSERVER_Error* TRITONSERVER_InferenceRequestAppendInputData(
    TRITONSERVER_InferenceRequest* r, const char* name, const void* base, size_t byte_size,
    TRITONSERVER_MemoryType memory_type, int64_t memory_type_id) {
  return append_data(r, name, base, byte_size, memory_type);
}

MH_EXPORT TRITONSERVER_Error* TRITONSERVER_InferenceRequestAppendInputDataWithHostPolicy(
    TRITONSERVER_InferenceRequest* r, const char* name, const void* base, size_t byte_size,
    TRITONSERVER_MemoryType memory_type, int64_t memory_type_id, const char* host_policy_name) {
  return append_data(r, name, base, byte_size, memory_type);
}

MH_EXPORT TRITONSERVER_Error* TRITONSERVER_InferenceRequestAppendInputDataWithBufferAttributes(
    TRITONSERVER_InferenceRequest* r, const char* name, const void* base,
    TRITONSERVER_BufferAttributes* attributes) {
  if (attributes == NULL)
    return mh_error(TRITONSERVER_ERROR_INVALID_ARG, "buffer attributes are NULL");
  return append_data(r, name, base, attributes->byte_size, attributes->memory_type);
}

MH_EXPORT TRITONSERVER_Error* TRITONSERVER_InferenceRequestRemoveAllInputData(
    TRITONSERVER_InferenceRequest* r, const char* name) {
  CHECK_REQUEST(r);
  mh_input* in = find_input(r, name);
  if (in == NULL)
    return mh_error(TRITONSERVER_ERROR_INVALID_ARG, "input '%s' does not exist in request", name);
  in->chunk_count = 0;
  return NULL;
}

/* --- requested outputs and parameters ------------------------------------------------------- */

MH_EXPORT TRITONSERVER_Error* TRITONSERVER_InferenceRequestAddRequestedOutput(
    TRITONSERVER_InferenceRequest* r, const char* name) {
  CHECK_REQUEST(r);
  for (uint32_t i = 0; i < r->output_count; i++)
    if (strcmp(r->outputs[i], name) == 0) return NULL;
  r->outputs = realloc(r->outputs, (r->output_count + 1) * sizeof(char*));
  r->outputs[r->output_count++] = mh_strdup(name);
  return NULL;
}

MH_EXPORT TRITONSERVER_Error* TRITONSERVER_InferenceRequestRemoveRequestedOutput(
    TRITONSERVER_InferenceRequest* r, const char* name) {
  CHECK_REQUEST(r);
  for (uint32_t i = 0; i < r->output_count; i++) {
    if (strcmp(r->outputs[i], name) == 0) {
      free(r->outputs[i]);
      memmove(&r->outputs[i], &r->outputs[i + 1], (r->output_count - i - 1) * sizeof(char*));
      r->output_count--;
      return NULL;
    }
  }
  return mh_error(TRITONSERVER_ERROR_INVALID_ARG,
                  "requested output '%s' does not exist in request", name);
}

MH_EXPORT TRITONSERVER_Error* TRITONSERVER_InferenceRequestRemoveAllRequestedOutputs(
    TRITONSERVER_InferenceRequest* r) {
  CHECK_REQUEST(r);
  for (uint32_t i = 0; i < r->output_count; i++) free(r->outputs[i]);
  r->output_count = 0;
  return NULL;
}

static mh_param* add_param(TRITONSERVER_InferenceRequest* r, const char* key,
                           TRITONSERVER_ParameterType type) {
  for (uint32_t i = 0; i < r->param_count; i++) { /* setting a key again replaces it */
    if (strcmp(r->params[i].key, key) == 0) {
      if (r->params[i].type == TRITONSERVER_PARAMETER_STRING) free(r->params[i].value.s);
      r->params[i].type = type;
      return &r->params[i];
    }
  }
  r->params = realloc(r->params, (r->param_count + 1) * sizeof(mh_param));
  mh_param* p = &r->params[r->param_count++];
  p->key = mh_strdup(key);
  p->type = type;
  return p;
}

MH_EXPORT TRITONSERVER_Error* TRITONSERVER_InferenceRequestSetStringParameter(
    TRITONSERVER_InferenceRequest* r, const char* key, const char* value) {
  CHECK_REQUEST(r);
  add_param(r, key, TRITONSERVER_PARAMETER_STRING)->value.s = mh_strdup(value);
  return NULL;
}

MH_EXPORT TRITONSERVER_Error* TRITONSERVER_InferenceRequestSetIntParameter(
    TRITONSERVER_InferenceRequest* r, const char* key, const int64_t value) {
  CHECK_REQUEST(r);
  add_param(r, key, TRITONSERVER_PARAMETER_INT)->value.i = value;
  return NULL;
}

MH_EXPORT TRITONSERVER_Error* TRITONSERVER_InferenceRequestSetBoolParameter(
    TRITONSERVER_InferenceRequest* r, const char* key, const bool value) {
  CHECK_REQUEST(r);
  add_param(r, key, TRITONSERVER_PARAMETER_BOOL)->value.b = value;
  return NULL;
}

MH_EXPORT TRITONSERVER_Error* TRITONSERVER_InferenceRequestSetDoubleParameter(
    TRITONSERVER_InferenceRequest* r, const char* key, const double value) {
  CHECK_REQUEST(r);
  add_param(r, key, TRITONSERVER_PARAMETER_DOUBLE)->value.d = value;
  return NULL;
}

MH_EXPORT TRITONSERVER_Error* TRITONSERVER_InferenceRequestSetReleaseCallback(
    TRITONSERVER_InferenceRequest* r, TRITONSERVER_InferenceRequestReleaseFn_t release_fn,
    void* release_userp) {
  CHECK_REQUEST(r);
  r->release_fn = release_fn;
  r->release_userp = release_userp;
  return NULL;
}

MH_EXPORT TRITONSERVER_Error* TRITONSERVER_InferenceRequestSetResponseCallback(
    TRITONSERVER_InferenceRequest* r, TRITONSERVER_ResponseAllocator* allocator,
    void* allocator_userp, TRITONSERVER_InferenceResponseCompleteFn_t response_fn,
    void* response_userp) {
  CHECK_REQUEST(r);
  r->allocator = allocator;
  r->allocator_userp = allocator_userp;
  r->response_fn = response_fn;
  r->response_userp = response_userp;
  return NULL;
}

/* --- responses ------------------------------------------------------------------------------ */

typedef struct {
  char* name;
  TRITONSERVER_DataType datatype;
  int64_t* shape;
  uint64_t dims;
  void* base;
  size_t byte_size;
  TRITONSERVER_MemoryType memory_type;
  int64_t memory_type_id;
  void* userp;
  bool allocated;
} mh_output;

struct TRITONSERVER_InferenceResponse {
  TRITONSERVER_Error* error;
  char* model;
  int64_t version;
  char* id;
  mh_output* outputs;
  uint32_t output_count;
  mh_param* params;
  uint32_t param_count;
  TRITONSERVER_ResponseAllocator* allocator;
};

#define CHECK_RESPONSE(r) \
  if ((r) == NULL) return mh_error(TRITONSERVER_ERROR_INVALID_ARG, "inference response is NULL")

MH_EXPORT TRITONSERVER_Error* TRITONSERVER_InferenceResponseDelete(
    TRITONSERVER_InferenceResponse* r) {
  if (r == NULL) return NULL;
  for (uint32_t i = 0; i < r->output_count; i++) {
    mh_output* o = &r->outputs[i];
    if (o->allocated && r->allocator != NULL)
      TRITONSERVER_ErrorDelete(r->allocator->release_fn(r->allocator, o->base, o->userp,
                                                        o->byte_size, o->memory_type,
                                                        o->memory_type_id));
    free(o->name);
    free(o->shape);
  }
  free(r->outputs);
  mh_params_free(r->params, r->param_count);
  TRITONSERVER_ErrorDelete(r->error);
  free(r->model);
  free(r->id);
  free(r);
  return NULL;
}

MH_EXPORT TRITONSERVER_Error* TRITONSERVER_InferenceResponseError(
    TRITONSERVER_InferenceResponse* r) {
  return r == NULL ? NULL : r->error; /* owned by the response */
}

MH_EXPORT TRITONSERVER_Error* TRITONSERVER_InferenceResponseModel(
    TRITONSERVER_InferenceResponse* r, const char** model_name, int64_t* model_version) {
  CHECK_RESPONSE(r);
  *model_name = r->model;
  *model_version = r->version;
  return NULL;
}

MH_EXPORT TRITONSERVER_Error* TRITONSERVER_InferenceResponseId(TRITONSERVER_InferenceResponse* r,
                                                               const char** request_id) {
  CHECK_RESPONSE(r);
  *request_id = r->id;
  return NULL;
}

MH_EXPORT TRITONSERVER_Error* TRITONSERVER_InferenceResponseParameterCount(
    TRITONSERVER_InferenceResponse* r, uint32_t* count) {
  CHECK_RESPONSE(r);
  *count = r->param_count;
  return NULL;
}

MH_EXPORT TRITONSERVER_Error* TRITONSERVER_InferenceResponseParameter(
    TRITONSERVER_InferenceResponse* r, const uint32_t index, const char** name,
    TRITONSERVER_ParameterType* type, const void** vvalue) {
  CHECK_RESPONSE(r);
  if (index >= r->param_count)
    return mh_error(TRITONSERVER_ERROR_INVALID_ARG,
                    "out of bounds index %u: response has %u parameters", index, r->param_count);
  mh_param* p = &r->params[index];
  *name = p->key;
  *type = p->type;
  *vvalue = p->type == TRITONSERVER_PARAMETER_STRING ? (const void*)p->value.s
                                                      : (const void*)&p->value;
  return NULL;
}

MH_EXPORT TRITONSERVER_Error* TRITONSERVER_InferenceResponseOutputCount(
    TRITONSERVER_InferenceResponse* r, uint32_t* count) {
  CHECK_RESPONSE(r);
  *count = r->output_count;
  return NULL;
}

MH_EXPORT TRITONSERVER_Error* TRITONSERVER_InferenceResponseOutput(
    TRITONSERVER_InferenceResponse* r, const uint32_t index, const char** name,
    TRITONSERVER_DataType* datatype, const int64_t** shape, uint64_t* dim_count,
    const void** base, size_t* byte_size, TRITONSERVER_MemoryType* memory_type,
    int64_t* memory_type_id, void** userp) {
  CHECK_RESPONSE(r);
  if (index >= r->output_count)
    return mh_error(TRITONSERVER_ERROR_INVALID_ARG,
                    "out of bounds index %u: response has %u outputs", index, r->output_count);
  mh_output* o = &r->outputs[index];
  *name = o->name;
  *datatype = o->datatype;
  *shape = o->shape;
  *dim_count = o->dims;
  *base = o->base;
  *byte_size = o->byte_size;
  *memory_type = o->memory_type;
  *memory_type_id = o->memory_type_id;
  *userp = o->userp;
  return NULL;
}

MH_EXPORT TRITONSERVER_Error* TRITONSERVER_InferenceResponseOutputClassificationLabel(
    TRITONSERVER_InferenceResponse* r, const uint32_t index, const size_t class_index,
    const char** label) {
  CHECK_RESPONSE(r);
  *label = NULL; /* modelhost keeps no label files for a model's outputs */
  return NULL;
}

/* --- from the host's response to the backend's --------------------------------------------- */

static char* utf8(PyObject* s) {
  const char* text = PyUnicode_Check(s) ? PyUnicode_AsUTF8(s) : NULL;
  if (text == NULL) PyErr_Clear();
  return mh_strdup(text);
}

/* Outputs (GIL held): names, shapes and views of the host's data, before allocation. */
static int response_outputs(TRITONSERVER_InferenceResponse* resp, PyObject* outputs,
                            Py_buffer* views) {
  Py_ssize_t n = PyList_GET_SIZE(outputs);
  resp->outputs = calloc(n ? (size_t)n : 1, sizeof(mh_output));
  for (Py_ssize_t i = 0; i < n; i++) {
    PyObject *name, *datatype, *shape, *data;
    if (!PyArg_ParseTuple(PyList_GET_ITEM(outputs, i), "OOOO", &name, &datatype, &shape, &data))
      return -1;
    mh_output* o = &resp->outputs[i];
    o->name = utf8(name);
    char* dt = utf8(datatype);
    o->datatype = mh_datatype(dt);
    free(dt);
    o->dims = (uint64_t)PyTuple_GET_SIZE(shape);
    o->shape = calloc(o->dims ? o->dims : 1, sizeof(int64_t));
    for (uint64_t d = 0; d < o->dims; d++) o->shape[d] = PyLong_AsLongLong(PyTuple_GET_ITEM(shape, d));
    if (PyObject_GetBuffer(data, &views[i], PyBUF_CONTIG_RO) < 0) return -1;
    resp->output_count++;
  }
  return 0;
}

/* Place each output where the backend's allocator says and copy it there (GIL released). */
static void allocate_outputs(TRITONSERVER_InferenceRequest* r,
                             TRITONSERVER_InferenceResponse* resp, Py_buffer* views) {
  TRITONSERVER_ResponseAllocator* a = r->allocator;
  TRITONSERVER_Error* err = NULL;
  if (a->start_fn != NULL) err = a->start_fn(a, r->allocator_userp);
  for (uint32_t i = 0; err == NULL && i < resp->output_count; i++) {
    mh_output* o = &resp->outputs[i];
    size_t size = (size_t)views[i].len;
    void *buffer = NULL, *userp = NULL;
    TRITONSERVER_MemoryType type = TRITONSERVER_MEMORY_CPU;
    int64_t type_id = 0;
    err = a->alloc_fn(a, o->name, size, TRITONSERVER_MEMORY_CPU, 0, r->allocator_userp, &buffer,
                      &userp, &type, &type_id);
    if (err != NULL) break;
    o->allocated = true;
    o->base = buffer;
    o->userp = userp;
    o->byte_size = size;
    o->memory_type = type;
    o->memory_type_id = type_id;
    if (size == 0) continue;
    if (type == TRITONSERVER_MEMORY_GPU || buffer == NULL) {
      err = mh_error(TRITONSERVER_ERROR_UNSUPPORTED,
                     "output '%s': modelhost writes outputs to CPU memory only", o->name);
      break;
    }
    memcpy(buffer, views[i].buf, size);
  }
  if (err != NULL) resp->error = err; /* the response becomes an error response */
}

/* respond(outputs, parameters, error, final): the host's response callback (GIL held). */
static PyObject* py_respond(PyObject* self, PyObject* args) {
  mh_handle* h = PyCapsule_GetPointer(self, "modelhost.InferenceRequest");
  PyObject *outputs, *params, *error;
  int final;
  if (h == NULL || !PyArg_ParseTuple(args, "OOOp", &outputs, &params, &error, &final)) return NULL;
  TRITONSERVER_InferenceRequest* r = h->request;
  if (r == NULL) Py_RETURN_NONE; /* after the final response, or deleted by the backend */
  TRITONSERVER_InferenceResponse* resp = NULL;
  Py_buffer* views = NULL;
  if (outputs != Py_None || error != Py_None) {
    resp = calloc(1, sizeof(*resp));
    resp->model = mh_strdup(r->model);
    resp->version = r->version;
    resp->id = mh_strdup(r->id);
    resp->allocator = r->allocator;
    if (error != Py_None) {
      int code;
      const char* message;
      if (!PyArg_ParseTuple(error, "is", &code, &message)) {
        PyErr_Clear();
        code = TRITONSERVER_ERROR_INTERNAL;
        message = "malformed error";
      }
      resp->error = mh_error((TRITONSERVER_Error_Code)code, "%s", message);
    } else {
      mh_params_from_dict(params, &resp->params, &resp->param_count, false);
      if (PyList_Check(outputs)) {
        views = calloc(PyList_GET_SIZE(outputs) + 1, sizeof(Py_buffer));
        if (response_outputs(resp, outputs, views) < 0) {
          resp->error = mh_error_from_python();
        }
      }
    }
  }
  uint32_t flags = final ? TRITONSERVER_RESPONSE_COMPLETE_FINAL : 0;
  if (final) { /* the request goes back to the backend: forget it first */
    h->request = NULL;
    r->handle = NULL;
    Py_CLEAR(r->host_request);
  }
  Py_BEGIN_ALLOW_THREADS;
  if (resp != NULL && views != NULL && resp->error == NULL && r->allocator != NULL)
    allocate_outputs(r, resp, views);
  if (r->response_fn != NULL)
    r->response_fn(resp, flags, r->response_userp);
  else
    TRITONSERVER_InferenceResponseDelete(resp);
  if (final && r->release_fn != NULL)
    r->release_fn(r, TRITONSERVER_REQUEST_RELEASE_ALL, r->release_userp);
  Py_END_ALLOW_THREADS;
  if (views != NULL) {
    for (Py_ssize_t i = 0; views[i].obj != NULL; i++) PyBuffer_Release(&views[i]);
    free(views);
  }
  Py_RETURN_NONE;
}

static PyMethodDef respond_def = {"respond", py_respond, METH_VARARGS,
                                  "respond(outputs, parameters, error, final)"};

static void handle_free(PyObject* capsule) {
  free(PyCapsule_GetPointer(capsule, "modelhost.InferenceRequest"));
}

/* --- sending -------------------------------------------------------------------------------- */

static PyObject* request_inputs(TRITONSERVER_InferenceRequest* r) {
  PyObject* list = PyList_New(0);
  for (uint32_t i = 0; list != NULL && i < r->input_count; i++) {
    mh_input* in = &r->inputs[i];
    PyObject* data;
    if (in->chunk_count == 1) { /* the usual case: a view of the backend's buffer */
      data = PyMemoryView_FromMemory((char*)in->chunks[0].base, (Py_ssize_t)in->chunks[0].size,
                                     PyBUF_READ);
    } else { /* several buffers: joined into one */
      size_t total = 0;
      for (uint32_t c = 0; c < in->chunk_count; c++) total += in->chunks[c].size;
      data = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)total);
      if (data != NULL) {
        char* p = PyBytes_AS_STRING(data);
        for (uint32_t c = 0; c < in->chunk_count; c++) {
          memcpy(p, in->chunks[c].base, in->chunks[c].size);
          p += in->chunks[c].size;
        }
      }
    }
    PyObject* shape = PyTuple_New((Py_ssize_t)in->dims);
    for (uint64_t d = 0; shape != NULL && d < in->dims; d++)
      PyTuple_SET_ITEM(shape, d, PyLong_FromLongLong(in->shape[d]));
    PyObject* item = (data && shape) ? Py_BuildValue("(ssNN)", in->name,
                                                      TRITONSERVER_DataTypeString(in->datatype),
                                                      shape, data)
                                     : NULL;
    if (item == NULL) {
      if (!(data && shape)) {
        Py_XDECREF(data);
        Py_XDECREF(shape);
      }
      Py_CLEAR(list);
      break;
    }
    PyList_Append(list, item);
    Py_DECREF(item);
  }
  return list;
}

static PyObject* request_params(TRITONSERVER_InferenceRequest* r) {
  PyObject* dict = PyDict_New();
  for (uint32_t i = 0; dict != NULL && i < r->param_count; i++) {
    mh_param* p = &r->params[i];
    PyObject* value = NULL;
    switch (p->type) {
      case TRITONSERVER_PARAMETER_STRING: value = PyUnicode_FromString(p->value.s); break;
      case TRITONSERVER_PARAMETER_INT: value = PyLong_FromLongLong(p->value.i); break;
      case TRITONSERVER_PARAMETER_BOOL: value = PyBool_FromLong(p->value.b); break;
      case TRITONSERVER_PARAMETER_DOUBLE: value = PyFloat_FromDouble(p->value.d); break;
      default: continue;
    }
    if (value == NULL || PyDict_SetItemString(dict, p->key, value) < 0) Py_CLEAR(dict);
    Py_XDECREF(value);
  }
  return dict;
}

MH_EXPORT TRITONSERVER_Error* TRITONSERVER_ServerInferAsync(TRITONSERVER_Server* server,
                                                            TRITONSERVER_InferenceRequest* r,
                                                            TRITONSERVER_InferenceTrace* trace) {
  CHECK_REQUEST(r);
  if (r->response_fn == NULL)
    return mh_error(TRITONSERVER_ERROR_INVALID_ARG,
                    "inference request has no response callback (set it with "
                    "TRITONSERVER_InferenceRequestSetResponseCallback)");
  if (r->allocator == NULL)
    return mh_error(TRITONSERVER_ERROR_INVALID_ARG, "inference request has no response allocator");
  TRITONSERVER_Error* err = NULL;
  PyGILState_STATE gil = PyGILState_Ensure();
  mh_handle* h = malloc(sizeof(*h));
  h->request = r;
  PyObject* capsule = PyCapsule_New(h, "modelhost.InferenceRequest", handle_free);
  PyObject* respond = capsule ? PyCFunction_New(&respond_def, capsule) : NULL;
  Py_XDECREF(capsule); /* now held by `respond` */
  PyObject* inputs = request_inputs(r);
  PyObject* outputs = PyList_New(0);
  for (uint32_t i = 0; outputs != NULL && i < r->output_count; i++) {
    PyObject* name = PyUnicode_FromString(r->outputs[i]);
    if (name == NULL || PyList_Append(outputs, name) < 0) Py_CLEAR(outputs);
    Py_XDECREF(name);
  }
  PyObject* params = request_params(r);
  PyObject* correlation = r->correlation_id_string
                              ? PyUnicode_FromString(r->correlation_id_string)
                              : PyLong_FromUnsignedLongLong(r->correlation_id);
  PyObject* result = NULL;
  if (respond && inputs && outputs && params && correlation) {
    r->handle = h;
    result = mh_inprocess_call("infer", "(sLsOIKIOOOO)", r->model, (long long)r->version, r->id,
                               correlation, r->flags, (unsigned long long)r->timeout_us,
                               r->priority, inputs, outputs, params, respond);
  }
  if (result == NULL) {
    err = PyErr_Occurred() ? mh_error_from_python()
                           : mh_error(TRITONSERVER_ERROR_INTERNAL, "could not build the request");
    if (h != NULL && capsule != NULL) h->request = NULL; /* the caller keeps (and deletes) it */
    r->handle = NULL;
  } else if (h->request != NULL) {
    r->host_request = result; /* in flight: kept to cancel it */
    if (r->cancelled) Py_XDECREF(mh_inprocess_call("cancel", "(O)", result));
    PyErr_Clear();
  } else {
    Py_DECREF(result); /* already answered (and maybe deleted): r must not be touched */
  }
  Py_XDECREF(respond);
  Py_XDECREF(inputs);
  Py_XDECREF(outputs);
  Py_XDECREF(params);
  Py_XDECREF(correlation);
  PyGILState_Release(gil);
  return err;
}
