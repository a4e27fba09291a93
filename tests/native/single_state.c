/* Test backend "single_state": a running sum written in place into a single state buffer
 * (`use_same_buffer_for_input_output`), as Triton's own implicit_state test backend checks it.
 *
 * For each request: OUTPUT = INPUT + STATE_IN (INT32, one element), written into the buffer
 * TRITONBACKEND_StateBuffer gives for "STATE_OUT", and TRITONBACKEND_StateUpdate is NOT called:
 * with a single buffer, that memory is the next request's STATE_IN. The backend remembers the
 * buffer it was given (one instance, one sequence at a time in the test) and fails a request
 * whose STATE_IN lies elsewhere, with Triton's test's message. */
#include "common.h"

RECORDING_LIFECYCLE

TRITONSERVER_Error* TRITONBACKEND_ModelInitialize(TRITONBACKEND_Model* model) { return NULL; }

static void* last_state_buffer = NULL;

static TRITONSERVER_Error* run(TRITONBACKEND_Request* request, TRITONBACKEND_Response* response) {
  const int64_t shape[1] = {1};
  const void* in_buffer;
  const void* state_buffer;
  uint64_t size;
  TRITONSERVER_MemoryType mt;
  int64_t id;
  TRITONBACKEND_Input* input;
  RETURN_IF_ERROR(TRITONBACKEND_RequestInput(request, "INPUT", &input));
  RETURN_IF_ERROR(TRITONBACKEND_InputBuffer(input, 0, &in_buffer, &size, &mt, &id));
  RETURN_IF_ERROR(TRITONBACKEND_RequestInput(request, "STATE_IN", &input));
  RETURN_IF_ERROR(TRITONBACKEND_InputBuffer(input, 0, &state_buffer, &size, &mt, &id));
  uint32_t flags;
  RETURN_IF_ERROR(TRITONBACKEND_RequestFlags(request, &flags));
  if (!(flags & TRITONSERVER_REQUEST_FLAG_SEQUENCE_START) && state_buffer != last_state_buffer)
    return TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_UNSUPPORTED,
                                 "Input and output state are using different buffers.");
  int32_t total = *(const int32_t*)in_buffer + *(const int32_t*)state_buffer;

  TRITONBACKEND_State* next;
  RETURN_IF_ERROR(TRITONBACKEND_StateNew(&next, request, "STATE_OUT", TRITONSERVER_TYPE_INT32,
                                         shape, 1));
  void* buffer;
  mt = TRITONSERVER_MEMORY_CPU;
  id = 0;
  RETURN_IF_ERROR(TRITONBACKEND_StateBuffer(next, &buffer, sizeof(total), &mt, &id));
  memcpy(buffer, &total, sizeof(total));
  last_state_buffer = buffer;

  TRITONBACKEND_Output* output;
  RETURN_IF_ERROR(TRITONBACKEND_ResponseOutput(response, &output, "OUTPUT", TRITONSERVER_TYPE_INT32,
                                               shape, 1));
  void* out;
  mt = TRITONSERVER_MEMORY_CPU;
  id = 0;
  RETURN_IF_ERROR(TRITONBACKEND_OutputBuffer(output, &out, sizeof(total), &mt, &id));
  memcpy(out, &total, sizeof(total));
  return NULL;
}

TRITONSERVER_Error* TRITONBACKEND_ModelInstanceExecute(TRITONBACKEND_ModelInstance* instance,
                                                       TRITONBACKEND_Request** requests,
                                                       const uint32_t request_count) {
  for (uint32_t r = 0; r < request_count; r++) {
    TRITONBACKEND_Response* response;
    RETURN_IF_ERROR(TRITONBACKEND_ResponseNew(&response, requests[r]));
    TRITONSERVER_Error* err = run(requests[r], response);
    TRITONBACKEND_ResponseSend(response, TRITONSERVER_RESPONSE_COMPLETE_FINAL, err);
    if (err != NULL) TRITONSERVER_ErrorDelete(err);
    TRITONBACKEND_RequestRelease(requests[r], TRITONSERVER_REQUEST_RELEASE_ALL);
  }
  return NULL;
}
