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
