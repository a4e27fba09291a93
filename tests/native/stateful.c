/* Test backend "stateful": a running sum kept in the host's implicit state.
 *
 * For each request: OUTPUT = INPUT + STATE_IN (INT32, one element), and the same value becomes
 * the next state through TRITONBACKEND_StateNew("STATE_OUT") / StateBuffer / StateUpdate.
 * It also reports what the sequence API tells it: FLAGS = TRITONBACKEND_RequestFlags, and
 * CORRID = TRITONBACKEND_RequestCorrelationId, or, for a string id, its length plus 1000000
 * (TRITONBACKEND_RequestCorrelationIdString). A request whose INPUT is -1 asks for a state name
 * that does not exist, so the test sees TRITONBACKEND_StateNew's error. */
#include "common.h"

RECORDING_LIFECYCLE

TRITONSERVER_Error* TRITONBACKEND_ModelInitialize(TRITONBACKEND_Model* model) { return NULL; }

static TRITONSERVER_Error* run(TRITONBACKEND_Request* request, TRITONBACKEND_Response* response) {
  int32_t input, state;
  RETURN_IF_ERROR(read_int32(request, "INPUT", &input));
  RETURN_IF_ERROR(read_int32(request, "STATE_IN", &state));
  int32_t total = input + state;
  const int64_t shape[1] = {1};

  TRITONBACKEND_State* next;
  RETURN_IF_ERROR(TRITONBACKEND_StateNew(&next, request, input == -1 ? "NO_SUCH_STATE" : "STATE_OUT",
                                         TRITONSERVER_TYPE_INT32, shape, 1));
  void* buffer;
  TRITONSERVER_MemoryType mt = TRITONSERVER_MEMORY_CPU;
  int64_t id = 0;
  RETURN_IF_ERROR(TRITONBACKEND_StateBuffer(next, &buffer, sizeof(total), &mt, &id));
  memcpy(buffer, &total, sizeof(total));
  RETURN_IF_ERROR(TRITONBACKEND_StateUpdate(next));

  uint32_t flags;
  RETURN_IF_ERROR(TRITONBACKEND_RequestFlags(request, &flags));
  int32_t flags32 = (int32_t)flags;
  uint64_t corrid;
  TRITONSERVER_Error* err = TRITONBACKEND_RequestCorrelationId(request, &corrid);
  if (err != NULL) { /* a string id */
    TRITONSERVER_ErrorDelete(err);
    const char* text;
    RETURN_IF_ERROR(TRITONBACKEND_RequestCorrelationIdString(request, &text));
    corrid = 1000000 + strlen(text);
  }
  RETURN_IF_ERROR(write_output(response, "OUTPUT", TRITONSERVER_TYPE_INT32, &total, sizeof(total),
                               shape, 1));
  RETURN_IF_ERROR(write_output(response, "FLAGS", TRITONSERVER_TYPE_INT32, &flags32,
                               sizeof(flags32), shape, 1));
  return write_output(response, "CORRID", TRITONSERVER_TYPE_UINT64, &corrid, sizeof(corrid),
                      shape, 1);
}

ANSWER_EACH_REQUEST(run)
