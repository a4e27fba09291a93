/* Test backend "identity": OUTPUT<i> = INPUT<i> for every output the request asks for, any
 * datatype and shape. Each response carries parameters that show what the backend saw: the
 * folder it was loaded from, the instance that ran it, the number of requests in the batch,
 * and whether the model configuration JSON names the model (not with -DIDENTITY_LEAN, the
 * build the benchmark uses, which only copies). */
#include <time.h>

#include "common.h"

RECORDING_LIFECYCLE

/* Triton's backends take timestamps from the steady clock. */
static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

TRITONSERVER_Error* TRITONBACKEND_ModelInitialize(TRITONBACKEND_Model* model) {
  const char* name;
  RETURN_IF_ERROR(TRITONBACKEND_ModelName(model, &name));
  TRITONSERVER_Message* config;
  RETURN_IF_ERROR(TRITONBACKEND_ModelConfig(model, 1, &config));
  const char* json;
  size_t size;
  RETURN_IF_ERROR(TRITONSERVER_MessageSerializeToJson(config, &json, &size));
  char needle[256];
  snprintf(needle, sizeof(needle), "\"name\": \"%s\"", name);
  char needle2[256];
  snprintf(needle2, sizeof(needle2), "\"name\":\"%s\"", name);
  /* model state: 1 when the configuration JSON names this model */
  long named = strstr(json, needle) != NULL || strstr(json, needle2) != NULL;
  TRITONSERVER_MessageDelete(config);
  RETURN_IF_ERROR(TRITONBACKEND_ModelSetState(model, (void*)named));
  char msg[300];
  snprintf(msg, sizeof(msg), "identity test backend: model '%s' initialized", name);
  TRITONSERVER_LogMessage(TRITONSERVER_LOG_INFO, __FILE__, __LINE__, msg);
  record_event("model_initialize", name);
  return NULL;
}

/* "OUTPUT3" -> "INPUT3" */
static void input_for(const char* output, char* input, size_t n) {
  const char* digits = output;
  while (*digits && (*digits < '0' || *digits > '9')) digits++;
  snprintf(input, n, "INPUT%s", digits);
}

static TRITONSERVER_Error* respond(TRITONBACKEND_ModelInstance* instance,
                                   TRITONBACKEND_Request* request, uint32_t batch) {
  TRITONBACKEND_Response* response;
  RETURN_IF_ERROR(TRITONBACKEND_ResponseNew(&response, request));
  uint32_t outputs;
  RETURN_IF_ERROR(TRITONBACKEND_RequestOutputCount(request, &outputs));
  TRITONSERVER_Error* err = NULL;
  for (uint32_t o = 0; o < outputs && err == NULL; o++) {
    const char* out_name;
    char in_name[128];
    if ((err = TRITONBACKEND_RequestOutputName(request, o, &out_name))) break;
    input_for(out_name, in_name, sizeof(in_name));
    TRITONBACKEND_Input* input;
    if ((err = TRITONBACKEND_RequestInput(request, in_name, &input))) break;
    TRITONSERVER_DataType dt;
    const int64_t* shape;
    uint32_t dims, buffers;
    uint64_t size;
    if ((err = TRITONBACKEND_InputProperties(input, NULL, &dt, &shape, &dims, &size, &buffers))) break;
    TRITONBACKEND_Output* output;
    if ((err = TRITONBACKEND_ResponseOutput(response, &output, out_name, dt, shape, dims))) break;
    void* dst;
    TRITONSERVER_MemoryType mt = TRITONSERVER_MEMORY_CPU;
    int64_t mt_id = 0;
    if ((err = TRITONBACKEND_OutputBuffer(output, &dst, size, &mt, &mt_id))) break;
    uint64_t offset = 0;
    for (uint32_t b = 0; b < buffers && err == NULL; b++) {
      const void* src;
      uint64_t n;
      TRITONSERVER_MemoryType smt;
      int64_t smt_id;
      if ((err = TRITONBACKEND_InputBuffer(input, b, &src, &n, &smt, &smt_id))) break;
      memcpy((char*)dst + offset, src, n);
      offset += n;
    }
  }
#ifndef IDENTITY_LEAN
  if (err == NULL) {
    TRITONBACKEND_Model* model;
    TRITONBACKEND_ModelInstanceModel(instance, &model);
    TRITONBACKEND_Backend* backend;
    TRITONBACKEND_ModelBackend(model, &backend);
    TRITONBACKEND_ArtifactType type;
    const char* location;
    TRITONBACKEND_BackendArtifacts(backend, &type, &location);
    const char* iname;
    TRITONBACKEND_ModelInstanceName(instance, &iname);
    void* named;
    TRITONBACKEND_ModelState(model, &named);
    TRITONBACKEND_ResponseSetStringParameter(response, "backend_location", location);
    TRITONBACKEND_ResponseSetStringParameter(response, "instance", iname);
    TRITONBACKEND_ResponseSetIntParameter(response, "batch_requests", batch);
    TRITONBACKEND_ResponseSetBoolParameter(response, "config_names_model", named != NULL);
    /* echo the request's own parameters back, prefixed */
    uint32_t count = 0;
    TRITONBACKEND_RequestParameterCount(request, &count);
    for (uint32_t p = 0; p < count; p++) {
      const char* key;
      TRITONSERVER_ParameterType type;
      const void* value;
      TRITONBACKEND_RequestParameter(request, p, &key, &type, &value);
      char echo[160];
      snprintf(echo, sizeof(echo), "echo_%s", key);
      if (type == TRITONSERVER_PARAMETER_STRING)
        TRITONBACKEND_ResponseSetStringParameter(response, echo, (const char*)value);
      else if (type == TRITONSERVER_PARAMETER_INT)
        TRITONBACKEND_ResponseSetIntParameter(response, echo, *(const int64_t*)value);
      else if (type == TRITONSERVER_PARAMETER_BOOL)
        TRITONBACKEND_ResponseSetBoolParameter(response, echo, *(const bool*)value);
    }
  }
#else
  (void)instance;
  (void)batch;
#endif
  TRITONBACKEND_ResponseSend(response, TRITONSERVER_RESPONSE_COMPLETE_FINAL, err);
  if (err != NULL) TRITONSERVER_ErrorDelete(err);
  return NULL;
}

TRITONSERVER_Error* TRITONBACKEND_ModelInstanceExecute(TRITONBACKEND_ModelInstance* instance,
                                                       TRITONBACKEND_Request** requests,
                                                       const uint32_t request_count) {
  /* A request with the parameter "execute_error" makes the whole execute fail: the requests
   * are not released, so they stay the server's (Triton's rule) and all get this error. */
  for (uint32_t r = 0; r < request_count; r++) {
    uint32_t count = 0;
    TRITONBACKEND_RequestParameterCount(requests[r], &count);
    for (uint32_t p = 0; p < count; p++) {
      const char* key;
      TRITONSERVER_ParameterType type;
      const void* value;
      TRITONBACKEND_RequestParameter(requests[r], p, &key, &type, &value);
      if (strcmp(key, "execute_error") == 0)
        return TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_INVALID_ARG,
                                     "identity test backend: execute refused the batch");
    }
  }
  /* Statistics as Triton's identity backend reports them: one timing for the whole batch. */
  uint64_t exec_start = now_ns(), compute_start = exec_start;
  bool ok[request_count ? request_count : 1];
  for (uint32_t r = 0; r < request_count; r++) {
    TRITONSERVER_Error* err = respond(instance, requests[r], request_count);
    ok[r] = err == NULL;
    if (err != NULL) TRITONSERVER_ErrorDelete(err);
  }
  uint64_t compute_end = now_ns(), exec_end = compute_end;
  for (uint32_t r = 0; r < request_count; r++) {
    TRITONBACKEND_ModelInstanceReportStatistics(instance, requests[r], ok[r], exec_start,
                                                compute_start, compute_end, exec_end);
    TRITONBACKEND_RequestRelease(requests[r], TRITONSERVER_REQUEST_RELEASE_ALL);
  }
  TRITONBACKEND_ModelInstanceReportBatchStatistics(instance, request_count, exec_start,
                                                   compute_start, compute_end, exec_end);
  return NULL;
}

#ifdef IDENTITY_PREFERRED_GROUPS
/* Built with -DIDENTITY_PREFERRED_GROUPS: the backend prefers two CPU instances, which a model
 * without instance groups gets (Triton's rule for backend attributes). */
TRITONSERVER_Error* TRITONBACKEND_GetBackendAttribute(TRITONBACKEND_Backend* backend,
                                                      TRITONBACKEND_BackendAttribute* attributes) {
  (void)backend;
  RETURN_IF_ERROR(TRITONBACKEND_BackendAttributeAddPreferredInstanceGroup(
      attributes, TRITONSERVER_INSTANCEGROUPKIND_CPU, 2, NULL, 0));
  return TRITONBACKEND_BackendAttributeSetParallelModelInstanceLoading(attributes, true);
}
#endif
