/* Custom batching strategies (Triton's TRITONBACKEND_ModelBatch* / ModelBatcher* functions).
 *
 * A strategy library is loaded for a native model after TRITONBACKEND_ModelInitialize
 * (host.native.batching decides which file, with Triton's rules). Its batcher is made with the
 * model's TRITONBACKEND_Model, and the dynamic batcher (host.scheduler) asks it, for each batch
 * it forms, ModelBatchInitialize once, ModelBatchIncludeRequest for each candidate request
 * (wrapped as a TRITONBACKEND_Request outside any execute, as Triton hands its queued requests),
 * and ModelBatchFinalize once. Errors of the per-batch calls come back as messages (the host
 * logs them with Triton's texts); they never fail a request. Every call runs without the GIL. */
#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>

#include "bridge.h"

#define STRATEGY_CAPSULE "modelhost.BatchStrategy"
#define MODEL_CAPSULE "modelhost.TRITONBACKEND_Model"

typedef TRITONSERVER_Error* (*mh_batch_incl_fn)(TRITONBACKEND_Request*, void*, bool*);
typedef TRITONSERVER_Error* (*mh_batch_init_fn)(const TRITONBACKEND_Batcher*, void**);
typedef TRITONSERVER_Error* (*mh_batch_fini_fn)(void*);
typedef TRITONSERVER_Error* (*mh_batcher_init_fn)(TRITONBACKEND_Batcher**, TRITONBACKEND_Model*);
typedef TRITONSERVER_Error* (*mh_batcher_fini_fn)(TRITONBACKEND_Batcher*);

typedef struct mh_strategy {
  void* dl;
  mh_batch_incl_fn incl;
  mh_batch_init_fn init;
  mh_batch_fini_fn fini;
  mh_batcher_init_fn batcher_init;
  mh_batcher_fini_fn batcher_fini;
  TRITONBACKEND_Batcher* batcher;
  /* The instance the wrapped requests name: requests in the batcher's queue have none yet;
   * this one only carries the model (for the configured outputs). */
  TRITONBACKEND_ModelInstance instance;
} mh_strategy;

/* The error's message as a Python str (None without an error); deletes the error. */
static PyObject* message_of(TRITONSERVER_Error* err) {
  if (err == NULL) Py_RETURN_NONE;
  PyObject* text = PyUnicode_DecodeUTF8(err->message, (Py_ssize_t)strlen(err->message), "replace");
  TRITONSERVER_ErrorDelete(err);
  return text;
}

static void strategy_close(mh_strategy* s) {
  Py_BEGIN_ALLOW_THREADS dlclose(s->dl);
  Py_END_ALLOW_THREADS free(s->instance.name);
  free(s);
}

/* strategy_load(model, path) -> capsule, or None when the library defines none of the five
 * functions (Triton loads it and batches as usual). Raises BridgeError as Triton fails the load. */
static PyObject* py_strategy_load(PyObject* self, PyObject* args) {
  (void)self;
  PyObject* capsule;
  const char* path;
  if (!PyArg_ParseTuple(args, "Os", &capsule, &path)) return NULL;
  TRITONBACKEND_Model* m = PyCapsule_GetPointer(capsule, MODEL_CAPSULE);
  if (m == NULL) return NULL;
  void* dl = NULL;
  TRITONSERVER_Error* err = mh_dlopen(path, "shared", &dl);
  if (err != NULL) return mh_raise_error(err);
  mh_strategy* s = calloc(1, sizeof(*s));
  s->dl = dl;
  s->incl = (mh_batch_incl_fn)dlsym(dl, "TRITONBACKEND_ModelBatchIncludeRequest");
  s->init = (mh_batch_init_fn)dlsym(dl, "TRITONBACKEND_ModelBatchInitialize");
  s->fini = (mh_batch_fini_fn)dlsym(dl, "TRITONBACKEND_ModelBatchFinalize");
  s->batcher_fini = (mh_batcher_fini_fn)dlsym(dl, "TRITONBACKEND_ModelBatcherFinalize");
  s->batcher_init = (mh_batcher_init_fn)dlsym(dl, "TRITONBACKEND_ModelBatcherInitialize");
  bool some = s->incl || s->init || s->fini || s->batcher_init || s->batcher_fini;
  bool all = s->incl && s->init && s->fini && s->batcher_init && s->batcher_fini;
  if (!some) {
    strategy_close(s);
    Py_RETURN_NONE;
  }
  if (!all) {
    strategy_close(s);
    return mh_raise_error(mh_error(TRITONSERVER_ERROR_INVALID_ARG,
                                "%s does not define all required custom batching functions for "
                                "model %s",
                                path, m->name));
  }
  s->instance.model = m;
  s->instance.name = mh_strdup("batcher");
  s->instance.kind = TRITONSERVER_INSTANCEGROUPKIND_CPU;
  Py_BEGIN_ALLOW_THREADS err = s->batcher_init(&s->batcher, m);
  Py_END_ALLOW_THREADS if (err != NULL) {
    strategy_close(s);
    return mh_raise_error(err);
  }
  return PyCapsule_New(s, STRATEGY_CAPSULE, NULL);
}

/* strategy_begin(strategy) -> (userp, error message or None): TRITONBACKEND_ModelBatchInitialize. */
static PyObject* py_strategy_begin(PyObject* self, PyObject* capsule) {
  (void)self;
  mh_strategy* s = PyCapsule_GetPointer(capsule, STRATEGY_CAPSULE);
  if (s == NULL) return NULL;
  void* userp = NULL;
  TRITONSERVER_Error* err;
  Py_BEGIN_ALLOW_THREADS err = s->init(s->batcher, &userp);
  Py_END_ALLOW_THREADS return Py_BuildValue("(KN)", (unsigned long long)(uintptr_t)userp,
                                            message_of(err));
}

/* strategy_include(strategy, userp, request) -> (include, error message or None). */
static PyObject* py_strategy_include(PyObject* self, PyObject* args) {
  (void)self;
  PyObject *capsule, *request;
  unsigned long long userp;
  if (!PyArg_ParseTuple(args, "OKO", &capsule, &userp, &request)) return NULL;
  mh_strategy* s = PyCapsule_GetPointer(capsule, STRATEGY_CAPSULE);
  if (s == NULL) return NULL;
  TRITONBACKEND_Request* r = mh_request_new(&s->instance, request);
  if (r == NULL) return NULL;
  bool include = false;
  TRITONSERVER_Error* err;
  Py_BEGIN_ALLOW_THREADS err = s->incl(r, (void*)(uintptr_t)userp, &include);
  Py_END_ALLOW_THREADS
  /* The request stays the host's: drop the library's share (unless it released it) and ours. */
  if (!atomic_exchange(&r->released, true)) mh_request_unref(r);
  mh_request_unref(r);
  return Py_BuildValue("(ON)", include ? Py_True : Py_False, message_of(err));
}

/* strategy_end(strategy, userp) -> error message or None: TRITONBACKEND_ModelBatchFinalize
 * (not called for a NULL userp, as in Triton). */
static PyObject* py_strategy_end(PyObject* self, PyObject* args) {
  (void)self;
  PyObject* capsule;
  unsigned long long userp;
  if (!PyArg_ParseTuple(args, "OK", &capsule, &userp)) return NULL;
  mh_strategy* s = PyCapsule_GetPointer(capsule, STRATEGY_CAPSULE);
  if (s == NULL) return NULL;
  if (userp == 0) Py_RETURN_NONE;
  TRITONSERVER_Error* err;
  Py_BEGIN_ALLOW_THREADS err = s->fini((void*)(uintptr_t)userp);
  Py_END_ALLOW_THREADS return message_of(err);
}

/* strategy_unload(strategy) -> error message or None: TRITONBACKEND_ModelBatcherFinalize, then
 * the library is closed. */
static PyObject* py_strategy_unload(PyObject* self, PyObject* capsule) {
  (void)self;
  mh_strategy* s = PyCapsule_GetPointer(capsule, STRATEGY_CAPSULE);
  if (s == NULL) return NULL;
  TRITONSERVER_Error* err;
  Py_BEGIN_ALLOW_THREADS err = s->batcher_fini(s->batcher);
  Py_END_ALLOW_THREADS s->batcher = NULL;
  PyObject* message = message_of(err);
  if (PyCapsule_SetName(capsule, "modelhost.BatchStrategy (unloaded)") != 0) PyErr_Clear();
  strategy_close(s);
  return message;
}

PyMethodDef mh_batching_methods[] = {
    {"strategy_load", py_strategy_load, METH_VARARGS, "strategy_load(model, path) -> strategy | None"},
    {"strategy_begin", py_strategy_begin, METH_O, "strategy_begin(strategy) -> (userp, error)"},
    {"strategy_include", py_strategy_include, METH_VARARGS,
     "strategy_include(strategy, userp, request) -> (include, error)"},
    {"strategy_end", py_strategy_end, METH_VARARGS, "strategy_end(strategy, userp) -> error"},
    {"strategy_unload", py_strategy_unload, METH_O, "strategy_unload(strategy) -> error"},
    {NULL, NULL, 0, NULL},
};
