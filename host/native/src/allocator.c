/* TRITONSERVER_ResponseAllocator: the functions a backend gives the server to place the
 * outputs of the responses to its requests (infer.c calls them for each output). */
#include <stdlib.h>

#include "infer.h"

MH_EXPORT TRITONSERVER_Error* TRITONSERVER_ResponseAllocatorNew(
    TRITONSERVER_ResponseAllocator** allocator, TRITONSERVER_ResponseAllocatorAllocFn_t alloc_fn,
    TRITONSERVER_ResponseAllocatorReleaseFn_t release_fn,
    TRITONSERVER_ResponseAllocatorStartFn_t start_fn) {
  if (allocator == NULL || alloc_fn == NULL || release_fn == NULL)
    return mh_error(TRITONSERVER_ERROR_INVALID_ARG,
                    "response allocator needs an allocation and a release function");
  TRITONSERVER_ResponseAllocator* a = calloc(1, sizeof(*a));
  a->alloc_fn = alloc_fn;
  a->release_fn = release_fn;
  a->start_fn = start_fn;
  *allocator = a;
  return NULL;
}

MH_EXPORT TRITONSERVER_Error* TRITONSERVER_ResponseAllocatorSetBufferAttributesFunction(
    TRITONSERVER_ResponseAllocator* allocator,
    TRITONSERVER_ResponseAllocatorBufferAttributesFn_t buffer_attributes_fn) {
  allocator->buffer_attributes_fn = buffer_attributes_fn;
  return NULL;
}

MH_EXPORT TRITONSERVER_Error* TRITONSERVER_ResponseAllocatorSetQueryFunction(
    TRITONSERVER_ResponseAllocator* allocator, TRITONSERVER_ResponseAllocatorQueryFn_t query_fn) {
  allocator->query_fn = query_fn;
  return NULL;
}

MH_EXPORT TRITONSERVER_Error* TRITONSERVER_ResponseAllocatorDelete(
    TRITONSERVER_ResponseAllocator* allocator) {
  free(allocator);
  return NULL;
}
