/* Test backend "response_stats" (decoupled): for IN = n (INT32[1]) it sends n responses through
 * a response factory and reports each one's statistics with durations it makes up, as Triton's
 * `square` test backend reports them: the first n-2 are successes (OUT = IN), then a failed
 * response (no output), then an empty final response. Per response: compute_infer 10 ms,
 * compute_output 2 ms (successes only). n < 3 sends n successes and an empty final flag that
 * is not reported. */
#include "common.h"

RECORDING_LIFECYCLE

#define MS 1000000ULL

static TRITONSERVER_Error* report(TRITONBACKEND_ModelInstance* instance,
                                  TRITONBACKEND_ResponseFactory* factory, uint64_t start,
                                  uint64_t output_start, uint64_t end, TRITONSERVER_Error* error) {
  TRITONBACKEND_ModelInstanceResponseStatistics* rs;
  RETURN_IF_ERROR(TRITONBACKEND_ModelInstanceResponseStatisticsNew(&rs));
  TRITONBACKEND_ModelInstanceResponseStatisticsSetModelInstance(rs, instance);
  TRITONBACKEND_ModelInstanceResponseStatisticsSetResponseFactory(rs, factory);
  TRITONBACKEND_ModelInstanceResponseStatisticsSetResponseStart(rs, start);
  TRITONBACKEND_ModelInstanceResponseStatisticsSetComputeOutputStart(rs, output_start);
  TRITONBACKEND_ModelInstanceResponseStatisticsSetResponseEnd(rs, end);
  TRITONBACKEND_ModelInstanceResponseStatisticsSetError(rs, error);
  TRITONSERVER_Error* err = TRITONBACKEND_ModelInstanceReportResponseStatistics(rs);
  TRITONBACKEND_ModelInstanceResponseStatisticsDelete(rs);
  return err;
}

TRITONSERVER_Error* TRITONBACKEND_ModelInstanceExecute(TRITONBACKEND_ModelInstance* instance,
                                                       TRITONBACKEND_Request** requests,
                                                       const uint32_t request_count) {
  for (uint32_t r = 0; r < request_count; r++) {
    TRITONBACKEND_Request* request = requests[r];
    TRITONBACKEND_ResponseFactory* factory;
    RETURN_IF_ERROR(TRITONBACKEND_ResponseFactoryNew(&factory, request));
    TRITONBACKEND_Input* input;
    const void* src;
    uint64_t size;
    TRITONSERVER_MemoryType mt;
    int64_t id;
    RETURN_IF_ERROR(TRITONBACKEND_RequestInput(request, "IN", &input));
    RETURN_IF_ERROR(TRITONBACKEND_InputBuffer(input, 0, &src, &size, &mt, &id));
    const int32_t n = *(const int32_t*)src;
    const int32_t successes = n >= 3 ? n - 2 : n;
    uint64_t t = 1000 * MS;
    for (int32_t k = 0; k < successes; k++) {
      TRITONBACKEND_Response* response;
      RETURN_IF_ERROR(TRITONBACKEND_ResponseNewFromFactory(&response, factory));
      const int64_t shape[1] = {1};
      TRITONBACKEND_Output* output;
      void* dst;
      RETURN_IF_ERROR(TRITONBACKEND_ResponseOutput(response, &output, "OUT", TRITONSERVER_TYPE_INT32,
                                                   shape, 1));
      RETURN_IF_ERROR(TRITONBACKEND_OutputBuffer(output, &dst, sizeof(int32_t), &mt, &id));
      memcpy(dst, src, sizeof(int32_t));
      RETURN_IF_ERROR(TRITONBACKEND_ResponseSend(response, 0, NULL));
      RETURN_IF_ERROR(report(instance, factory, t, t + 10 * MS, t + 12 * MS, NULL));
      t += 12 * MS;
    }
    if (n >= 3) {
      TRITONBACKEND_Response* response;
      RETURN_IF_ERROR(TRITONBACKEND_ResponseNewFromFactory(&response, factory));
      RETURN_IF_ERROR(TRITONBACKEND_ResponseSend(
          response, 0, TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_INTERNAL, "made up")));
      TRITONSERVER_Error* failure = TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_INTERNAL, "made up");
      RETURN_IF_ERROR(report(instance, factory, t, 0, t + 10 * MS, failure));
      TRITONSERVER_ErrorDelete(failure);
      t += 10 * MS;
    }
    RETURN_IF_ERROR(TRITONBACKEND_ResponseFactorySendFlags(
        factory, TRITONSERVER_RESPONSE_COMPLETE_FINAL));
    if (n >= 3) RETURN_IF_ERROR(report(instance, factory, t, 0, t + 10 * MS, NULL));
    TRITONBACKEND_ResponseFactoryDelete(factory);
    TRITONBACKEND_RequestRelease(request, TRITONSERVER_REQUEST_RELEASE_ALL);
  }
  return NULL;
}
