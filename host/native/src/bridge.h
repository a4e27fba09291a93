/* modelhost native bridge: the objects behind the opaque Triton API types.
 *
 * The bridge is one shared library (built as the Python extension module
 * host.native.libtritonserver, soname libtritonserver.so) that exports the server
 * side of Triton's C API. host.native loads it with RTLD_GLOBAL before any backend
 * or cache library, so those resolve every TRITONSERVER_* / TRITONBACKEND_* /
 * TRITONCACHE_* symbol against it at load time.
 *
 * Threading rule: Python calls into a backend or cache always with the GIL released,
 * and every bridge function that touches a Python object takes the GIL itself
 * (PyGILState_Ensure), so a backend may call the API from any thread.
 */
#pragma once

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#define _COMPILING_TRITONSERVER 1
#define _COMPILING_TRITONBACKEND 1
#define _COMPILING_TRITONCACHE 1
#include "triton/core/tritonbackend.h"
#include "triton/core/tritoncache.h"
#include "triton/core/tritonserver.h"

#define MH_EXPORT __attribute__((visibility("default")))

/* --- errors, messages, buffer attributes (server.c) ------------------------------- */

struct TRITONSERVER_Error {
  TRITONSERVER_Error_Code code;
  char message[];
};

TRITONSERVER_Error* mh_error(TRITONSERVER_Error_Code code, const char* fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* The error every function without a host equivalent returns. */
TRITONSERVER_Error* mh_unsupported(const char* function);
/* dlopen(path) with the GIL released (a library's constructors may take long); NULL and *dl set,
 * or NOT_FOUND "unable to load <what> library: <dlerror>" (module.c). */
TRITONSERVER_Error* mh_dlopen(const char* path, const char* what, void** dl);

struct TRITONSERVER_Message {
  char* json;
  size_t size;
};
TRITONSERVER_Message* mh_message(const char* json, size_t size);
/* Raise `err` as host.native's BridgeError (code, message) and delete it; returns NULL (module.c). */
PyObject* mh_raise_error(TRITONSERVER_Error* err);

struct TRITONSERVER_BufferAttributes {
  size_t byte_size;
  TRITONSERVER_MemoryType memory_type;
  int64_t memory_type_id;
  void* cuda_ipc_handle;
};

/* A server parameter (TRITONSERVER_ParameterNew, server.c); read by ServerLoadModelWithParameters. */
struct TRITONSERVER_Parameter {
  char* name;
  TRITONSERVER_ParameterType type;
  union {
    char* s;
    int64_t i;
    bool b;
    double d;
  } value;
  void* bytes;
  uint64_t byte_size;
};

TRITONSERVER_DataType mh_datatype(const char* name);
char* mh_strdup(const char* s);

/* --- the Python side (module.c) ---------------------------------------------------- */

/* TRITONSERVER_LogMessage's way into the host's logging (takes the GIL). */
void mh_log(TRITONSERVER_LogLevel level, const char* file, int line, const char* msg);

/* A strong reference to a host InferenceRequest, shared by the backend request and every
 * response and response factory made for it; the last holder drops the Python reference. */
typedef struct mh_pyref {
  atomic_int refs;
  PyObject* request;
  atomic_bool factory; /* the backend took a response factory: it may answer after execute */
  atomic_uint_fast64_t response_index; /* per-response statistics: the request's next response */
} mh_pyref;
void mh_pyref_unref(mh_pyref* ref);

/* --- backends (backend.c) ----------------------------------------------------------- */

typedef TRITONSERVER_Error* (*mh_backend_fn)(TRITONBACKEND_Backend*);
typedef TRITONSERVER_Error* (*mh_model_fn)(TRITONBACKEND_Model*);
typedef TRITONSERVER_Error* (*mh_instance_fn)(TRITONBACKEND_ModelInstance*);
typedef TRITONSERVER_Error* (*mh_execute_fn)(TRITONBACKEND_ModelInstance*,
                                             TRITONBACKEND_Request**, uint32_t);
typedef TRITONSERVER_Error* (*mh_attribute_fn)(TRITONBACKEND_Backend*,
                                               TRITONBACKEND_BackendAttribute*);

#define MH_MAX_PREFERRED_GROUPS 16

typedef struct mh_preferred_group {
  TRITONSERVER_InstanceGroupKind kind;
  uint64_t count;
  uint64_t device_ids[8];
  uint64_t id_count;
} mh_preferred_group;

struct TRITONBACKEND_BackendAttribute {
  mh_preferred_group groups[MH_MAX_PREFERRED_GROUPS];
  int group_count;
  bool parallel_instance_loading;
};

struct TRITONBACKEND_Backend {
  char* name;
  char* location; /* directory of the library (TRITONBACKEND_BackendArtifacts) */
  char* config_json;
  void* dl;
  void* state;
  TRITONBACKEND_ExecutionPolicy policy;
  mh_backend_fn initialize, finalize;
  mh_model_fn model_initialize, model_finalize;
  mh_instance_fn instance_initialize, instance_finalize;
  mh_execute_fn execute;
  mh_attribute_fn get_attribute;
  TRITONBACKEND_BackendAttribute attributes;
};

struct TRITONBACKEND_Model {
  TRITONBACKEND_Backend* backend;
  char* name;
  uint64_t version;
  char* repository;
  char* config_json;
  size_t config_size;
  void* state;
  char** output_names; /* every configured output: requested when a request names none */
  uint32_t output_count;
  bool decoupled;
  pthread_mutex_t lock; /* guards config_json against ModelSetConfig */
};

/* Statistics a backend reported during an execute (read back by the host after it). */
typedef struct mh_reported {
  bool batch;
  uint64_t batch_input_ns, batch_infer_ns, batch_output_ns;
  uint64_t requests, input_ns, infer_ns, output_ns; /* sums of per-request reports */
} mh_reported;

/* One response's statistics a backend reported (decoupled models), read back by the host. */
typedef struct mh_response_stat {
  uint64_t index;
  int kind; /* MH_RESPONSE_SUCCESS ... */
  uint64_t infer_ns, output_ns, total_ns;
  bool has_infer, has_output;
} mh_response_stat;
enum { MH_RESPONSE_SUCCESS, MH_RESPONSE_FAIL, MH_RESPONSE_EMPTY, MH_RESPONSE_CANCEL };

struct TRITONBACKEND_ModelInstance {
  TRITONBACKEND_Model* model;
  char* name;
  TRITONSERVER_InstanceGroupKind kind;
  int32_t device_id;
  char* host_policy;
  bool passive;
  void* state;
  pthread_mutex_t stats_lock;
  mh_reported reported;
  mh_response_stat* responses; /* per-response statistics since the host last took them */
  size_t responses_len, responses_cap;
};

/* --- requests and responses (request.c) ---------------------------------------------- */

struct TRITONBACKEND_Input {
  char* name;
  TRITONSERVER_DataType datatype;
  int64_t* shape;
  uint32_t dims_count;
  const void* data;
  uint64_t byte_size;
  TRITONSERVER_BufferAttributes attributes;
  Py_buffer view; /* keeps the host's array (or serialized BYTES) alive; view.obj may be NULL */
};

typedef struct mh_param {
  char* key;
  TRITONSERVER_ParameterType type;
  union {
    char* s;
    int64_t i;
    bool b;
    double d;
  } value;
} mh_param;

/* request.c: parameters from a Python dict (see there), and their release */
int mh_params_from_dict(PyObject* params, mh_param** out, uint32_t* count, bool strict);
void mh_params_free(mh_param* params, uint32_t count);

struct TRITONBACKEND_Request {
  TRITONBACKEND_ModelInstance* instance;
  mh_pyref* py;
  atomic_int owners; /* the backend (until RequestRelease) and the execute call */
  atomic_bool released;
  char* id;
  uint64_t correlation_id;
  char* correlation_id_string; /* NULL when the id is an unsigned integer */
  uint32_t flags;
  uint64_t timeout_us;
  uint32_t input_count;
  TRITONBACKEND_Input* inputs;
  uint32_t output_count;
  char** output_names;
  uint32_t param_count;
  mh_param* params;
  struct TRITONBACKEND_State* states; /* made by TRITONBACKEND_StateNew (sequence.c) */
};

/* Free a request's implicit-state objects (sequence.c). */
void mh_states_free(struct TRITONBACKEND_State* states);

/* Build a backend request from a host InferenceRequest (GIL held). NULL + exception set on error. */
TRITONBACKEND_Request* mh_request_new(TRITONBACKEND_ModelInstance* instance, PyObject* request);
/* Drop one owner; the last frees the request (taking the GIL for its Python parts). */
void mh_request_unref(TRITONBACKEND_Request* request);

struct TRITONBACKEND_Output {
  char* name;
  TRITONSERVER_DataType datatype;
  int64_t* shape;
  uint32_t dims_count;
  void* buffer;
  uint64_t byte_size;
  TRITONSERVER_BufferAttributes attributes;
};

struct TRITONBACKEND_Response {
  mh_pyref* py;
  TRITONBACKEND_Model* model;
  TRITONBACKEND_Output** outputs;
  uint32_t output_count, output_capacity;
  mh_param* params;
  uint32_t param_count, param_capacity;
};

struct TRITONBACKEND_ResponseFactory {
  mh_pyref* py;
  TRITONBACKEND_Model* model;
};

/* Responses sent on the thread running an execute of a non-decoupled model wait here and
 * are handed to the host once the execute returns and the GIL is back: one GIL round trip
 * per batch instead of one per response. */
typedef struct mh_batch {
  TRITONBACKEND_Response** pending;
  uint32_t pending_count, pending_capacity;
  uint32_t* pending_flags;
  TRITONSERVER_Error** pending_errors;
} mh_batch;
extern __thread mh_batch* mh_current_batch;

/* Hand one response (and its flags, error) to the host with the GIL held; frees the response. */
void mh_deliver(TRITONBACKEND_Response* response, uint32_t flags, TRITONSERVER_Error* error);
/* Hand a flags-only response (no outputs) for the request behind `py`. */
void mh_deliver_flags(mh_pyref* py, uint32_t flags);
void mh_response_free(TRITONBACKEND_Response* response);
