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
  int32_t input;
  RETURN_IF_ERROR(read_int32(request, "INPUT", &input));
  const void* state_buffer;  /* its address matters: it must be the buffer the last run wrote */
  uint64_t size;
  RETURN_IF_ERROR(input_buffer(request, "STATE_IN", &state_buffer, &size));
  uint32_t flags;
  RETURN_IF_ERROR(TRITONBACKEND_RequestFlags(request, &flags));
  if (!(flags & TRITONSERVER_REQUEST_FLAG_SEQUENCE_START) && state_buffer != last_state_buffer)
    return TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_UNSUPPORTED,
                                 "Input and output state are using different buffers.");
  int32_t total = input + *(const int32_t*)state_buffer;

  TRITONBACKEND_State* next;
  RETURN_IF_ERROR(TRITONBACKEND_StateNew(&next, request, "STATE_OUT", TRITONSERVER_TYPE_INT32,
                                         shape, 1));
  void* buffer;
  TRITONSERVER_MemoryType mt = TRITONSERVER_MEMORY_CPU;
  int64_t id = 0;
  RETURN_IF_ERROR(TRITONBACKEND_StateBuffer(next, &buffer, sizeof(total), &mt, &id));
  memcpy(buffer, &total, sizeof(total));
  last_state_buffer = buffer;

  return write_output(response, "OUTPUT", TRITONSERVER_TYPE_INT32, &total, sizeof(total), shape, 1);
}

ANSWER_EACH_REQUEST(run)
