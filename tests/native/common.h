/* Shared by the test backends: error checks and an event log the tests read.
 *
 * Each lifecycle call appends one line to the file named by MODELHOST_TEST_EVENTS (when set),
 * so a test can count initialize / finalize calls across loads, unloads and library reloads. */
#pragma once
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "triton/core/tritonbackend.h"

#define RETURN_IF_ERROR(X)            \
  do {                                \
    TRITONSERVER_Error* err__ = (X);  \
    if (err__ != NULL) return err__;  \
  } while (0)

static void record_event(const char* what, const char* name) {
  const char* path = getenv("MODELHOST_TEST_EVENTS");
  if (path == NULL || path[0] == '\0') return;
  FILE* f = fopen(path, "a");
  if (f == NULL) return;
  fprintf(f, "%s %s\n", what, name);
  fclose(f);
}

/* A backend that runs threads of its own defines this to wait for them. */
#ifndef BEFORE_INSTANCE_FINALIZE
#define BEFORE_INSTANCE_FINALIZE()
#endif

/* Lifecycle entry points that only record themselves. */
#define RECORDING_LIFECYCLE                                                              \
  TRITONSERVER_Error* TRITONBACKEND_Initialize(TRITONBACKEND_Backend* backend) {         \
    const char* name;                                                                    \
    RETURN_IF_ERROR(TRITONBACKEND_BackendName(backend, &name));                          \
    uint32_t major, minor;                                                               \
    RETURN_IF_ERROR(TRITONBACKEND_ApiVersion(&major, &minor));                           \
    if (major != TRITONBACKEND_API_VERSION_MAJOR || minor < TRITONBACKEND_API_VERSION_MINOR) \
      return TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_UNSUPPORTED, "API version mismatch"); \
    record_event("initialize", name);                                                    \
    return NULL;                                                                         \
  }                                                                                      \
  TRITONSERVER_Error* TRITONBACKEND_Finalize(TRITONBACKEND_Backend* backend) {           \
    const char* name;                                                                    \
    RETURN_IF_ERROR(TRITONBACKEND_BackendName(backend, &name));                          \
    record_event("finalize", name);                                                      \
    return NULL;                                                                         \
  }                                                                                      \
  TRITONSERVER_Error* TRITONBACKEND_ModelFinalize(TRITONBACKEND_Model* model) {          \
    const char* name;                                                                    \
    RETURN_IF_ERROR(TRITONBACKEND_ModelName(model, &name));                              \
    record_event("model_finalize", name);                                                \
    return NULL;                                                                         \
  }                                                                                      \
  TRITONSERVER_Error* TRITONBACKEND_ModelInstanceInitialize(TRITONBACKEND_ModelInstance* i) { \
    const char* name;                                                                    \
    RETURN_IF_ERROR(TRITONBACKEND_ModelInstanceName(i, &name));                          \
    record_event("instance_initialize", name);                                           \
    return NULL;                                                                         \
  }                                                                                      \
  TRITONSERVER_Error* TRITONBACKEND_ModelInstanceFinalize(TRITONBACKEND_ModelInstance* i) { \
    const char* name;                                                                    \
    RETURN_IF_ERROR(TRITONBACKEND_ModelInstanceName(i, &name));                          \
    BEFORE_INSTANCE_FINALIZE();                                                          \
    record_event("instance_finalize", name);                                             \
    return NULL;                                                                         \
  }

/* The (first) buffer of input `name` and its size. */
static inline TRITONSERVER_Error* input_buffer(TRITONBACKEND_Request* request, const char* name,
                                               const void** buffer, uint64_t* size) {
  TRITONBACKEND_Input* input;
  RETURN_IF_ERROR(TRITONBACKEND_RequestInput(request, name, &input));
  TRITONSERVER_MemoryType mt;
  int64_t id;
  return TRITONBACKEND_InputBuffer(input, 0, buffer, size, &mt, &id);
}

/* One INT32 value of input `name` (its first element). */
static inline TRITONSERVER_Error* read_int32(TRITONBACKEND_Request* request, const char* name,
                                             int32_t* value) {
  const void* buffer;
  uint64_t size;
  RETURN_IF_ERROR(input_buffer(request, name, &buffer, &size));
  if (size < sizeof(int32_t))
    return TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_INVALID_ARG, "input too small");
  memcpy(value, buffer, sizeof(int32_t));
  return NULL;
}

/* Output `name` of `response`, holding `size` bytes copied from `value`. */
static inline TRITONSERVER_Error* write_output(TRITONBACKEND_Response* response, const char* name,
                                               TRITONSERVER_DataType datatype, const void* value,
                                               size_t size, const int64_t* shape, uint32_t dims) {
  TRITONBACKEND_Output* output;
  RETURN_IF_ERROR(TRITONBACKEND_ResponseOutput(response, &output, name, datatype, shape, dims));
  void* buffer;
  TRITONSERVER_MemoryType mt = TRITONSERVER_MEMORY_CPU;
  int64_t id = 0;
  RETURN_IF_ERROR(TRITONBACKEND_OutputBuffer(output, &buffer, size, &mt, &id));
  memcpy(buffer, value, size);
  return NULL;
}

/* An execute that answers each request with one final response filled by RUN(request, response)
 * (its error, if any, becomes the response's error), then releases the request. */
#define ANSWER_EACH_REQUEST(RUN)                                                              \
  TRITONSERVER_Error* TRITONBACKEND_ModelInstanceExecute(TRITONBACKEND_ModelInstance* instance,  \
                                                         TRITONBACKEND_Request** requests,      \
                                                         const uint32_t request_count) {        \
    for (uint32_t r = 0; r < request_count; r++) {                                           \
      TRITONBACKEND_Response* response;                                                      \
      RETURN_IF_ERROR(TRITONBACKEND_ResponseNew(&response, requests[r]));                    \
      TRITONSERVER_Error* err = RUN(requests[r], response);                                  \
      TRITONBACKEND_ResponseSend(response, TRITONSERVER_RESPONSE_COMPLETE_FINAL, err);       \
      if (err != NULL) TRITONSERVER_ErrorDelete(err);                                        \
      TRITONBACKEND_RequestRelease(requests[r], TRITONSERVER_REQUEST_RELEASE_ALL);           \
    }                                                                                        \
    return NULL;                                                                             \
  }
