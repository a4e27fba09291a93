/* Test backend "repeat" (decoupled): for a request with IN (INT32 [n]) it sends n responses,
 * OUT = [IN[i]] and IDX = [i], from a thread of its own after execute returned, then a
 * flags-only final response. Instance finalize waits for its threads. */
#include <pthread.h>
#include <stdint.h>
#include <unistd.h>

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t idle = PTHREAD_COND_INITIALIZER;
static int running;

static void wait_idle(void) {
  pthread_mutex_lock(&lock);
  while (running > 0) pthread_cond_wait(&idle, &lock);
  pthread_mutex_unlock(&lock);
}
#define BEFORE_INSTANCE_FINALIZE() wait_idle()

#include "common.h"

RECORDING_LIFECYCLE

TRITONSERVER_Error* TRITONBACKEND_ModelInitialize(TRITONBACKEND_Model* model) {
  const char* name;
  RETURN_IF_ERROR(TRITONBACKEND_ModelName(model, &name));
  record_event("model_initialize", name);
  return NULL;
}

typedef struct job {
  TRITONBACKEND_ResponseFactory* factory;
  int32_t* values;
  uint32_t count;
} job;

static void send_int(TRITONBACKEND_Response* response, const char* name, int32_t value) {
  TRITONBACKEND_Output* output;
  const int64_t shape[1] = {1};
  void* dst;
  TRITONSERVER_MemoryType mt;
  int64_t id;
  if (TRITONBACKEND_ResponseOutput(response, &output, name, TRITONSERVER_TYPE_INT32, shape, 1) == NULL &&
      TRITONBACKEND_OutputBuffer(output, &dst, sizeof(int32_t), &mt, &id) == NULL)
    memcpy(dst, &value, sizeof(value));
}

static void* run(void* arg) {
  job* j = arg;
  usleep(20000); /* well after execute returned */
  for (uint32_t i = 0; i < j->count; i++) {
    bool cancelled = false;
    TRITONBACKEND_ResponseFactoryIsCancelled(j->factory, &cancelled);
    if (cancelled) break;
    TRITONBACKEND_Response* response;
    if (TRITONBACKEND_ResponseNewFromFactory(&response, j->factory) != NULL) break;
    send_int(response, "OUT", j->values[i]);
    send_int(response, "IDX", (int32_t)i);
    TRITONBACKEND_ResponseSend(response, 0, NULL);
  }
  TRITONBACKEND_ResponseFactorySendFlags(j->factory, TRITONSERVER_RESPONSE_COMPLETE_FINAL);
  TRITONBACKEND_ResponseFactoryDelete(j->factory);
  free(j->values);
  free(j);
  pthread_mutex_lock(&lock);
  if (--running == 0) pthread_cond_broadcast(&idle);
  pthread_mutex_unlock(&lock);
  return NULL;
}

TRITONSERVER_Error* TRITONBACKEND_ModelInstanceExecute(TRITONBACKEND_ModelInstance* instance,
                                                       TRITONBACKEND_Request** requests,
                                                       const uint32_t request_count) {
  for (uint32_t r = 0; r < request_count; r++) {
    TRITONBACKEND_Request* request = requests[r];
    job* j = calloc(1, sizeof(*j));
    TRITONBACKEND_ResponseFactoryNew(&j->factory, request);
    TRITONBACKEND_Input* input;
    const void* src;
    uint64_t size = 0;
    TRITONSERVER_MemoryType mt;
    int64_t id;
    if (TRITONBACKEND_RequestInput(request, "IN", &input) == NULL &&
        TRITONBACKEND_InputBuffer(input, 0, &src, &size, &mt, &id) == NULL) {
      j->count = (uint32_t)(size / sizeof(int32_t));
      j->values = malloc(size ? size : 1);
      memcpy(j->values, src, size);
    }
    TRITONBACKEND_RequestRelease(request, TRITONSERVER_REQUEST_RELEASE_ALL);
    pthread_mutex_lock(&lock);
    running++;
    pthread_mutex_unlock(&lock);
    pthread_t thread;
    pthread_create(&thread, NULL, run, j);
    pthread_detach(thread);
  }
  return NULL;
}
