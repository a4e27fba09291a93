/* Test backend "bls": a native backend that sends requests to other models through the
 * in-process server API, as Triton's python backend does for BLS.
 *
 * For each request (INPUT0, INT32 [4]) it calls the model named by the request's string
 * parameter "callee" (default "py_int32") with that input, waits for the callee's responses
 * and answers OUTPUT0 = the callee's OUTPUT0 of its last response. Response parameters report:
 * "callee_ready" (TRITONSERVER_ServerModelIsReady), "callee_decoupled" (transaction
 * properties), "responses" (how many the callee sent), "callee_error" (the callee's error or
 * ServerInferAsync's, if any), "callee_param" (the callee's response parameter "seen", if any),
 * and "unsupported" (the message of an API function modelhost does not implement, which must
 * be an error the backend can handle). */
#include <pthread.h>

#include "common.h"

RECORDING_LIFECYCLE

TRITONSERVER_Error* TRITONBACKEND_ModelInitialize(TRITONBACKEND_Model* model) { return NULL; }

typedef struct {
  pthread_mutex_t lock;
  pthread_cond_t cond;
  int responses;
  int released;
  int32_t out[4];
  int have_out;
  char error[512];
  char seen[128];
} call_state;

static TRITONSERVER_Error* alloc_fn(TRITONSERVER_ResponseAllocator* a, const char* name,
                                    size_t size, TRITONSERVER_MemoryType type, int64_t type_id,
                                    void* userp, void** buffer, void** buffer_userp,
                                    TRITONSERVER_MemoryType* actual, int64_t* actual_id) {
  *buffer = size ? malloc(size) : NULL;
  *buffer_userp = (void*)0x1; /* checked in release_fn */
  *actual = TRITONSERVER_MEMORY_CPU;
  *actual_id = 0;
  return NULL;
}

static TRITONSERVER_Error* release_fn(TRITONSERVER_ResponseAllocator* a, void* buffer,
                                      void* buffer_userp, size_t size,
                                      TRITONSERVER_MemoryType type, int64_t type_id) {
  if (buffer_userp != (void*)0x1) abort();
  free(buffer);
  return NULL;
}

static void on_response(TRITONSERVER_InferenceResponse* response, const uint32_t flags,
                        void* userp) {
  call_state* s = userp;
  pthread_mutex_lock(&s->lock);
  if (response != NULL) {
    s->responses++;
    TRITONSERVER_Error* err = TRITONSERVER_InferenceResponseError(response);
    if (err != NULL) {
      snprintf(s->error, sizeof(s->error), "%s", TRITONSERVER_ErrorMessage(err));
    } else {
      uint32_t count = 0;
      TRITONSERVER_InferenceResponseOutputCount(response, &count);
      for (uint32_t i = 0; i < count; i++) {
        const char* name;
        TRITONSERVER_DataType dt;
        const int64_t* shape;
        uint64_t dims;
        const void* base;
        size_t size;
        TRITONSERVER_MemoryType mt;
        int64_t mt_id;
        void* u;
        TRITONSERVER_InferenceResponseOutput(response, i, &name, &dt, &shape, &dims, &base, &size,
                                             &mt, &mt_id, &u);
        if (strcmp(name, "OUTPUT0") == 0 && size == sizeof(s->out)) {
          memcpy(s->out, base, size);
          s->have_out = 1;
        }
      }
      uint32_t params = 0;
      TRITONSERVER_InferenceResponseParameterCount(response, &params);
      for (uint32_t i = 0; i < params; i++) {
        const char* key;
        TRITONSERVER_ParameterType type;
        const void* value;
        TRITONSERVER_InferenceResponseParameter(response, i, &key, &type, &value);
        if (strcmp(key, "seen") == 0 && type == TRITONSERVER_PARAMETER_STRING)
          snprintf(s->seen, sizeof(s->seen), "%s", (const char*)value);
      }
    }
    TRITONSERVER_InferenceResponseDelete(response);
  }
  pthread_mutex_unlock(&s->lock);
}

static void on_release(TRITONSERVER_InferenceRequest* request, const uint32_t flags,
                       void* userp) {
  call_state* s = userp;
  TRITONSERVER_InferenceRequestDelete(request);
  pthread_mutex_lock(&s->lock);
  s->released = 1;
  pthread_cond_broadcast(&s->cond);
  pthread_mutex_unlock(&s->lock);
}

static void set_string(TRITONBACKEND_Response* response, const char* key, const char* value) {
  TRITONBACKEND_ResponseSetStringParameter(response, key, value);
}

static TRITONSERVER_Error* call(TRITONBACKEND_Model* model, TRITONBACKEND_Request* request,
                                TRITONBACKEND_Response* response) {
  const char* callee = "py_int32";
  uint32_t param_count = 0;
  TRITONBACKEND_RequestParameterCount(request, &param_count);
  for (uint32_t i = 0; i < param_count; i++) {
    const char* key;
    TRITONSERVER_ParameterType type;
    const void* value;
    TRITONBACKEND_RequestParameter(request, i, &key, &type, &value);
    if (strcmp(key, "callee") == 0 && type == TRITONSERVER_PARAMETER_STRING) callee = value;
  }
  TRITONSERVER_Server* server;
  RETURN_IF_ERROR(TRITONBACKEND_ModelServer(model, &server));

  bool ready = false;
  RETURN_IF_ERROR(TRITONSERVER_ServerModelIsReady(server, callee, -1, &ready));
  TRITONBACKEND_ResponseSetBoolParameter(response, "callee_ready", ready);
  uint32_t txn = 0;
  if (TRITONSERVER_ServerModelTransactionProperties(server, callee, -1, &txn, NULL) == NULL)
    TRITONBACKEND_ResponseSetBoolParameter(response, "callee_decoupled",
                                           (txn & TRITONSERVER_TXN_DECOUPLED) != 0);

  /* An API function modelhost does not implement: an error, never an abort. */
  TRITONSERVER_ServerOptions* options = NULL;
  TRITONSERVER_Error* unsupported = TRITONSERVER_ServerOptionsNew(&options);
  set_string(response, "unsupported",
             unsupported ? TRITONSERVER_ErrorMessage(unsupported) : "(no error)");
  TRITONSERVER_ErrorDelete(unsupported);

  TRITONBACKEND_Input* input;
  RETURN_IF_ERROR(TRITONBACKEND_RequestInput(request, "INPUT0", &input));
  const void* data;
  uint64_t size;
  TRITONSERVER_MemoryType mt;
  int64_t mt_id;
  RETURN_IF_ERROR(TRITONBACKEND_InputBuffer(input, 0, &data, &size, &mt, &mt_id));

  call_state s = {.lock = PTHREAD_MUTEX_INITIALIZER, .cond = PTHREAD_COND_INITIALIZER};
  TRITONSERVER_ResponseAllocator* allocator;
  RETURN_IF_ERROR(TRITONSERVER_ResponseAllocatorNew(&allocator, alloc_fn, release_fn, NULL));
  TRITONSERVER_InferenceRequest* irequest;
  RETURN_IF_ERROR(TRITONSERVER_InferenceRequestNew(&irequest, server, callee, -1));
  const int64_t shape[1] = {4};
  TRITONSERVER_InferenceRequestSetId(irequest, "from-native");
  TRITONSERVER_InferenceRequestSetStringParameter(irequest, "origin", "native");
  TRITONSERVER_InferenceRequestAddInput(irequest, "INPUT0", TRITONSERVER_TYPE_INT32, shape, 1);
  TRITONSERVER_InferenceRequestAppendInputData(irequest, "INPUT0", data, size,
                                               TRITONSERVER_MEMORY_CPU, 0);
  TRITONSERVER_InferenceRequestAddRequestedOutput(irequest, "OUTPUT0");
  TRITONSERVER_InferenceRequestSetReleaseCallback(irequest, on_release, &s);
  TRITONSERVER_InferenceRequestSetResponseCallback(irequest, allocator, NULL, on_response, &s);
  TRITONSERVER_Error* err = TRITONSERVER_ServerInferAsync(server, irequest, NULL);
  if (err != NULL) { /* not sent: still ours */
    snprintf(s.error, sizeof(s.error), "%s", TRITONSERVER_ErrorMessage(err));
    TRITONSERVER_ErrorDelete(err);
    TRITONSERVER_InferenceRequestDelete(irequest);
  } else {
    pthread_mutex_lock(&s.lock);
    while (!s.released) pthread_cond_wait(&s.cond, &s.lock);
    pthread_mutex_unlock(&s.lock);
  }
  TRITONSERVER_ResponseAllocatorDelete(allocator);

  TRITONBACKEND_ResponseSetIntParameter(response, "responses", s.responses);
  if (s.error[0]) set_string(response, "callee_error", s.error);
  if (s.seen[0]) set_string(response, "callee_param", s.seen);
  TRITONBACKEND_Output* output;
  void* dst;
  RETURN_IF_ERROR(TRITONBACKEND_ResponseOutput(response, &output, "OUTPUT0",
                                               TRITONSERVER_TYPE_INT32, shape, 1));
  RETURN_IF_ERROR(TRITONBACKEND_OutputBuffer(output, &dst, sizeof(s.out), &mt, &mt_id));
  memcpy(dst, s.have_out ? (const void*)s.out : data, sizeof(s.out));
  return NULL;
}

TRITONSERVER_Error* TRITONBACKEND_ModelInstanceExecute(TRITONBACKEND_ModelInstance* instance,
                                                       TRITONBACKEND_Request** requests,
                                                       const uint32_t request_count) {
  TRITONBACKEND_Model* model;
  RETURN_IF_ERROR(TRITONBACKEND_ModelInstanceModel(instance, &model));
  for (uint32_t r = 0; r < request_count; r++) {
    TRITONBACKEND_Response* response;
    RETURN_IF_ERROR(TRITONBACKEND_ResponseNew(&response, requests[r]));
    TRITONSERVER_Error* err = call(model, requests[r], response);
    TRITONBACKEND_ResponseSend(response, TRITONSERVER_RESPONSE_COMPLETE_FINAL, err);
    TRITONBACKEND_RequestRelease(requests[r], TRITONSERVER_REQUEST_RELEASE_ALL);
  }
  return NULL;
}
