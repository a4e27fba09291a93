/* TRITONCACHE_*: cache entries, the copy callback, and driving a libtritoncache_<name>.so.
 *
 * An entry is a list of buffers. On insert the host fills it with its own buffers; the cache
 * may point each at memory of its own (CacheEntrySetBuffer) and then calls TRITONCACHE_Copy,
 * which copies the host's bytes there. On lookup the cache adds its buffers
 * (CacheEntryAddBuffer) and calls TRITONCACHE_Copy, which copies them into host memory before
 * the cache returns (so an eviction right after cannot pull them away). */
#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>

#include "bridge.h"

typedef struct mh_item {
  void* base;         /* what GetBuffer returns: the host's buffer, or the cache's */
  const void* source; /* insert: the host's bytes */
  void* copied;       /* lookup: the host's copy, made by TRITONCACHE_Copy */
  TRITONSERVER_BufferAttributes attributes;
} mh_item;

struct TRITONCACHE_CacheEntry {
  mh_item* items;
  size_t count, capacity;
};

enum { MH_COPY_INSERT, MH_COPY_LOOKUP };
struct TRITONCACHE_Allocator {
  int mode;
};

MH_EXPORT TRITONSERVER_Error* TRITONCACHE_ApiVersion(uint32_t* major, uint32_t* minor) {
  *major = TRITONCACHE_API_VERSION_MAJOR;
  *minor = TRITONCACHE_API_VERSION_MINOR;
  return NULL;
}

MH_EXPORT TRITONSERVER_Error* TRITONCACHE_CacheEntryBufferCount(TRITONCACHE_CacheEntry* entry,
                                                                size_t* count) {
  if (entry == NULL) return mh_error(TRITONSERVER_ERROR_INVALID_ARG, "entry was nullptr");
  *count = entry->count;
  return NULL;
}

static mh_item* add_item(TRITONCACHE_CacheEntry* entry) {
  if (entry->count == entry->capacity) {
    entry->capacity = entry->capacity ? 2 * entry->capacity : 4;
    entry->items = realloc(entry->items, entry->capacity * sizeof(mh_item));
  }
  mh_item* item = &entry->items[entry->count++];
  memset(item, 0, sizeof(*item));
  return item;
}

MH_EXPORT TRITONSERVER_Error* TRITONCACHE_CacheEntryAddBuffer(
    TRITONCACHE_CacheEntry* entry, void* base, TRITONSERVER_BufferAttributes* buffer_attributes) {
  if (entry == NULL || buffer_attributes == NULL)
    return mh_error(TRITONSERVER_ERROR_INVALID_ARG, "entry or buffer attributes was nullptr");
  mh_item* item = add_item(entry);
  item->base = base;
  item->attributes = *buffer_attributes;
  return NULL;
}

MH_EXPORT TRITONSERVER_Error* TRITONCACHE_CacheEntryGetBuffer(
    TRITONCACHE_CacheEntry* entry, size_t index, void** base,
    TRITONSERVER_BufferAttributes* buffer_attributes) {
  if (entry == NULL || index >= entry->count)
    return mh_error(TRITONSERVER_ERROR_INVALID_ARG, "entry has no buffer %zu", index);
  *base = entry->items[index].base;
  if (buffer_attributes) *buffer_attributes = entry->items[index].attributes;
  return NULL;
}

MH_EXPORT TRITONSERVER_Error* TRITONCACHE_CacheEntrySetBuffer(
    TRITONCACHE_CacheEntry* entry, size_t index, void* new_base,
    TRITONSERVER_BufferAttributes* buffer_attributes) {
  if (entry == NULL || index >= entry->count)
    return mh_error(TRITONSERVER_ERROR_INVALID_ARG, "entry has no buffer %zu", index);
  entry->items[index].base = new_base;
  if (buffer_attributes) entry->items[index].attributes = *buffer_attributes;
  return NULL;
}

MH_EXPORT TRITONSERVER_Error* TRITONCACHE_Copy(TRITONCACHE_Allocator* allocator,
                                               TRITONCACHE_CacheEntry* entry) {
  if (allocator == NULL || entry == NULL)
    return mh_error(TRITONSERVER_ERROR_INVALID_ARG, "allocator or entry was nullptr");
  for (size_t i = 0; i < entry->count; i++) {
    mh_item* item = &entry->items[i];
    size_t size = item->attributes.byte_size;
    if (item->attributes.memory_type == TRITONSERVER_MEMORY_GPU)
      return mh_error(TRITONSERVER_ERROR_UNSUPPORTED, "cache buffers in GPU memory are not supported");
    if (size == 0) continue;
    if (item->base == NULL)
      return mh_error(TRITONSERVER_ERROR_INVALID_ARG, "cache entry buffer %zu is null", i);
    if (allocator->mode == MH_COPY_INSERT) {
      if (item->base != item->source) memcpy(item->base, item->source, size);
    } else {
      free(item->copied);
      item->copied = malloc(size);
      if (item->copied == NULL)
        return mh_error(TRITONSERVER_ERROR_UNAVAILABLE, "out of memory copying a cache entry");
      memcpy(item->copied, item->base, size);
    }
  }
  return NULL;
}

static void entry_clear(TRITONCACHE_CacheEntry* entry) {
  for (size_t i = 0; i < entry->count; i++) free(entry->items[i].copied);
  free(entry->items);
}

/* --- driving a cache library (host.native.cache) ------------------------------------------------- */

typedef TRITONSERVER_Error* (*mh_cache_init_fn)(TRITONCACHE_Cache**, const char*);
typedef TRITONSERVER_Error* (*mh_cache_fini_fn)(TRITONCACHE_Cache*);
typedef TRITONSERVER_Error* (*mh_cache_op_fn)(TRITONCACHE_Cache*, const char*,
                                              TRITONCACHE_CacheEntry*, TRITONCACHE_Allocator*);

typedef struct mh_cache {
  void* dl;
  TRITONCACHE_Cache* cache;
  mh_cache_fini_fn finalize;
  mh_cache_op_fn lookup, insert;
} mh_cache;

#define CACHE_CAPSULE "modelhost.TRITONCACHE_Cache"


static PyObject* py_cache_load(PyObject* self, PyObject* args) {
  (void)self;
  const char *path, *config;
  if (!PyArg_ParseTuple(args, "ss", &path, &config)) return NULL;
  void* dl = NULL;
  TRITONSERVER_Error* err = mh_dlopen(path, "cache", &dl);
  if (err != NULL) return mh_raise_error(err);
  const char* names[] = {"TRITONCACHE_CacheInitialize", "TRITONCACHE_CacheFinalize",
                         "TRITONCACHE_CacheLookup", "TRITONCACHE_CacheInsert"};
  void* fns[4];
  for (int i = 0; i < 4; i++) {
    if ((fns[i] = dlsym(dl, names[i])) == NULL) {
      dlclose(dl);
      return mh_raise_error(mh_error(TRITONSERVER_ERROR_NOT_FOUND,
                                  "unable to find required entrypoint '%s' in cache library: %s",
                                  names[i], path));
    }
  }
  mh_cache* c = calloc(1, sizeof(*c));
  c->dl = dl;
  c->finalize = (mh_cache_fini_fn)fns[1];
  c->lookup = (mh_cache_op_fn)fns[2];
  c->insert = (mh_cache_op_fn)fns[3];
  Py_BEGIN_ALLOW_THREADS err = ((mh_cache_init_fn)fns[0])(&c->cache, config);
  Py_END_ALLOW_THREADS if (err != NULL) {
    dlclose(dl);
    free(c);
    return mh_raise_error(err);
  }
  return PyCapsule_New(c, CACHE_CAPSULE, NULL);
}

/* lookup(cache, key) -> list[bytes] | None (None on a miss: the cache's NOT_FOUND). */
static PyObject* py_cache_lookup(PyObject* self, PyObject* args) {
  (void)self;
  PyObject* capsule;
  const char* key;
  if (!PyArg_ParseTuple(args, "Os", &capsule, &key)) return NULL;
  mh_cache* c = PyCapsule_GetPointer(capsule, CACHE_CAPSULE);
  if (c == NULL) return NULL;
  TRITONCACHE_CacheEntry entry = {0};
  TRITONCACHE_Allocator allocator = {MH_COPY_LOOKUP};
  TRITONSERVER_Error* err;
  Py_BEGIN_ALLOW_THREADS err = c->lookup(c->cache, key, &entry, &allocator);
  Py_END_ALLOW_THREADS if (err != NULL) {
    entry_clear(&entry);
    if (err->code == TRITONSERVER_ERROR_NOT_FOUND) {
      TRITONSERVER_ErrorDelete(err);
      Py_RETURN_NONE;
    }
    return mh_raise_error(err);
  }
  PyObject* list = PyList_New((Py_ssize_t)entry.count);
  for (size_t i = 0; list && i < entry.count; i++) {
    mh_item* item = &entry.items[i];
    const char* data = item->copied ? item->copied : "";
    PyObject* b = PyBytes_FromStringAndSize(data, (Py_ssize_t)(item->copied ? item->attributes.byte_size : 0));
    if (b == NULL) Py_CLEAR(list);
    else PyList_SET_ITEM(list, (Py_ssize_t)i, b);
  }
  entry_clear(&entry);
  return list;
}

/* insert(cache, key, buffers): the cache copies the bytes (TRITONCACHE_Copy) before returning.
 * A key already there is not an error (the entry stays as it was). */
static PyObject* py_cache_insert(PyObject* self, PyObject* args) {
  (void)self;
  PyObject *capsule, *buffers;
  const char* key;
  if (!PyArg_ParseTuple(args, "OsO", &capsule, &key, &buffers)) return NULL;
  mh_cache* c = PyCapsule_GetPointer(capsule, CACHE_CAPSULE);
  if (c == NULL) return NULL;
  PyObject* seq = PySequence_Fast(buffers, "an entry is a sequence of buffers");
  if (seq == NULL) return NULL;
  Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
  Py_buffer* views = calloc((size_t)(n ? n : 1), sizeof(Py_buffer));
  TRITONCACHE_CacheEntry entry = {0};
  Py_ssize_t got = 0;
  for (; got < n; got++) {
    if (PyObject_GetBuffer(PySequence_Fast_GET_ITEM(seq, got), &views[got], PyBUF_C_CONTIGUOUS) != 0)
      break;
    mh_item* item = add_item(&entry);
    item->base = views[got].buf;
    item->source = views[got].buf;
    item->attributes.byte_size = (size_t)views[got].len;
    item->attributes.memory_type = TRITONSERVER_MEMORY_CPU;
  }
  TRITONSERVER_Error* err = NULL;
  if (got == n) {
    TRITONCACHE_Allocator allocator = {MH_COPY_INSERT};
    Py_BEGIN_ALLOW_THREADS err = c->insert(c->cache, key, &entry, &allocator);
    Py_END_ALLOW_THREADS
  }
  for (Py_ssize_t i = 0; i < got; i++) PyBuffer_Release(&views[i]);
  free(views);
  entry_clear(&entry);
  Py_DECREF(seq);
  if (got != n) return NULL;
  if (err != NULL) {
    if (err->code == TRITONSERVER_ERROR_ALREADY_EXISTS) {
      TRITONSERVER_ErrorDelete(err);
      Py_RETURN_NONE;
    }
    return mh_raise_error(err);
  }
  Py_RETURN_NONE;
}

static PyObject* py_cache_close(PyObject* self, PyObject* capsule) {
  (void)self;
  mh_cache* c = PyCapsule_GetPointer(capsule, CACHE_CAPSULE);
  if (c == NULL) return NULL;
  TRITONSERVER_Error* err;
  Py_BEGIN_ALLOW_THREADS err = c->finalize(c->cache);
  dlclose(c->dl);
  Py_END_ALLOW_THREADS free(c);
  if (err != NULL) return mh_raise_error(err);
  Py_RETURN_NONE;
}

PyMethodDef mh_cache_methods[] = {
    {"cache_load", py_cache_load, METH_VARARGS, "cache_load(path, config_json)"},
    {"cache_lookup", py_cache_lookup, METH_VARARGS, "cache_lookup(cache, key)"},
    {"cache_insert", py_cache_insert, METH_VARARGS, "cache_insert(cache, key, buffers)"},
    {"cache_close", py_cache_close, METH_O, "cache_close(cache)"},
    {NULL, NULL, 0, NULL},
};
