/* Test backend "iterative": one request, several runs (iterative sequences).
 *
 * A request's INPUT (INT32, one element) says how many responses it gets. Each run sends one
 * response whose OUTPUT counts down to 0 (kept per correlation id), and releases the request with
 * TRITONSERVER_REQUEST_RELEASE_RESCHEDULE until the last, which is final and released with ALL.
 * When the host refuses to reschedule (the model is not iterative, or its sequence is gone), the
 * backend does as Triton's own test backend: it releases the request with ALL and sends the
 * refusal as the final response. OUTPUT also tells the correlation id (OUTPUT = remaining +
 * 1000 * id) and FLAGS the request's flags, so a test can see what the host gave each run. */
#include "common.h"

#include <pthread.h>

RECORDING_LIFECYCLE

TRITONSERVER_Error* TRITONBACKEND_ModelInitialize(TRITONBACKEND_Model* model) { return NULL; }

#define MAX_SEQUENCES 64
static struct { uint64_t id; int32_t left; } sequences[MAX_SEQUENCES];
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

/* The responses left for sequence `id` once this run's is sent (its first run sets them). */
static int32_t next_left(uint64_t id, int32_t total, int start) {
  pthread_mutex_lock(&lock);
  int free_slot = -1, found = -1;
  for (int i = 0; i < MAX_SEQUENCES; i++) {
    if (sequences[i].id == id && id != 0) found = i;
    if (sequences[i].id == 0 && free_slot < 0) free_slot = i;
  }
  int i = found >= 0 ? found : free_slot;
  if (start || found < 0) {
    sequences[i].id = id;
    sequences[i].left = total;
  }
  int32_t left = --sequences[i].left;
  if (left <= 0) sequences[i].id = 0;
  pthread_mutex_unlock(&lock);
  return left;
}

static void run(TRITONBACKEND_Request* request) {
  TRITONBACKEND_Response* response;
  if (TRITONBACKEND_ResponseNew(&response, request) != NULL) return;
  const int64_t shape[2] = {1, 1};
  int32_t total = 0;
  uint64_t id = 0;
  uint32_t flags = 0;
  TRITONSERVER_Error* err = read_int32(request, "INPUT", &total);
  if (err == NULL) err = TRITONBACKEND_RequestCorrelationId(request, &id);
  if (err == NULL) err = TRITONBACKEND_RequestFlags(request, &flags);
  int32_t left = 0;
  if (err == NULL) {
    left = next_left(id, total, flags & TRITONSERVER_REQUEST_FLAG_SEQUENCE_START);
    int32_t out = left + 1000 * (int32_t)id;
    err = write_output(response, "OUTPUT", TRITONSERVER_TYPE_INT32, &out, sizeof(out), shape, 2);
  }
  int32_t flags32 = (int32_t)flags;
  if (err == NULL)
    err = write_output(response, "FLAGS", TRITONSERVER_TYPE_INT32, &flags32, sizeof(flags32), shape, 2);
  if (err != NULL || left <= 0) {
    TRITONBACKEND_RequestRelease(request, TRITONSERVER_REQUEST_RELEASE_ALL);
    TRITONBACKEND_ResponseSend(response, TRITONSERVER_RESPONSE_COMPLETE_FINAL, err);
  } else {
    /* released before the response is sent, as Triton's test backend does */
    TRITONSERVER_Error* refused = TRITONBACKEND_RequestRelease(request,
                                                               TRITONSERVER_REQUEST_RELEASE_RESCHEDULE);
    if (refused != NULL) {
      TRITONBACKEND_RequestRelease(request, TRITONSERVER_REQUEST_RELEASE_ALL);
      TRITONBACKEND_ResponseSend(response, TRITONSERVER_RESPONSE_COMPLETE_FINAL, refused);
      TRITONSERVER_ErrorDelete(refused);
    } else {
      TRITONBACKEND_ResponseSend(response, 0, NULL);
    }
  }
  if (err != NULL) TRITONSERVER_ErrorDelete(err);
}

TRITONSERVER_Error* TRITONBACKEND_ModelInstanceExecute(TRITONBACKEND_ModelInstance* instance,
                                                       TRITONBACKEND_Request** requests,
                                                       const uint32_t request_count) {
  for (uint32_t r = 0; r < request_count; r++) run(requests[r]);
  return NULL;
}
