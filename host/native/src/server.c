/* TRITONSERVER_*: errors, datatypes, parameters, messages, logging, buffer attributes and
 * metrics. Metrics are kept in the bridge (calls succeed and values can be read back) but are
 * not exported on the host's /metrics endpoint. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bridge.h"

char* mh_strdup(const char* s) { return strdup(s ? s : ""); }

/* --- API version --------------------------------------------------------------------- */

MH_EXPORT TRITONSERVER_Error* TRITONSERVER_ApiVersion(uint32_t* major, uint32_t* minor) {
  *major = TRITONSERVER_API_VERSION_MAJOR;
  *minor = TRITONSERVER_API_VERSION_MINOR;
  return NULL;
}

/* --- errors ---------------------------------------------------------------------------- */

TRITONSERVER_Error* mh_error(TRITONSERVER_Error_Code code, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(NULL, 0, fmt, ap);
  va_end(ap);
  TRITONSERVER_Error* e = malloc(sizeof(*e) + (size_t)n + 1);
  e->code = code;
  va_start(ap, fmt);
  vsnprintf(e->message, (size_t)n + 1, fmt, ap);
  va_end(ap);
  return e;
}

TRITONSERVER_Error* mh_unsupported(const char* function) {
  return mh_error(TRITONSERVER_ERROR_UNSUPPORTED, "%s is not supported by modelhost", function);
}

MH_EXPORT TRITONSERVER_Error* TRITONSERVER_ErrorNew(TRITONSERVER_Error_Code code, const char* msg) {
  return mh_error(code, "%s", msg ? msg : "");
}

MH_EXPORT void TRITONSERVER_ErrorDelete(TRITONSERVER_Error* error) { free(error); }

MH_EXPORT TRITONSERVER_Error_Code TRITONSERVER_ErrorCode(TRITONSERVER_Error* error) {
  return error->code;
}

MH_EXPORT const char* TRITONSERVER_ErrorCodeString(TRITONSERVER_Error* error) {
  static const char* names[] = {"Unknown",     "Internal",    "Not found",
                                "Invalid argument", "Unavailable", "Unsupported",
                                "Already exists",   "Cancelled"};
  unsigned code = (unsigned)error->code;
  return code < sizeof(names) / sizeof(names[0]) ? names[code] : "<invalid code>";
}

MH_EXPORT const char* TRITONSERVER_ErrorMessage(TRITONSERVER_Error* error) {
  return error->message;
}

/* --- datatypes, memory types, kinds ----------------------------------------------------- */

static const char* DATATYPE_NAMES[] = {"<invalid>", "BOOL", "UINT8", "UINT16", "UINT32",
                                       "UINT64",    "INT8", "INT16", "INT32",  "INT64",
                                       "FP16",      "FP32", "FP64",  "BYTES",  "BF16"};
static const uint32_t DATATYPE_SIZES[] = {0, 1, 1, 2, 4, 8, 1, 2, 4, 8, 2, 4, 8, 0, 2};
#define N_DATATYPES (sizeof(DATATYPE_NAMES) / sizeof(DATATYPE_NAMES[0]))

MH_EXPORT const char* TRITONSERVER_DataTypeString(TRITONSERVER_DataType datatype) {
  return (unsigned)datatype < N_DATATYPES ? DATATYPE_NAMES[datatype] : "<invalid>";
}

TRITONSERVER_DataType mh_datatype(const char* name) {
  for (unsigned i = 1; i < N_DATATYPES; i++)
    if (strcmp(name, DATATYPE_NAMES[i]) == 0) return (TRITONSERVER_DataType)i;
  return TRITONSERVER_TYPE_INVALID;
}

MH_EXPORT TRITONSERVER_DataType TRITONSERVER_StringToDataType(const char* dtype) {
  return dtype ? mh_datatype(dtype) : TRITONSERVER_TYPE_INVALID;
}

MH_EXPORT uint32_t TRITONSERVER_DataTypeByteSize(TRITONSERVER_DataType datatype) {
  return (unsigned)datatype < N_DATATYPES ? DATATYPE_SIZES[datatype] : 0;
}

MH_EXPORT const char* TRITONSERVER_MemoryTypeString(TRITONSERVER_MemoryType memtype) {
  switch (memtype) {
    case TRITONSERVER_MEMORY_CPU: return "CPU";
    case TRITONSERVER_MEMORY_CPU_PINNED: return "CPU_PINNED";
    case TRITONSERVER_MEMORY_GPU: return "GPU";
  }
  return "<invalid>";
}

MH_EXPORT const char* TRITONSERVER_ParameterTypeString(TRITONSERVER_ParameterType paramtype) {
  switch (paramtype) {
    case TRITONSERVER_PARAMETER_STRING: return "STRING";
    case TRITONSERVER_PARAMETER_INT: return "INT";
    case TRITONSERVER_PARAMETER_BOOL: return "BOOL";
    case TRITONSERVER_PARAMETER_DOUBLE: return "DOUBLE";
    case TRITONSERVER_PARAMETER_BYTES: return "BYTES";
  }
  return "<invalid>";
}

MH_EXPORT const char* TRITONSERVER_InstanceGroupKindString(TRITONSERVER_InstanceGroupKind kind) {
  switch (kind) {
    case TRITONSERVER_INSTANCEGROUPKIND_AUTO: return "AUTO";
    case TRITONSERVER_INSTANCEGROUPKIND_CPU: return "CPU";
    case TRITONSERVER_INSTANCEGROUPKIND_GPU: return "GPU";
    case TRITONSERVER_INSTANCEGROUPKIND_MODEL: return "MODEL";
  }
  return "<invalid>";
}

MH_EXPORT const char* TRITONSERVER_InferenceTraceLevelString(TRITONSERVER_InferenceTraceLevel level) {
  switch (level) {
    case TRITONSERVER_TRACE_LEVEL_DISABLED: return "DISABLED";
    case TRITONSERVER_TRACE_LEVEL_MIN: return "MIN";
    case TRITONSERVER_TRACE_LEVEL_MAX: return "MAX";
    case TRITONSERVER_TRACE_LEVEL_TIMESTAMPS: return "TIMESTAMPS";
    case TRITONSERVER_TRACE_LEVEL_TENSORS: return "TENSORS";
  }
  return "<unknown>";
}

MH_EXPORT const char* TRITONSERVER_InferenceTraceActivityString(
    TRITONSERVER_InferenceTraceActivity activity) {
  static const char* names[] = {"REQUEST_START",        "QUEUE_START",          "COMPUTE_START",
                                "COMPUTE_INPUT_END",    "COMPUTE_OUTPUT_START", "COMPUTE_END",
                                "REQUEST_END",          "TENSOR_QUEUE_INPUT",   "TENSOR_BACKEND_INPUT",
                                "TENSOR_BACKEND_OUTPUT", "CUSTOM_ACTIVITY"};
  unsigned a = (unsigned)activity;
  return a < sizeof(names) / sizeof(names[0]) ? names[a] : "<unknown>";
}

/* --- parameters ---------------------------------------------------------------------------- */

/* struct TRITONSERVER_Parameter: bridge.h */

MH_EXPORT TRITONSERVER_Parameter* TRITONSERVER_ParameterNew(const char* name,
                                                            const TRITONSERVER_ParameterType type,
                                                            const void* value) {
  TRITONSERVER_Parameter* p = calloc(1, sizeof(*p));
  p->name = mh_strdup(name);
  p->type = type;
  switch (type) {
    case TRITONSERVER_PARAMETER_STRING: p->value.s = mh_strdup((const char*)value); break;
    case TRITONSERVER_PARAMETER_INT: p->value.i = *(const int64_t*)value; break;
    case TRITONSERVER_PARAMETER_BOOL: p->value.b = *(const bool*)value; break;
    case TRITONSERVER_PARAMETER_DOUBLE: p->value.d = *(const double*)value; break;
    default: free(p->name); free(p); return NULL; /* BYTES: use ParameterBytesNew */
  }
  return p;
}

MH_EXPORT TRITONSERVER_Parameter* TRITONSERVER_ParameterBytesNew(const char* name,
                                                                 const void* byte_ptr,
                                                                 const uint64_t size) {
  TRITONSERVER_Parameter* p = calloc(1, sizeof(*p));
  p->name = mh_strdup(name);
  p->type = TRITONSERVER_PARAMETER_BYTES;
  p->bytes = (void*)byte_ptr; /* Triton does not copy bytes parameters either */
  p->byte_size = size;
  return p;
}

MH_EXPORT void TRITONSERVER_ParameterDelete(TRITONSERVER_Parameter* parameter) {
  if (parameter == NULL) return;
  if (parameter->type == TRITONSERVER_PARAMETER_STRING) free(parameter->value.s);
  free(parameter->name);
  free(parameter);
}

/* --- messages (JSON documents) ------------------------------------------------------------ */

TRITONSERVER_Message* mh_message(const char* json, size_t size) {
  TRITONSERVER_Message* m = malloc(sizeof(*m));
  m->json = malloc(size + 1);
  memcpy(m->json, json, size);
  m->json[size] = '\0';
  m->size = size;
  return m;
}

MH_EXPORT TRITONSERVER_Error* TRITONSERVER_MessageNewFromSerializedJson(
    TRITONSERVER_Message** message, const char* base, size_t byte_size) {
  *message = mh_message(base, byte_size);
  return NULL;
}

MH_EXPORT TRITONSERVER_Error* TRITONSERVER_MessageDelete(TRITONSERVER_Message* message) {
  if (message) {
    free(message->json);
    free(message);
  }
  return NULL;
}

MH_EXPORT TRITONSERVER_Error* TRITONSERVER_MessageSerializeToJson(TRITONSERVER_Message* message,
                                                                  const char** base,
                                                                  size_t* byte_size) {
  *base = message->json;
  *byte_size = message->size;
  return NULL;
}

/* --- logging: into the host's `logging` (host.native.bridge) ------------------------------ */

/* Which levels the host's logger lets through, set by host.native when it loads the bridge. */
int mh_log_enabled[4] = {1, 1, 1, 0};

MH_EXPORT bool TRITONSERVER_LogIsEnabled(TRITONSERVER_LogLevel level) {
  return (unsigned)level < 4 && mh_log_enabled[level];
}

MH_EXPORT TRITONSERVER_Error* TRITONSERVER_LogMessage(TRITONSERVER_LogLevel level,
                                                      const char* filename, const int line,
                                                      const char* msg) {
  if (TRITONSERVER_LogIsEnabled(level)) mh_log(level, filename, line, msg);
  return NULL;
}

/* --- buffer attributes ----------------------------------------------------------------------- */

MH_EXPORT TRITONSERVER_Error* TRITONSERVER_BufferAttributesNew(
    TRITONSERVER_BufferAttributes** buffer_attributes) {
  *buffer_attributes = calloc(1, sizeof(TRITONSERVER_BufferAttributes));
  return NULL;
}

MH_EXPORT TRITONSERVER_Error* TRITONSERVER_BufferAttributesDelete(
    TRITONSERVER_BufferAttributes* buffer_attributes) {
  free(buffer_attributes);
  return NULL;
}

MH_EXPORT TRITONSERVER_Error* TRITONSERVER_BufferAttributesSetMemoryTypeId(
    TRITONSERVER_BufferAttributes* buffer_attributes, int64_t memory_type_id) {
  buffer_attributes->memory_type_id = memory_type_id;
  return NULL;
}

MH_EXPORT TRITONSERVER_Error* TRITONSERVER_BufferAttributesSetMemoryType(
    TRITONSERVER_BufferAttributes* buffer_attributes, TRITONSERVER_MemoryType memory_type) {
  buffer_attributes->memory_type = memory_type;
  return NULL;
}

MH_EXPORT TRITONSERVER_Error* TRITONSERVER_BufferAttributesSetCudaIpcHandle(
    TRITONSERVER_BufferAttributes* buffer_attributes, void* cuda_ipc_handle) {
  buffer_attributes->cuda_ipc_handle = cuda_ipc_handle;
  return NULL;
}

MH_EXPORT TRITONSERVER_Error* TRITONSERVER_BufferAttributesSetByteSize(
    TRITONSERVER_BufferAttributes* buffer_attributes, size_t byte_size) {
  buffer_attributes->byte_size = byte_size;
  return NULL;
}

MH_EXPORT TRITONSERVER_Error* TRITONSERVER_BufferAttributesMemoryTypeId(
    TRITONSERVER_BufferAttributes* buffer_attributes, int64_t* memory_type_id) {
  *memory_type_id = buffer_attributes->memory_type_id;
  return NULL;
}

MH_EXPORT TRITONSERVER_Error* TRITONSERVER_BufferAttributesMemoryType(
    TRITONSERVER_BufferAttributes* buffer_attributes, TRITONSERVER_MemoryType* memory_type) {
  *memory_type = buffer_attributes->memory_type;
  return NULL;
}

MH_EXPORT TRITONSERVER_Error* TRITONSERVER_BufferAttributesCudaIpcHandle(
    TRITONSERVER_BufferAttributes* buffer_attributes, void** cuda_ipc_handle) {
  *cuda_ipc_handle = buffer_attributes->cuda_ipc_handle;
  return NULL;
}

MH_EXPORT TRITONSERVER_Error* TRITONSERVER_BufferAttributesByteSize(
    TRITONSERVER_BufferAttributes* buffer_attributes, size_t* byte_size) {
  *byte_size = buffer_attributes->byte_size;
  return NULL;
}

/* --- metrics: kept here, and exported with the host's metrics ----------------------------------
 *
 * Families and their metrics live in one registry that host.native.metrics reads at scrape time
 * (`metrics()` in the module). Counters and gauges are exported; a histogram keeps only the sum
 * of its observations and is not exported. */

struct TRITONSERVER_Metric {
  TRITONSERVER_MetricFamily* family;
  pthread_mutex_t lock;
  double value;
  char** label_keys;
  char** label_values;
  uint64_t label_count;
  TRITONSERVER_Metric* next;
};

struct TRITONSERVER_MetricFamily {
  TRITONSERVER_MetricKind kind;
  char* name;
  char* description;
  TRITONSERVER_Metric* metrics;
  TRITONSERVER_MetricFamily* next;
};

struct TRITONSERVER_MetricArgs {
  int histogram;
};

static pthread_mutex_t metrics_lock = PTHREAD_MUTEX_INITIALIZER;
static TRITONSERVER_MetricFamily* families;

MH_EXPORT TRITONSERVER_Error* TRITONSERVER_MetricFamilyNew(TRITONSERVER_MetricFamily** family,
                                                           const TRITONSERVER_MetricKind kind,
                                                           const char* name,
                                                           const char* description) {
  TRITONSERVER_MetricFamily* f = calloc(1, sizeof(*f));
  f->kind = kind;
  f->name = mh_strdup(name);
  f->description = mh_strdup(description);
  pthread_mutex_lock(&metrics_lock);
  f->next = families;
  families = f;
  pthread_mutex_unlock(&metrics_lock);
  *family = f;
  return NULL;
}

MH_EXPORT TRITONSERVER_Error* TRITONSERVER_MetricFamilyDelete(TRITONSERVER_MetricFamily* family) {
  if (family == NULL) return NULL;
  pthread_mutex_lock(&metrics_lock);
  if (family->metrics != NULL) {
    pthread_mutex_unlock(&metrics_lock);
    return mh_error(TRITONSERVER_ERROR_INVALID_ARG,
                    "Must call MetricDelete on all dependent metrics before calling "
                    "MetricFamilyDelete.");
  }
  for (TRITONSERVER_MetricFamily** p = &families; *p; p = &(*p)->next) {
    if (*p == family) {
      *p = family->next;
      break;
    }
  }
  pthread_mutex_unlock(&metrics_lock);
  free(family->name);
  free(family->description);
  free(family);
  return NULL;
}

MH_EXPORT TRITONSERVER_Error* TRITONSERVER_GetMetricFamilyKind(TRITONSERVER_MetricFamily* family,
                                                               TRITONSERVER_MetricKind* kind) {
  *kind = family->kind;
  return NULL;
}

MH_EXPORT TRITONSERVER_Error* TRITONSERVER_MetricArgsNew(TRITONSERVER_MetricArgs** args) {
  *args = calloc(1, sizeof(TRITONSERVER_MetricArgs));
  return NULL;
}

MH_EXPORT TRITONSERVER_Error* TRITONSERVER_MetricArgsSetHistogram(TRITONSERVER_MetricArgs* args,
                                                                  const double* buckets,
                                                                  const uint64_t buckets_count) {
  (void)buckets;
  (void)buckets_count;
  args->histogram = 1;
  return NULL;
}

MH_EXPORT TRITONSERVER_Error* TRITONSERVER_MetricArgsDelete(TRITONSERVER_MetricArgs* args) {
  free(args);
  return NULL;
}

MH_EXPORT TRITONSERVER_Error* TRITONSERVER_MetricNew(TRITONSERVER_Metric** metric,
                                                     TRITONSERVER_MetricFamily* family,
                                                     const TRITONSERVER_Parameter** labels,
                                                     const uint64_t label_count) {
  if (family == NULL) return mh_error(TRITONSERVER_ERROR_INVALID_ARG, "metric family is null");
  TRITONSERVER_Metric* m = calloc(1, sizeof(*m));
  m->family = family;
  pthread_mutex_init(&m->lock, NULL);
  m->label_keys = calloc(label_count ? label_count : 1, sizeof(char*));
  m->label_values = calloc(label_count ? label_count : 1, sizeof(char*));
  for (uint64_t i = 0; i < label_count; i++) {
    const TRITONSERVER_Parameter* p = labels[i];
    if (p == NULL) continue;
    m->label_keys[m->label_count] = mh_strdup(p->name);
    m->label_values[m->label_count] =
        mh_strdup(p->type == TRITONSERVER_PARAMETER_STRING ? p->value.s : "");
    m->label_count++;
  }
  pthread_mutex_lock(&metrics_lock);
  m->next = family->metrics;
  family->metrics = m;
  pthread_mutex_unlock(&metrics_lock);
  *metric = m;
  return NULL;
}

MH_EXPORT TRITONSERVER_Error* TRITONSERVER_MetricNewWithArgs(TRITONSERVER_Metric** metric,
                                                             TRITONSERVER_MetricFamily* family,
                                                             const TRITONSERVER_Parameter** labels,
                                                             const uint64_t label_count,
                                                             const TRITONSERVER_MetricArgs* args) {
  (void)args;
  return TRITONSERVER_MetricNew(metric, family, labels, label_count);
}

MH_EXPORT TRITONSERVER_Error* TRITONSERVER_MetricDelete(TRITONSERVER_Metric* metric) {
  if (metric == NULL) return NULL;
  pthread_mutex_lock(&metrics_lock);
  for (TRITONSERVER_Metric** p = &metric->family->metrics; *p; p = &(*p)->next) {
    if (*p == metric) {
      *p = metric->next;
      break;
    }
  }
  pthread_mutex_unlock(&metrics_lock);
  for (uint64_t i = 0; i < metric->label_count; i++) {
    free(metric->label_keys[i]);
    free(metric->label_values[i]);
  }
  free(metric->label_keys);
  free(metric->label_values);
  pthread_mutex_destroy(&metric->lock);
  free(metric);
  return NULL;
}

MH_EXPORT TRITONSERVER_Error* TRITONSERVER_MetricValue(TRITONSERVER_Metric* metric, double* value) {
  if (metric->family->kind == TRITONSERVER_METRIC_KIND_HISTOGRAM)
    return mh_error(TRITONSERVER_ERROR_UNSUPPORTED, "a histogram has no single value");
  pthread_mutex_lock(&metric->lock);
  *value = metric->value;
  pthread_mutex_unlock(&metric->lock);
  return NULL;
}

MH_EXPORT TRITONSERVER_Error* TRITONSERVER_MetricIncrement(TRITONSERVER_Metric* metric,
                                                           double value) {
  if (metric->family->kind == TRITONSERVER_METRIC_KIND_COUNTER && value < 0)
    return mh_error(TRITONSERVER_ERROR_INVALID_ARG, "a counter cannot be decremented");
  if (metric->family->kind == TRITONSERVER_METRIC_KIND_HISTOGRAM)
    return mh_error(TRITONSERVER_ERROR_UNSUPPORTED, "use TRITONSERVER_MetricObserve for a histogram");
  pthread_mutex_lock(&metric->lock);
  metric->value += value;
  pthread_mutex_unlock(&metric->lock);
  return NULL;
}

MH_EXPORT TRITONSERVER_Error* TRITONSERVER_MetricSet(TRITONSERVER_Metric* metric, double value) {
  if (metric->family->kind != TRITONSERVER_METRIC_KIND_GAUGE)
    return mh_error(TRITONSERVER_ERROR_UNSUPPORTED, "only a gauge can be set");
  pthread_mutex_lock(&metric->lock);
  metric->value = value;
  pthread_mutex_unlock(&metric->lock);
  return NULL;
}

MH_EXPORT TRITONSERVER_Error* TRITONSERVER_MetricObserve(TRITONSERVER_Metric* metric,
                                                         double value) {
  if (metric->family->kind != TRITONSERVER_METRIC_KIND_HISTOGRAM)
    return mh_error(TRITONSERVER_ERROR_UNSUPPORTED, "only a histogram can observe");
  pthread_mutex_lock(&metric->lock);
  metric->value += value; /* the sum of observations */
  pthread_mutex_unlock(&metric->lock);
  return NULL;
}

MH_EXPORT TRITONSERVER_Error* TRITONSERVER_GetMetricKind(TRITONSERVER_Metric* metric,
                                                         TRITONSERVER_MetricKind* kind) {
  *kind = metric->family->kind;
  return NULL;
}

/* [(name, description, "counter" | "gauge", [({label: value}, value), ...]), ...] (GIL held). */
PyObject* mh_metrics_snapshot(void) {
  PyObject* out = PyList_New(0);
  pthread_mutex_lock(&metrics_lock);
  for (TRITONSERVER_MetricFamily* f = families; out && f; f = f->next) {
    if (f->kind == TRITONSERVER_METRIC_KIND_HISTOGRAM) continue;
    PyObject* samples = PyList_New(0);
    for (TRITONSERVER_Metric* m = f->metrics; samples && m; m = m->next) {
      PyObject* labels = PyDict_New();
      for (uint64_t i = 0; labels && i < m->label_count; i++) {
        PyObject* v = PyUnicode_FromString(m->label_values[i]);
        if (v) PyDict_SetItemString(labels, m->label_keys[i], v);
        Py_XDECREF(v);
      }
      pthread_mutex_lock(&m->lock);
      double value = m->value;
      pthread_mutex_unlock(&m->lock);
      PyObject* item = labels ? Py_BuildValue("(Nd)", labels, value) : NULL;
      if (item == NULL || PyList_Append(samples, item) != 0) Py_CLEAR(samples);
      Py_XDECREF(item);
    }
    const char* kind = f->kind == TRITONSERVER_METRIC_KIND_COUNTER ? "counter" : "gauge";
    PyObject* row = samples ? Py_BuildValue("(sssN)", f->name, f->description, kind, samples) : NULL;
    if (row == NULL || PyList_Append(out, row) != 0) Py_CLEAR(out);
    Py_XDECREF(row);
  }
  pthread_mutex_unlock(&metrics_lock);
  return out;
}
