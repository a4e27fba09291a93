/* Test cache "small": at most `max_entries` entries (a required setting, given as a JSON string
 * as Triton passes every --cache-config value), oldest evicted first. Every call is recorded in
 * the MODELHOST_TEST_EVENTS file (initialize, insert, lookup hit/miss, finalize). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "triton/core/tritoncache.h"

typedef struct item {
  void* data;
  size_t size;
} item;

typedef struct slot {
  char* key;
  item* items;
  size_t count;
} slot;

typedef struct small_cache {
  pthread_mutex_t lock;
  slot* slots;
  size_t max, used, next; /* ring of slots: `next` is the oldest once full */
} small_cache;

static void record(const char* what, const char* key) {
  const char* path = getenv("MODELHOST_TEST_EVENTS");
  if (path == NULL || path[0] == '\0') return;
  FILE* f = fopen(path, "a");
  if (f == NULL) return;
  fprintf(f, "%s %s\n", what, key);
  fclose(f);
}

static void clear(slot* s) {
  for (size_t i = 0; i < s->count; i++) free(s->items[i].data);
  free(s->items);
  free(s->key);
  memset(s, 0, sizeof(*s));
}

TRITONSERVER_Error* TRITONCACHE_CacheInitialize(TRITONCACHE_Cache** cache, const char* config) {
  /* expects {"max_entries": "<digits>"}: the value must be a JSON string */
  const char* at = strstr(config, "\"max_entries\"");
  if (at == NULL)
    return TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_INVALID_ARG, "small cache needs max_entries");
  at = strchr(at + 13, ':');
  while (at && (*at == ':' || *at == ' ')) at++;
  if (at == NULL || *at != '"')
    return TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_INVALID_ARG,
                                 "small cache: max_entries must be a JSON string");
  long max = strtol(at + 1, NULL, 10);
  if (max <= 0)
    return TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_INVALID_ARG, "small cache: bad max_entries");
  small_cache* c = calloc(1, sizeof(*c));
  pthread_mutex_init(&c->lock, NULL);
  c->max = (size_t)max;
  c->slots = calloc(c->max, sizeof(slot));
  *cache = (TRITONCACHE_Cache*)c;
  record("initialize", config);
  return NULL;
}

TRITONSERVER_Error* TRITONCACHE_CacheFinalize(TRITONCACHE_Cache* cache) {
  small_cache* c = (small_cache*)cache;
  for (size_t i = 0; i < c->max; i++) clear(&c->slots[i]);
  free(c->slots);
  pthread_mutex_destroy(&c->lock);
  free(c);
  record("finalize", "-");
  return NULL;
}

static slot* find(small_cache* c, const char* key) {
  for (size_t i = 0; i < c->max; i++)
    if (c->slots[i].key && strcmp(c->slots[i].key, key) == 0) return &c->slots[i];
  return NULL;
}

TRITONSERVER_Error* TRITONCACHE_CacheLookup(TRITONCACHE_Cache* cache, const char* key,
                                            TRITONCACHE_CacheEntry* entry,
                                            TRITONCACHE_Allocator* allocator) {
  small_cache* c = (small_cache*)cache;
  pthread_mutex_lock(&c->lock);
  slot* s = find(c, key);
  if (s == NULL) {
    pthread_mutex_unlock(&c->lock);
    record("miss", key);
    return TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_NOT_FOUND, "no such key");
  }
  TRITONSERVER_Error* err = NULL;
  for (size_t i = 0; i < s->count && err == NULL; i++) {
    TRITONSERVER_BufferAttributes* attrs;
    TRITONSERVER_BufferAttributesNew(&attrs);
    TRITONSERVER_BufferAttributesSetByteSize(attrs, s->items[i].size);
    TRITONSERVER_BufferAttributesSetMemoryType(attrs, TRITONSERVER_MEMORY_CPU);
    err = TRITONCACHE_CacheEntryAddBuffer(entry, s->items[i].data, attrs);
    TRITONSERVER_BufferAttributesDelete(attrs);
  }
  if (err == NULL) err = TRITONCACHE_Copy(allocator, entry); /* while the lock holds the entry */
  pthread_mutex_unlock(&c->lock);
  record("hit", key);
  return err;
}

TRITONSERVER_Error* TRITONCACHE_CacheInsert(TRITONCACHE_Cache* cache, const char* key,
                                            TRITONCACHE_CacheEntry* entry,
                                            TRITONCACHE_Allocator* allocator) {
  small_cache* c = (small_cache*)cache;
  size_t count = 0;
  TRITONSERVER_Error* err = TRITONCACHE_CacheEntryBufferCount(entry, &count);
  if (err != NULL) return err;
  pthread_mutex_lock(&c->lock);
  if (find(c, key) != NULL) {
    pthread_mutex_unlock(&c->lock);
    return TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_ALREADY_EXISTS, "key exists");
  }
  slot* s = &c->slots[c->next];
  c->next = (c->next + 1) % c->max;
  if (s->key != NULL) record("evict", s->key);
  clear(s);
  s->items = calloc(count ? count : 1, sizeof(item));
  for (size_t i = 0; i < count && err == NULL; i++) {
    void* base;
    TRITONSERVER_BufferAttributes* attrs;
    TRITONSERVER_BufferAttributesNew(&attrs);
    err = TRITONCACHE_CacheEntryGetBuffer(entry, i, &base, attrs);
    size_t size = 0;
    if (err == NULL) TRITONSERVER_BufferAttributesByteSize(attrs, &size);
    TRITONSERVER_BufferAttributesDelete(attrs);
    if (err != NULL) break;
    s->items[i].data = malloc(size ? size : 1);
    s->items[i].size = size;
    s->count = i + 1;
    /* point the entry at our memory: TRITONCACHE_Copy fills it */
    err = TRITONCACHE_CacheEntrySetBuffer(entry, i, s->items[i].data, NULL);
  }
  if (err == NULL) err = TRITONCACHE_Copy(allocator, entry);
  if (err == NULL) s->key = strdup(key);
  else clear(s);
  pthread_mutex_unlock(&c->lock);
  if (err == NULL) record("insert", key);
  return err;
}
