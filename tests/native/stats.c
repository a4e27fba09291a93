/* Test backend "stats": OUTPUT0 = INPUT0 (INT32), and it reports statistics with durations it
 * makes up, so a test can recognise them in the host's statistics: per execute, compute_input
 * 1 ms, compute_infer 5 s, compute_output 2 ms. It also counts its executes in a counter metric,
 * stats_backend_executes{model="<model>"}. */
#include "common.h"

RECORDING_LIFECYCLE

static TRITONSERVER_MetricFamily* family;
static TRITONSERVER_Metric* metric;

TRITONSERVER_Error* TRITONBACKEND_ModelInitialize(TRITONBACKEND_Model* model) {
  const char* name;
  RETURN_IF_ERROR(TRITONBACKEND_ModelName(model, &name));
  RETURN_IF_ERROR(TRITONSERVER_MetricFamilyNew(&family, TRITONSERVER_METRIC_KIND_COUNTER,
                                               "stats_backend_executes", "executes"));
  TRITONSERVER_Parameter* label =
      TRITONSERVER_ParameterNew("model", TRITONSERVER_PARAMETER_STRING, name);
  const TRITONSERVER_Parameter* labels[1] = {label};
  RETURN_IF_ERROR(TRITONSERVER_MetricNew(&metric, family, labels, 1));
  TRITONSERVER_ParameterDelete(label);
  record_event("model_initialize", name);
  return NULL;
}

#define T0 1000000000ULL
#define INPUT_NS 1000000ULL
#define INFER_NS 5000000000ULL
#define OUTPUT_NS 2000000ULL

TRITONSERVER_Error* TRITONBACKEND_ModelInstanceExecute(TRITONBACKEND_ModelInstance* instance,
                                                       TRITONBACKEND_Request** requests,
                                                       const uint32_t request_count) {
  const uint64_t start = T0, compute_start = start + INPUT_NS,
                 compute_end = compute_start + INFER_NS, end = compute_end + OUTPUT_NS;
  for (uint32_t r = 0; r < request_count; r++) {
    TRITONBACKEND_Request* request = requests[r];
    TRITONBACKEND_Response* response;
    RETURN_IF_ERROR(TRITONBACKEND_ResponseNew(&response, request));
    TRITONBACKEND_Input* input;
    TRITONSERVER_Error* err = TRITONBACKEND_RequestInput(request, "INPUT0", &input);
    if (err == NULL) {
      const int64_t* shape;
      uint32_t dims;
      uint64_t size;
      const void* src;
      TRITONSERVER_MemoryType mt;
      int64_t id;
      TRITONBACKEND_InputProperties(input, NULL, NULL, &shape, &dims, &size, NULL);
      TRITONBACKEND_Output* output;
      void* dst;
      if (!(err = TRITONBACKEND_ResponseOutput(response, &output, "OUTPUT0", TRITONSERVER_TYPE_INT32,
                                               shape, dims)) &&
          !(err = TRITONBACKEND_OutputBuffer(output, &dst, size, &mt, &id)) &&
          !(err = TRITONBACKEND_InputBuffer(input, 0, &src, &size, &mt, &id)))
        memcpy(dst, src, size);
    }
    TRITONBACKEND_ResponseSend(response, TRITONSERVER_RESPONSE_COMPLETE_FINAL, err);
    TRITONBACKEND_ModelInstanceReportStatistics(instance, request, err == NULL, start,
                                                compute_start, compute_end, end);
    if (err != NULL) TRITONSERVER_ErrorDelete(err);
    TRITONBACKEND_RequestRelease(request, TRITONSERVER_REQUEST_RELEASE_ALL);
  }
  TRITONBACKEND_ModelInstanceReportBatchStatistics(instance, request_count, start, compute_start,
                                                   compute_end, end);
  TRITONSERVER_MetricIncrement(metric, 1);
  return NULL;
}
