/* Sequences for native backends: a request's correlation id and flags, and implicit state
 * (TRITONBACKEND_State*), after Triton's core.
 *
 * Implicit state lives in the host (host.sequence.state.SequenceStates, one per sequence); the
 * sequence batcher hands it to a request as `request.sequence_states` and has already added the
 * state's current value to the request's inputs, so a backend reads it with
 * TRITONBACKEND_RequestInput(<input_name>). To produce the next value it calls
 * TRITONBACKEND_StateNew(<output_name>), writes into TRITONBACKEND_StateBuffer, and calls
 * TRITONBACKEND_StateUpdate, which copies the bytes into the host's SequenceStates. State objects
 * belong to their request and are freed with it. */
#include <stdlib.h>
#include <string.h>

#include "bridge.h"

struct TRITONBACKEND_State {
  struct TRITONBACKEND_State* next; /* the request's list */
  TRITONBACKEND_Request* request;
  char* name;
  TRITONSERVER_DataType datatype;
  int64_t* shape;
  uint32_t dims_count;
  void* buffer;
  uint64_t byte_size;
  TRITONSERVER_BufferAttributes attributes;
  /* use_same_buffer_for_input_output: a view of the sequence's own state memory, which is also
   * the next request's input state (written in place; nothing to copy at StateUpdate). */
  Py_buffer shared;
  bool single_buffer; /* only such a state asks the host for its memory (StateBuffer) */
};

/* --- correlation id and flags ----------------------------------------------------------------- */

/* Triton's LogRequest(): "[request id: <id>] ", the prefix of its core's request errors. */
static const char* request_label(TRITONBACKEND_Request* request) {
  return request->id != NULL && request->id[0] != '\0' ? request->id : "<id_unknown>";
}

MH_EXPORT TRITONSERVER_Error* TRITONBACKEND_RequestCorrelationId(TRITONBACKEND_Request* request,
                                                                 uint64_t* id) {
  if (request->correlation_id_string != NULL)
    return mh_error(TRITONSERVER_ERROR_INVALID_ARG,
                    "[request id: %s] correlation ID in request is not an unsigned int",
                    request_label(request));
  *id = request->correlation_id;
  return NULL;
}

MH_EXPORT TRITONSERVER_Error* TRITONBACKEND_RequestCorrelationIdString(
    TRITONBACKEND_Request* request, const char** id) {
  if (request->correlation_id_string == NULL)
    return mh_error(TRITONSERVER_ERROR_INVALID_ARG,
                    "[request id: %s] correlation ID in request is not a string",
                    request_label(request));
  *id = request->correlation_id_string;
  return NULL;
}

MH_EXPORT TRITONSERVER_Error* TRITONBACKEND_RequestFlags(TRITONBACKEND_Request* request,
                                                         uint32_t* flags) {
  *flags = request->flags;
  return NULL;
}

/* --- implicit state --------------------------------------------------------------------------- */

/* The request's SequenceStates (new reference), or NULL (no exception) when it has none. */
static PyObject* sequence_states(TRITONBACKEND_Request* request) {
  PyObject* states = PyObject_GetAttrString(request->py->request, "sequence_states");
  if (states == NULL) PyErr_Clear();
  if (states == Py_None) Py_CLEAR(states);
  return states;
}

/* 2: `name` is the output name of a single-buffer state (use_same_buffer_for_input_output);
 * 1: of another state; 0: of none; -1: Python failed. */
static int state_output_kind(PyObject* states, const char* name) {
  PyObject* by_output = PyObject_GetAttrString(states, "by_output");
  if (by_output == NULL) return -1;
  PyObject* spec = PyMapping_GetItemString(by_output, name);
  Py_DECREF(by_output);
  if (spec == NULL) {
    if (!PyErr_ExceptionMatches(PyExc_KeyError)) return -1;
    PyErr_Clear();
    return 0;
  }
  PyObject* single = PyObject_GetAttrString(spec, "single_buffer");
  Py_DECREF(spec);
  int kind = single == NULL ? -1 : PyObject_IsTrue(single) ? 2 : 1;
  Py_XDECREF(single);
  return kind;
}

MH_EXPORT TRITONSERVER_Error* TRITONBACKEND_StateNew(TRITONBACKEND_State** state,
                                                     TRITONBACKEND_Request* request,
                                                     const char* name,
                                                     const TRITONSERVER_DataType datatype,
                                                     const int64_t* shape,
                                                     const uint32_t dims_count) {
  PyGILState_STATE gil = PyGILState_Ensure();
  PyObject* states = sequence_states(request);
  int found = states != NULL ? state_output_kind(states, name) : 0;
  Py_XDECREF(states);
  if (found < 0) PyErr_Clear();
  PyGILState_Release(gil);
  if (states == NULL)
    return mh_error(TRITONSERVER_ERROR_INVALID_ARG,
                    "unable to add state '%s'. State configuration is missing for model '%s'.",
                    name, request->instance->model->name);
  if (found < 1)
    return mh_error(TRITONSERVER_ERROR_INVALID_ARG, "state '%s' is not a valid state name.", name);

  TRITONBACKEND_State* s = calloc(1, sizeof(*s));
  s->request = request;
  s->name = mh_strdup(name);
  s->datatype = datatype;
  s->dims_count = dims_count;
  s->shape = malloc(sizeof(int64_t) * (dims_count ? dims_count : 1));
  if (dims_count) memcpy(s->shape, shape, sizeof(int64_t) * dims_count);
  s->attributes.memory_type = TRITONSERVER_MEMORY_CPU;
  s->single_buffer = found == 2;
  s->next = request->states;
  request->states = s;
  *state = s;
  return NULL;
}

/* 1: `state` is single-buffered and `buffer` points at the sequence's state memory; 0: it is not
 * single-buffered; -1: Python failed (GIL held; the error is cleared). */
static int shared_state_buffer(TRITONBACKEND_State* state, uint64_t byte_size) {
  PyObject* states = sequence_states(state->request);
  if (states == NULL) return 0;
  PyObject* shape = PyTuple_New(state->dims_count);
  for (uint32_t d = 0; shape != NULL && d < state->dims_count; d++)
    PyTuple_SET_ITEM(shape, d, PyLong_FromLongLong(state->shape[d]));
  PyObject* array = shape == NULL ? NULL
      : PyObject_CallMethod(states, "shared_buffer", "ssOK", state->name,
                            TRITONSERVER_DataTypeString(state->datatype), shape,
                            (unsigned long long)byte_size);
  Py_XDECREF(shape);
  Py_DECREF(states);
  if (array == NULL) {
    PyErr_Clear();
    return -1;
  }
  if (array == Py_None) {
    Py_DECREF(array);
    return 0;
  }
  if (state->shared.obj != NULL) PyBuffer_Release(&state->shared);
  int rc = PyObject_GetBuffer(array, &state->shared, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS);
  Py_DECREF(array); /* the view holds its own reference */
  if (rc != 0) {
    PyErr_Clear();
    return -1;
  }
  return 1;
}

MH_EXPORT TRITONSERVER_Error* TRITONBACKEND_StateBuffer(TRITONBACKEND_State* state, void** buffer,
                                                        const uint64_t buffer_byte_size,
                                                        TRITONSERVER_MemoryType* memory_type,
                                                        int64_t* memory_type_id) {
  int shared = 0;
  if (state->single_buffer) {
    PyGILState_STATE gil = PyGILState_Ensure();
    shared = shared_state_buffer(state, buffer_byte_size);
    if (shared == 1) {
      state->byte_size = buffer_byte_size;
      state->attributes.byte_size = (size_t)buffer_byte_size;
      *buffer = state->shared.buf;
    }
    PyGILState_Release(gil);
  }
  if (shared < 0)
    return mh_error(TRITONSERVER_ERROR_INTERNAL, "failed to give a buffer to state '%s'",
                    state->name);
  if (shared == 0) {
    if (state->buffer == NULL || state->byte_size != buffer_byte_size) {
      void* grown = realloc(state->buffer, buffer_byte_size ? buffer_byte_size : 1);
      if (grown == NULL)
        return mh_error(TRITONSERVER_ERROR_INTERNAL, "failed to allocate %llu bytes for state '%s'",
                        (unsigned long long)buffer_byte_size, state->name);
      state->buffer = grown;
      state->byte_size = buffer_byte_size;
    }
    state->attributes.byte_size = (size_t)buffer_byte_size;
    *buffer = state->buffer;
  }
  *memory_type = TRITONSERVER_MEMORY_CPU; /* host memory only: the host has no device memory */
  *memory_type_id = 0;
  return NULL;
}

MH_EXPORT TRITONSERVER_Error* TRITONBACKEND_StateBufferAttributes(
    TRITONBACKEND_State* state, TRITONSERVER_BufferAttributes** buffer_attributes) {
  *buffer_attributes = &state->attributes;
  return NULL;
}

MH_EXPORT TRITONSERVER_Error* TRITONBACKEND_StateUpdate(TRITONBACKEND_State* state) {
  TRITONSERVER_Error* err = NULL;
  if (state->shared.obj != NULL) return NULL; /* written in place: already the next input */
  PyGILState_STATE gil = PyGILState_Ensure();
  PyObject* states = sequence_states(state->request);
  PyObject* shape = PyTuple_New(state->dims_count);
  for (uint32_t d = 0; shape != NULL && d < state->dims_count; d++)
    PyTuple_SET_ITEM(shape, d, PyLong_FromLongLong(state->shape[d]));
  PyObject* result = NULL;
  if (states != NULL && shape != NULL)
    result = PyObject_CallMethod(states, "update_from_native", "ssOy#", state->name,
                                 TRITONSERVER_DataTypeString(state->datatype), shape,
                                 state->buffer ? (const char*)state->buffer : "",
                                 (Py_ssize_t)state->byte_size);
  if (result == NULL) {
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyObject* text = value != NULL ? PyObject_Str(value) : NULL;
    const char* message = text != NULL ? PyUnicode_AsUTF8(text) : NULL;
    err = mh_error(TRITONSERVER_ERROR_INVALID_ARG, "failed to update state '%s': %s", state->name,
                   message != NULL ? message : "the request has no sequence state");
    Py_XDECREF(text);
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(tb);
    PyErr_Clear();
  }
  Py_XDECREF(result);
  Py_XDECREF(shape);
  Py_XDECREF(states);
  PyGILState_Release(gil);
  return err;
}

void mh_states_free(TRITONBACKEND_State* states) {
  while (states != NULL) {
    TRITONBACKEND_State* next = states->next;
    if (states->shared.obj != NULL) PyBuffer_Release(&states->shared);
    free(states->name);
    free(states->shape);
    free(states->buffer);
    free(states);
    states = next;
  }
}
