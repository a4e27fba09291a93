/* Test backend "aborting": TRITONBACKEND_ModelInitialize aborts the process, as a backend whose
 * load throws an uncaught C++ exception does. The server must not restart its worker for ever. */
#include "common.h"

RECORDING_LIFECYCLE

TRITONSERVER_Error* TRITONBACKEND_ModelInitialize(TRITONBACKEND_Model* model) {
  const char* name;
  RETURN_IF_ERROR(TRITONBACKEND_ModelName(model, &name));
  record_event("model_initialize", name);
  abort();
}

TRITONSERVER_Error* TRITONBACKEND_ModelInstanceExecute(TRITONBACKEND_ModelInstance* instance,
                                                       TRITONBACKEND_Request** requests,
                                                       const uint32_t request_count) {
  return TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_INTERNAL, "never executes");
}
