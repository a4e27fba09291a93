/* The in-process server API (BLS for native backends): requests a backend builds and sends
 * with TRITONSERVER_ServerInferAsync, the responses it gets back, and response allocators.
 * infer.c, allocator.c and control.c; the Python side is host/native/inprocess.py. */
#pragma once

#include "bridge.h"

struct TRITONSERVER_ResponseAllocator {
  TRITONSERVER_ResponseAllocatorAllocFn_t alloc_fn;
  TRITONSERVER_ResponseAllocatorReleaseFn_t release_fn;
  TRITONSERVER_ResponseAllocatorStartFn_t start_fn;
  TRITONSERVER_ResponseAllocatorQueryFn_t query_fn;
  TRITONSERVER_ResponseAllocatorBufferAttributesFn_t buffer_attributes_fn;
};

/* Call a function of host.native.inprocess (GIL held); NULL + Python error on failure. */
PyObject* mh_inprocess_call(const char* function, const char* format, ...);
/* The pending Python error as a TRITONSERVER_Error (clears it). */
TRITONSERVER_Error* mh_error_from_python(void);
