/* Test custom batching strategy (Triton's TRITONBACKEND_ModelBatch* / ModelBatcher* functions),
 * used by tests/test_custom_batching.py.
 *
 * A batch holds at most STRATEGY_LIMIT bytes of input data (model config parameter; the sizes
 * come from TRITONBACKEND_RequestInputCount / RequestInputByIndex / InputProperties). Every call
 * appends a line to the file named by the parameter STRATEGY_LOG. STRATEGY_FAIL makes one
 * function fail: "batcher_init" (the model load fails), "include", "batch_init", "batch_fini".
 * Build flags: -DSTRATEGY_TAG=\"...\" names the build in the log; -DSTRATEGY_PARTIAL leaves out
 * TRITONBACKEND_ModelBatchFinalize. */
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "triton/core/tritonbackend.h"

#ifndef STRATEGY_TAG
#define STRATEGY_TAG "default"
#endif

typedef struct {
  char model[128];
  char log[1024];
  char fail[64];
  unsigned long limit;
} batcher_t;

typedef struct {
  const batcher_t* batcher;
  unsigned long remaining;
} batch_t;

static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;

static void note(const batcher_t* b, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
static void note(const batcher_t* b, const char* fmt, ...) {
  if (b->log[0] == '\0') return;
  pthread_mutex_lock(&log_lock);
  FILE* f = fopen(b->log, "a");
  if (f != NULL) {
    va_list args;
    va_start(args, fmt);
    vfprintf(f, fmt, args);
    va_end(args);
    fputc('\n', f);
    fclose(f);
  }
  pthread_mutex_unlock(&log_lock);
}

/* The string_value of parameter `key` in the model configuration JSON ("" when absent). */
static void param(const char* json, const char* key, char* out, size_t size) {
  out[0] = '\0';
  char quoted[128];
  snprintf(quoted, sizeof(quoted), "\"%s\"", key);
  const char* p = strstr(json, quoted);
  if (p == NULL || (p = strstr(p, "\"string_value\"")) == NULL) return;
  p = strchr(p + strlen("\"string_value\""), '"');
  if (p == NULL) return;
  p++;
  size_t n = 0;
  while (p[n] != '\0' && p[n] != '"' && n + 1 < size) n++;
  memcpy(out, p, n);
  out[n] = '\0';
}

TRITONSERVER_Error* TRITONBACKEND_ModelBatcherInitialize(TRITONBACKEND_Batcher** batcher,
                                                         TRITONBACKEND_Model* model) {
  TRITONSERVER_Message* message;
  TRITONSERVER_Error* err = TRITONBACKEND_ModelConfig(model, 1, &message);
  if (err != NULL) return err;
  const char* json;
  size_t size;
  err = TRITONSERVER_MessageSerializeToJson(message, &json, &size);
  if (err != NULL) return err;
  batcher_t* b = calloc(1, sizeof(*b));
  char limit[64];
  param(json, "STRATEGY_LOG", b->log, sizeof(b->log));
  param(json, "STRATEGY_FAIL", b->fail, sizeof(b->fail));
  param(json, "STRATEGY_LIMIT", limit, sizeof(limit));
  TRITONSERVER_MessageDelete(message);
  b->limit = strtoul(limit, NULL, 10);
  const char* name = "";
  TRITONBACKEND_ModelName(model, &name);
  snprintf(b->model, sizeof(b->model), "%s", name);
  note(b, "batcher_init %s tag=" STRATEGY_TAG " limit=%lu", b->model, b->limit);
  if (strcmp(b->fail, "batcher_init") == 0) {
    free(b);
    return TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_NOT_FOUND, "test strategy refuses the model");
  }
  *batcher = (TRITONBACKEND_Batcher*)b;
  return NULL;
}

TRITONSERVER_Error* TRITONBACKEND_ModelBatcherFinalize(TRITONBACKEND_Batcher* batcher) {
  batcher_t* b = (batcher_t*)batcher;
  note(b, "batcher_fini %s", b->model);
  free(b);
  return NULL;
}

TRITONSERVER_Error* TRITONBACKEND_ModelBatchInitialize(const TRITONBACKEND_Batcher* batcher,
                                                       void** userp) {
  const batcher_t* b = (const batcher_t*)batcher;
  batch_t* batch = malloc(sizeof(*batch));
  batch->batcher = b;
  batch->remaining = b->limit;
  *userp = batch;
  note(b, "batch_init");
  if (strcmp(b->fail, "batch_init") == 0)
    return TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_INTERNAL, "test strategy batch_init failed");
  return NULL;
}

TRITONSERVER_Error* TRITONBACKEND_ModelBatchIncludeRequest(TRITONBACKEND_Request* request,
                                                           void* userp, bool* should_include) {
  *should_include = false;
  batch_t* batch = userp;
  const batcher_t* b = batch->batcher;
  uint32_t count;
  TRITONSERVER_Error* err = TRITONBACKEND_RequestInputCount(request, &count);
  if (err != NULL) return err;
  unsigned long bytes = 0;
  for (uint32_t i = 0; i < count; i++) {
    TRITONBACKEND_Input* input;
    err = TRITONBACKEND_RequestInputByIndex(request, i, &input);
    if (err != NULL) return err;
    uint64_t size;
    err = TRITONBACKEND_InputProperties(input, NULL, NULL, NULL, NULL, &size, NULL);
    if (err != NULL) return err;
    bytes += size;
  }
  const char* id = "";
  TRITONBACKEND_RequestId(request, &id);
  if (strcmp(b->fail, "include") == 0) {
    note(b, "include %s bytes=%lu -> error", id, bytes);
    return TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_INTERNAL, "test strategy include failed");
  }
  *should_include = bytes <= batch->remaining;
  if (*should_include) batch->remaining -= bytes;
  note(b, "include %s bytes=%lu -> %s", id, bytes, *should_include ? "yes" : "no");
  return NULL;
}

#ifndef STRATEGY_PARTIAL
TRITONSERVER_Error* TRITONBACKEND_ModelBatchFinalize(void* userp) {
  batch_t* batch = userp;
  const batcher_t* b = batch->batcher;
  free(batch);
  note(b, "batch_fini");
  if (strcmp(b->fail, "batch_fini") == 0)
    return TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_INTERNAL, "test strategy batch_fini failed");
  return NULL;
}
#endif
