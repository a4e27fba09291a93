/* Test backend "failing": TRITONBACKEND_ModelInitialize fails, so no model using it loads. */
#include "common.h"

RECORDING_LIFECYCLE

TRITONSERVER_Error* TRITONBACKEND_ModelInitialize(TRITONBACKEND_Model* model) {
  const char* name;
  RETURN_IF_ERROR(TRITONBACKEND_ModelName(model, &name));
  record_event("model_initialize", name);
  return TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_INVALID_ARG,
                               "failing test backend refuses every model");
}

TRITONSERVER_Error* TRITONBACKEND_ModelInstanceExecute(TRITONBACKEND_ModelInstance* instance,
                                                       TRITONBACKEND_Request** requests,
                                                       const uint32_t request_count) {
  return TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_INTERNAL, "never executes");
}
