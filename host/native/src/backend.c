/* TRITONBACKEND_*: the backend, model and instance objects, memory manager, backend
 * attributes and statistics reporting. The objects are made and driven by module.c. */
#include <stdlib.h>
#include <string.h>

#include "bridge.h"

MH_EXPORT TRITONSERVER_Error* TRITONBACKEND_ApiVersion(uint32_t* major, uint32_t* minor) {
  *major = TRITONBACKEND_API_VERSION_MAJOR;
  *minor = TRITONBACKEND_API_VERSION_MINOR;
  return NULL;
}

/* --- memory manager: host memory only ------------------------------------------------------ */

struct TRITONBACKEND_MemoryManager {
  int unused;
};
static TRITONBACKEND_MemoryManager the_memory_manager;

MH_EXPORT TRITONSERVER_Error* TRITONBACKEND_MemoryManagerAllocate(
    TRITONBACKEND_MemoryManager* manager, void** buffer, const TRITONSERVER_MemoryType memory_type,
    const int64_t memory_type_id, const uint64_t byte_size) {
  (void)manager;
  (void)memory_type_id;
  if (memory_type == TRITONSERVER_MEMORY_GPU)
    return mh_error(TRITONSERVER_ERROR_UNSUPPORTED,
                    "GPU memory is not available from modelhost's memory manager");
  *buffer = malloc(byte_size ? byte_size : 1);
  if (*buffer == NULL)
    return mh_error(TRITONSERVER_ERROR_UNAVAILABLE, "out of memory allocating %llu bytes",
                    (unsigned long long)byte_size);
  return NULL;
}

MH_EXPORT TRITONSERVER_Error* TRITONBACKEND_MemoryManagerFree(
    TRITONBACKEND_MemoryManager* manager, void* buffer, const TRITONSERVER_MemoryType memory_type,
    const int64_t memory_type_id) {
  (void)manager;
  (void)memory_type_id;
  if (memory_type == TRITONSERVER_MEMORY_GPU)
    return mh_error(TRITONSERVER_ERROR_UNSUPPORTED,
                    "GPU memory is not available from modelhost's memory manager");
  free(buffer);
  return NULL;
}

/* --- backend --------------------------------------------------------------------------------- */

MH_EXPORT TRITONSERVER_Error* TRITONBACKEND_BackendName(TRITONBACKEND_Backend* backend,
                                                        const char** name) {
  *name = backend->name;
  return NULL;
}

MH_EXPORT TRITONSERVER_Error* TRITONBACKEND_BackendConfig(TRITONBACKEND_Backend* backend,
                                                          TRITONSERVER_Message** backend_config) {
  *backend_config = mh_message(backend->config_json, strlen(backend->config_json));
  return NULL;
}

MH_EXPORT TRITONSERVER_Error* TRITONBACKEND_BackendExecutionPolicy(
    TRITONBACKEND_Backend* backend, TRITONBACKEND_ExecutionPolicy* policy) {
  *policy = backend->policy;
  return NULL;
}

/* Recorded; the host's schedulers run every instance on its own thread either way. */
MH_EXPORT TRITONSERVER_Error* TRITONBACKEND_BackendSetExecutionPolicy(
    TRITONBACKEND_Backend* backend, TRITONBACKEND_ExecutionPolicy policy) {
  backend->policy = policy;
  return NULL;
}

MH_EXPORT TRITONSERVER_Error* TRITONBACKEND_BackendArtifacts(
    TRITONBACKEND_Backend* backend, TRITONBACKEND_ArtifactType* artifact_type,
    const char** location) {
  *artifact_type = TRITONBACKEND_ARTIFACT_FILESYSTEM;
  *location = backend->location;
  return NULL;
}

MH_EXPORT TRITONSERVER_Error* TRITONBACKEND_BackendMemoryManager(
    TRITONBACKEND_Backend* backend, TRITONBACKEND_MemoryManager** manager) {
  (void)backend;
  *manager = &the_memory_manager;
  return NULL;
}

MH_EXPORT TRITONSERVER_Error* TRITONBACKEND_BackendState(TRITONBACKEND_Backend* backend,
                                                         void** state) {
  *state = backend->state;
  return NULL;
}

MH_EXPORT TRITONSERVER_Error* TRITONBACKEND_BackendSetState(TRITONBACKEND_Backend* backend,
                                                            void* state) {
  backend->state = state;
  return NULL;
}

/* --- backend attributes ---------------------------------------------------------------------- */

MH_EXPORT TRITONSERVER_Error* TRITONBACKEND_BackendAttributeAddPreferredInstanceGroup(
    TRITONBACKEND_BackendAttribute* backend_attributes, const TRITONSERVER_InstanceGroupKind kind,
    const uint64_t count, const uint64_t* device_ids, const uint64_t id_count) {
  if (backend_attributes->group_count >= MH_MAX_PREFERRED_GROUPS)
    return mh_error(TRITONSERVER_ERROR_UNSUPPORTED, "at most %d preferred instance groups",
                    MH_MAX_PREFERRED_GROUPS);
  mh_preferred_group* g = &backend_attributes->groups[backend_attributes->group_count++];
  g->kind = kind;
  g->count = count;
  g->id_count = id_count < 8 ? id_count : 8;
  for (uint64_t i = 0; i < g->id_count; i++) g->device_ids[i] = device_ids[i];
  return NULL;
}

MH_EXPORT TRITONSERVER_Error* TRITONBACKEND_BackendAttributeSetParallelModelInstanceLoading(
    TRITONBACKEND_BackendAttribute* backend_attributes, bool enabled) {
  backend_attributes->parallel_instance_loading = enabled;
  return NULL;
}

/* --- model ------------------------------------------------------------------------------------ */

MH_EXPORT TRITONSERVER_Error* TRITONBACKEND_ModelName(TRITONBACKEND_Model* model,
                                                      const char** name) {
  *name = model->name;
  return NULL;
}

MH_EXPORT TRITONSERVER_Error* TRITONBACKEND_ModelVersion(TRITONBACKEND_Model* model,
                                                         uint64_t* version) {
  *version = model->version;
  return NULL;
}

MH_EXPORT TRITONSERVER_Error* TRITONBACKEND_ModelRepository(TRITONBACKEND_Model* model,
                                                            TRITONBACKEND_ArtifactType* artifact_type,
                                                            const char** location) {
  *artifact_type = TRITONBACKEND_ARTIFACT_FILESYSTEM;
  *location = model->repository;
  return NULL;
}

MH_EXPORT TRITONSERVER_Error* TRITONBACKEND_ModelConfig(TRITONBACKEND_Model* model,
                                                        const uint32_t config_version,
                                                        TRITONSERVER_Message** model_config) {
  if (config_version != 1)
    return mh_error(TRITONSERVER_ERROR_UNSUPPORTED,
                    "model configuration version %u is not supported (only version 1)",
                    config_version);
  pthread_mutex_lock(&model->lock);
  *model_config = mh_message(model->config_json, model->config_size);
  pthread_mutex_unlock(&model->lock);
  return NULL;
}

/* The host completes configurations before a model loads; backends are not asked to. */
MH_EXPORT TRITONSERVER_Error* TRITONBACKEND_ModelAutoCompleteConfig(TRITONBACKEND_Model* model,
                                                                    bool* auto_complete_config) {
  (void)model;
  *auto_complete_config = false;
  return NULL;
}

MH_EXPORT TRITONSERVER_Error* TRITONBACKEND_ModelSetConfig(TRITONBACKEND_Model* model,
                                                           const uint32_t config_version,
                                                           TRITONSERVER_Message* model_config) {
  if (config_version != 1)
    return mh_error(TRITONSERVER_ERROR_UNSUPPORTED,
                    "model configuration version %u is not supported (only version 1)",
                    config_version);
  char* copy = malloc(model_config->size + 1);
  memcpy(copy, model_config->json, model_config->size + 1);
  pthread_mutex_lock(&model->lock);
  free(model->config_json);
  model->config_json = copy;
  model->config_size = model_config->size;
  pthread_mutex_unlock(&model->lock);
  return NULL;
}

/* A backend may hold the server handle; the in-process server API (BLS) is unsupported. */
struct TRITONSERVER_Server {
  int unused;
};
static TRITONSERVER_Server the_server;

MH_EXPORT TRITONSERVER_Error* TRITONBACKEND_ModelServer(TRITONBACKEND_Model* model,
                                                        TRITONSERVER_Server** server) {
  (void)model;
  *server = &the_server;
  return NULL;
}

MH_EXPORT TRITONSERVER_Error* TRITONBACKEND_ModelBackend(TRITONBACKEND_Model* model,
                                                         TRITONBACKEND_Backend** backend) {
  *backend = model->backend;
  return NULL;
}

MH_EXPORT TRITONSERVER_Error* TRITONBACKEND_ModelState(TRITONBACKEND_Model* model, void** state) {
  *state = model->state;
  return NULL;
}

MH_EXPORT TRITONSERVER_Error* TRITONBACKEND_ModelSetState(TRITONBACKEND_Model* model, void* state) {
  model->state = state;
  return NULL;
}

/* Accepted and not reported: the host's statistics have no memory-usage entries yet. */
MH_EXPORT TRITONSERVER_Error* TRITONBACKEND_ModelReportMemoryUsage(
    TRITONBACKEND_Model* model, TRITONSERVER_BufferAttributes** usage, uint32_t usage_size) {
  (void)model;
  (void)usage;
  (void)usage_size;
  return NULL;
}

/* --- model instance ---------------------------------------------------------------------------- */

MH_EXPORT TRITONSERVER_Error* TRITONBACKEND_ModelInstanceName(TRITONBACKEND_ModelInstance* instance,
                                                              const char** name) {
  *name = instance->name;
  return NULL;
}

MH_EXPORT TRITONSERVER_Error* TRITONBACKEND_ModelInstanceKind(TRITONBACKEND_ModelInstance* instance,
                                                              TRITONSERVER_InstanceGroupKind* kind) {
  *kind = instance->kind;
  return NULL;
}

MH_EXPORT TRITONSERVER_Error* TRITONBACKEND_ModelInstanceDeviceId(
    TRITONBACKEND_ModelInstance* instance, int32_t* device_id) {
  *device_id = instance->device_id;
  return NULL;
}

MH_EXPORT TRITONSERVER_Error* TRITONBACKEND_ModelInstanceHostPolicy(
    TRITONBACKEND_ModelInstance* instance, TRITONSERVER_Message** host_policy) {
  /* Triton's shape: {"<policy name>": {settings}}; the host has no policy settings. */
  size_t n = strlen(instance->host_policy) + 16;
  char* json = malloc(n);
  int len = snprintf(json, n, "{\"%s\":{}}", instance->host_policy);
  *host_policy = mh_message(json, (size_t)len);
  free(json);
  return NULL;
}

MH_EXPORT TRITONSERVER_Error* TRITONBACKEND_ModelInstanceIsPassive(
    TRITONBACKEND_ModelInstance* instance, bool* is_passive) {
  *is_passive = instance->passive;
  return NULL;
}

MH_EXPORT TRITONSERVER_Error* TRITONBACKEND_ModelInstanceProfileCount(
    TRITONBACKEND_ModelInstance* instance, uint32_t* count) {
  (void)instance;
  *count = 0;
  return NULL;
}

MH_EXPORT TRITONSERVER_Error* TRITONBACKEND_ModelInstanceProfileName(
    TRITONBACKEND_ModelInstance* instance, const uint32_t index, const char** profile_name) {
  (void)instance;
  (void)profile_name;
  return mh_error(TRITONSERVER_ERROR_INVALID_ARG, "instance has no profile %u", index);
}

MH_EXPORT TRITONSERVER_Error* TRITONBACKEND_ModelInstanceSecondaryDeviceCount(
    TRITONBACKEND_ModelInstance* instance, uint32_t* count) {
  (void)instance;
  *count = 0;
  return NULL;
}

MH_EXPORT TRITONSERVER_Error* TRITONBACKEND_ModelInstanceSecondaryDeviceProperties(
    TRITONBACKEND_ModelInstance* instance, uint32_t index, const char** kind, int64_t* id) {
  (void)instance;
  (void)kind;
  (void)id;
  return mh_error(TRITONSERVER_ERROR_INVALID_ARG, "instance has no secondary device %u", index);
}

MH_EXPORT TRITONSERVER_Error* TRITONBACKEND_ModelInstanceModel(TRITONBACKEND_ModelInstance* instance,
                                                               TRITONBACKEND_Model** model) {
  *model = instance->model;
  return NULL;
}

MH_EXPORT TRITONSERVER_Error* TRITONBACKEND_ModelInstanceState(TRITONBACKEND_ModelInstance* instance,
                                                               void** state) {
  *state = instance->state;
  return NULL;
}

MH_EXPORT TRITONSERVER_Error* TRITONBACKEND_ModelInstanceSetState(
    TRITONBACKEND_ModelInstance* instance, void* state) {
  instance->state = state;
  return NULL;
}

MH_EXPORT TRITONSERVER_Error* TRITONBACKEND_ModelInstanceReportMemoryUsage(
    TRITONBACKEND_ModelInstance* instance, TRITONSERVER_BufferAttributes** usage,
    uint32_t usage_size) {
  (void)instance;
  (void)usage;
  (void)usage_size;
  return NULL;
}

/* --- statistics: collected per execute, read back by the host (host.stats) ------------------- */

static uint64_t span(uint64_t from, uint64_t to) { return to > from ? to - from : 0; }

MH_EXPORT TRITONSERVER_Error* TRITONBACKEND_ModelInstanceReportStatistics(
    TRITONBACKEND_ModelInstance* instance, TRITONBACKEND_Request* request, const bool success,
    const uint64_t exec_start_ns, const uint64_t compute_start_ns, const uint64_t compute_end_ns,
    const uint64_t exec_end_ns) {
  (void)request;
  if (!success) return NULL; /* Triton counts compute times of successful requests only */
  pthread_mutex_lock(&instance->stats_lock);
  mh_reported* r = &instance->reported;
  r->requests++;
  r->input_ns += span(exec_start_ns, compute_start_ns);
  r->infer_ns += span(compute_start_ns, compute_end_ns);
  r->output_ns += span(compute_end_ns, exec_end_ns);
  pthread_mutex_unlock(&instance->stats_lock);
  return NULL;
}

MH_EXPORT TRITONSERVER_Error* TRITONBACKEND_ModelInstanceReportBatchStatistics(
    TRITONBACKEND_ModelInstance* instance, const uint64_t batch_size, const uint64_t exec_start_ns,
    const uint64_t compute_start_ns, const uint64_t compute_end_ns, const uint64_t exec_end_ns) {
  (void)batch_size; /* the host counts the rows of the batch it scheduled */
  pthread_mutex_lock(&instance->stats_lock);
  mh_reported* r = &instance->reported;
  r->batch = true;
  r->batch_input_ns = span(exec_start_ns, compute_start_ns);
  r->batch_infer_ns = span(compute_start_ns, compute_end_ns);
  r->batch_output_ns = span(compute_end_ns, exec_end_ns);
  pthread_mutex_unlock(&instance->stats_lock);
  return NULL;
}

/* Per-response statistics (decoupled models), kept by response index of the request as
 * Triton's InferenceStatsAggregator keeps them (success, fail, empty_response, cancel). */
struct TRITONBACKEND_ModelInstanceResponseStatistics {
  TRITONBACKEND_ModelInstance* instance;
  TRITONBACKEND_ResponseFactory* factory;
  uint64_t response_start, compute_output_start, response_end;
  TRITONSERVER_Error* error;
};

MH_EXPORT TRITONSERVER_Error* TRITONBACKEND_ModelInstanceResponseStatisticsNew(
    TRITONBACKEND_ModelInstanceResponseStatistics** response_statistics) {
  *response_statistics = calloc(1, sizeof(TRITONBACKEND_ModelInstanceResponseStatistics));
  return NULL;
}

MH_EXPORT TRITONSERVER_Error* TRITONBACKEND_ModelInstanceResponseStatisticsDelete(
    TRITONBACKEND_ModelInstanceResponseStatistics* response_statistics) {
  free(response_statistics);
  return NULL;
}

MH_EXPORT TRITONSERVER_Error* TRITONBACKEND_ModelInstanceResponseStatisticsSetModelInstance(
    TRITONBACKEND_ModelInstanceResponseStatistics* response_statistics,
    TRITONBACKEND_ModelInstance* model_instance) {
  response_statistics->instance = model_instance;
  return NULL;
}

MH_EXPORT TRITONSERVER_Error* TRITONBACKEND_ModelInstanceResponseStatisticsSetResponseFactory(
    TRITONBACKEND_ModelInstanceResponseStatistics* response_statistics,
    TRITONBACKEND_ResponseFactory* response_factory) {
  response_statistics->factory = response_factory;
  return NULL;
}

MH_EXPORT TRITONSERVER_Error* TRITONBACKEND_ModelInstanceResponseStatisticsSetResponseStart(
    TRITONBACKEND_ModelInstanceResponseStatistics* response_statistics, uint64_t response_start) {
  response_statistics->response_start = response_start;
  return NULL;
}

MH_EXPORT TRITONSERVER_Error* TRITONBACKEND_ModelInstanceResponseStatisticsSetComputeOutputStart(
    TRITONBACKEND_ModelInstanceResponseStatistics* response_statistics,
    uint64_t compute_output_start) {
  response_statistics->compute_output_start = compute_output_start;
  return NULL;
}

MH_EXPORT TRITONSERVER_Error* TRITONBACKEND_ModelInstanceResponseStatisticsSetResponseEnd(
    TRITONBACKEND_ModelInstanceResponseStatistics* response_statistics, uint64_t response_end) {
  response_statistics->response_end = response_end;
  return NULL;
}

MH_EXPORT TRITONSERVER_Error* TRITONBACKEND_ModelInstanceResponseStatisticsSetError(
    TRITONBACKEND_ModelInstanceResponseStatistics* response_statistics, TRITONSERVER_Error* error) {
  response_statistics->error = error;
  return NULL;
}

static TRITONSERVER_Error* invalid(const char* message) {
  return TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_INVALID_ARG, message);
}

MH_EXPORT TRITONSERVER_Error* TRITONBACKEND_ModelInstanceReportResponseStatistics(
    TRITONBACKEND_ModelInstanceResponseStatistics* response_statistics) {
  const TRITONBACKEND_ModelInstanceResponseStatistics* rs = response_statistics;
  if (rs->instance == NULL || rs->factory == NULL)
    return invalid("response statistics need a model instance and a response factory");
  const uint64_t start = rs->response_start, output = rs->compute_output_start,
                 end = rs->response_end;
  mh_response_stat stat = {0};
  if (rs->error == NULL && output > 0) {
    if (start > output) return invalid("Response start cannot happen after compute output start");
    if (output > end) return invalid("Compute output start cannot happen after response end");
    stat.kind = MH_RESPONSE_SUCCESS;
    stat.infer_ns = output - start;
    stat.output_ns = end - output;
    stat.has_infer = stat.has_output = true;
  } else if (rs->error == NULL) {
    if (start > end) return invalid("Response start cannot happen after response end");
    stat.kind = MH_RESPONSE_EMPTY;
    stat.infer_ns = end - start;
    stat.has_infer = true;
  } else if (TRITONSERVER_ErrorCode(rs->error) == TRITONSERVER_ERROR_CANCELLED) {
    if (start > end) return invalid("Response start cannot happen after response end");
    stat.kind = MH_RESPONSE_CANCEL;
  } else if (output > 0) {
    if (start > output) return invalid("Response start cannot happen after compute output start");
    if (output > end) return invalid("Compute output start cannot happen after response end");
    stat.kind = MH_RESPONSE_FAIL;
    stat.infer_ns = output - start;
    stat.output_ns = end - output;
    stat.has_infer = true;
    stat.has_output = stat.output_ns > 0;
  } else {
    if (start > end) return invalid("Response start cannot happen after response end");
    stat.kind = MH_RESPONSE_FAIL;
    stat.infer_ns = end - start;
    stat.has_infer = true;
  }
  stat.total_ns = end - start;
  stat.index = atomic_fetch_add(&rs->factory->py->response_index, 1);
  TRITONBACKEND_ModelInstance* i = rs->instance;
  pthread_mutex_lock(&i->stats_lock);
  if (i->responses_len == i->responses_cap) {
    size_t cap = i->responses_cap ? i->responses_cap * 2 : 16;
    mh_response_stat* grown = realloc(i->responses, cap * sizeof(*grown));
    if (grown == NULL) {
      pthread_mutex_unlock(&i->stats_lock);
      return TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_INTERNAL, "out of memory");
    }
    i->responses = grown;
    i->responses_cap = cap;
  }
  i->responses[i->responses_len++] = stat;
  pthread_mutex_unlock(&i->stats_lock);
  return NULL;
}
