/* The Python extension module host.native.libtritonserver: how host.native drives backends.
 *
 * Objects are passed to Python as capsules and freed explicitly (host.native.backend owns
 * their lifetimes, which follow Triton's lifecycle). Every call into a backend library runs
 * with the GIL released. */
#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>

#include "bridge.h"

PyObject *mh_py_serialize_bytes, *mh_py_contiguous, *mh_py_deliver, *mh_py_log;
PyObject *mh_attr_id, *mh_attr_sequence_id, *mh_attr_sequence_start, *mh_attr_sequence_end,
    *mh_attr_timeout_us, *mh_attr_inputs, *mh_attr_outputs, *mh_attr_parameters,
    *mh_attr_datatype, *mh_attr_shape, *mh_attr_data, *mh_attr_name, *mh_attr_cancelled;
extern int mh_log_enabled[4];

static PyObject* BridgeError; /* args: (TRITONSERVER_Error_Code, message) */

/* Raise a backend's error as BridgeError and delete it; returns NULL for `return raise(..)`.
 * The one such function of the bridge (bridge.h): every module raises through it. */
PyObject* mh_raise_error(TRITONSERVER_Error* err) {
  PyObject* args = Py_BuildValue("(is)", (int)err->code, err->message);
  TRITONSERVER_ErrorDelete(err);
  if (args != NULL) {
    PyErr_SetObject(BridgeError, args);
    Py_DECREF(args);
  }
  return NULL;
}

/* --- logging: TRITONSERVER_LogMessage -> host.native.bridge.log ----------------------------- */

void mh_log(TRITONSERVER_LogLevel level, const char* file, int line, const char* msg) {
  if (mh_py_log == NULL) return;
  PyGILState_STATE gil = PyGILState_Ensure();
  PyObject* r = PyObject_CallFunction(mh_py_log, "isis", (int)level, file ? file : "", line,
                                      msg ? msg : "");
  if (r == NULL) PyErr_Clear(); /* logging must never fail the caller */
  Py_XDECREF(r);
  PyGILState_Release(gil);
}

/* --- Buffer: output memory handed to numpy without a copy ----------------------------------------- */

typedef struct {
  PyObject_HEAD void* data;
  Py_ssize_t size;
} mh_Buffer;

static int buffer_getbuffer(PyObject* self, Py_buffer* view, int flags) {
  mh_Buffer* b = (mh_Buffer*)self;
  return PyBuffer_FillInfo(view, self, b->data, b->size, 0, flags);
}

static void buffer_dealloc(PyObject* self) {
  free(((mh_Buffer*)self)->data);
  Py_TYPE(self)->tp_free(self);
}

static PyBufferProcs buffer_procs = {buffer_getbuffer, NULL};

static PyTypeObject mh_BufferType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "host.native.libtritonserver.Buffer",
    .tp_basicsize = sizeof(mh_Buffer),
    .tp_dealloc = buffer_dealloc,
    .tp_as_buffer = &buffer_procs,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Output tensor memory a native backend wrote (freed with the last view).",
};

PyObject* mh_buffer_new(void* data, size_t size) {
  mh_Buffer* b = PyObject_New(mh_Buffer, &mh_BufferType);
  if (b == NULL) {
    free(data);
    return NULL;
  }
  b->data = data;
  b->size = (Py_ssize_t)size;
  return (PyObject*)b;
}

/* --- configure ------------------------------------------------------------------------------------ */

static PyObject* py_configure(PyObject* self, PyObject* args) {
  (void)self;
  PyObject *deliver, *log, *serialize, *contiguous;
  int info, warn, error, verbose;
  if (!PyArg_ParseTuple(args, "OOOO(iiii)", &deliver, &log, &serialize, &contiguous, &info,
                        &warn, &error, &verbose))
    return NULL;
  Py_XSETREF(mh_py_deliver, Py_NewRef(deliver));
  Py_XSETREF(mh_py_log, Py_NewRef(log));
  Py_XSETREF(mh_py_serialize_bytes, Py_NewRef(serialize));
  Py_XSETREF(mh_py_contiguous, Py_NewRef(contiguous));
  mh_log_enabled[TRITONSERVER_LOG_INFO] = info;
  mh_log_enabled[TRITONSERVER_LOG_WARN] = warn;
  mh_log_enabled[TRITONSERVER_LOG_ERROR] = error;
  mh_log_enabled[TRITONSERVER_LOG_VERBOSE] = verbose;
  Py_RETURN_NONE;
}

/* --- capsules --------------------------------------------------------------------------------------- */

#define BACKEND_CAPSULE "modelhost.TRITONBACKEND_Backend"
#define MODEL_CAPSULE "modelhost.TRITONBACKEND_Model"
#define INSTANCE_CAPSULE "modelhost.TRITONBACKEND_ModelInstance"

static void* from_capsule(PyObject* capsule, const char* name) {
  return PyCapsule_GetPointer(capsule, name);
}

/* --- backends ----------------------------------------------------------------------------------------- */

TRITONSERVER_Error* mh_dlopen(const char* path, const char* what, void** dl) {
  void* handle;
  Py_BEGIN_ALLOW_THREADS handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  Py_END_ALLOW_THREADS if (handle == NULL) {
    const char* why = dlerror();
    return mh_error(TRITONSERVER_ERROR_NOT_FOUND, "unable to load %s library: %s", what,
                    why ? why : path);
  }
  *dl = handle;
  return NULL;
}

static PyObject* py_backend_load(PyObject* self, PyObject* args) {
  (void)self;
  const char *path, *name, *location, *config;
  if (!PyArg_ParseTuple(args, "ssss", &path, &name, &location, &config)) return NULL;
  void* dl = NULL;
  TRITONSERVER_Error* err = mh_dlopen(path, "backend", &dl);
  if (err != NULL) return mh_raise_error(err);
  mh_execute_fn execute = (mh_execute_fn)dlsym(dl, "TRITONBACKEND_ModelInstanceExecute");
  if (execute == NULL) {
    dlclose(dl);
    return mh_raise_error(mh_error(TRITONSERVER_ERROR_NOT_FOUND,
                                "unable to find required entrypoint "
                                "'TRITONBACKEND_ModelInstanceExecute' in backend library: %s",
                                path));
  }
  TRITONBACKEND_Backend* b = calloc(1, sizeof(*b));
  b->dl = dl;
  b->name = mh_strdup(name);
  b->location = mh_strdup(location);
  b->config_json = mh_strdup(config);
  b->policy = TRITONBACKEND_EXECUTION_BLOCKING;
  b->execute = execute;
  b->initialize = (mh_backend_fn)dlsym(dl, "TRITONBACKEND_Initialize");
  b->finalize = (mh_backend_fn)dlsym(dl, "TRITONBACKEND_Finalize");
  b->model_initialize = (mh_model_fn)dlsym(dl, "TRITONBACKEND_ModelInitialize");
  b->model_finalize = (mh_model_fn)dlsym(dl, "TRITONBACKEND_ModelFinalize");
  b->instance_initialize = (mh_instance_fn)dlsym(dl, "TRITONBACKEND_ModelInstanceInitialize");
  b->instance_finalize = (mh_instance_fn)dlsym(dl, "TRITONBACKEND_ModelInstanceFinalize");
  b->get_attribute = (mh_attribute_fn)dlsym(dl, "TRITONBACKEND_GetBackendAttribute");
  return PyCapsule_New(b, BACKEND_CAPSULE, NULL);
}

/* Run one lifecycle call with the GIL released; raise its error. */
#define CALL_BACKEND(fn, arg)                                 \
  do {                                                        \
    TRITONSERVER_Error* err_ = NULL;                          \
    if ((fn) != NULL) {                                       \
      Py_BEGIN_ALLOW_THREADS err_ = (fn)(arg);                \
      Py_END_ALLOW_THREADS                                    \
    }                                                         \
    if (err_ != NULL) return mh_raise_error(err_);               \
  } while (0)

static PyObject* py_backend_initialize(PyObject* self, PyObject* capsule) {
  (void)self;
  TRITONBACKEND_Backend* b = from_capsule(capsule, BACKEND_CAPSULE);
  if (b == NULL) return NULL;
  CALL_BACKEND(b->initialize, b);
  if (b->get_attribute != NULL) {
    TRITONSERVER_Error* err;
    Py_BEGIN_ALLOW_THREADS err = b->get_attribute(b, &b->attributes);
    Py_END_ALLOW_THREADS if (err != NULL) return mh_raise_error(err);
  }
  Py_RETURN_NONE;
}

/* The backend's attributes: ([(kind, count, [device ids])], parallel instance loading). */
static PyObject* py_backend_attributes(PyObject* self, PyObject* capsule) {
  (void)self;
  TRITONBACKEND_Backend* b = from_capsule(capsule, BACKEND_CAPSULE);
  if (b == NULL) return NULL;
  PyObject* groups = PyList_New(0);
  for (int i = 0; i < b->attributes.group_count; i++) {
    mh_preferred_group* g = &b->attributes.groups[i];
    PyObject* ids = PyList_New((Py_ssize_t)g->id_count);
    for (uint64_t j = 0; j < g->id_count; j++)
      PyList_SET_ITEM(ids, j, PyLong_FromUnsignedLongLong(g->device_ids[j]));
    PyObject* item = Py_BuildValue("(sKN)", TRITONSERVER_InstanceGroupKindString(g->kind),
                                   (unsigned long long)g->count, ids);
    PyList_Append(groups, item);
    Py_DECREF(item);
  }
  return Py_BuildValue("(NO)", groups, b->attributes.parallel_instance_loading ? Py_True : Py_False);
}

static PyObject* py_backend_finalize(PyObject* self, PyObject* capsule) {
  (void)self;
  TRITONBACKEND_Backend* b = from_capsule(capsule, BACKEND_CAPSULE);
  if (b == NULL) return NULL;
  CALL_BACKEND(b->finalize, b);
  Py_RETURN_NONE;
}

/* backend_placeholder(name, location, config_json) -> capsule: a backend with no library, which
 * a model of another kind of backend (python, a plugin) is made under so that a custom batching
 * strategy library can be given the TRITONBACKEND_Model it asks about (host.native.batching).
 * Its lifecycle functions are all absent: the calls above skip them. */
static PyObject* py_backend_placeholder(PyObject* self, PyObject* args) {
  (void)self;
  const char *name, *location, *config;
  if (!PyArg_ParseTuple(args, "sss", &name, &location, &config)) return NULL;
  TRITONBACKEND_Backend* b = calloc(1, sizeof(*b));
  b->name = mh_strdup(name);
  b->location = mh_strdup(location);
  b->config_json = mh_strdup(config);
  b->policy = TRITONBACKEND_EXECUTION_BLOCKING;
  return PyCapsule_New(b, BACKEND_CAPSULE, NULL);
}

static PyObject* py_backend_unload(PyObject* self, PyObject* capsule) {
  (void)self;
  TRITONBACKEND_Backend* b = from_capsule(capsule, BACKEND_CAPSULE);
  if (b == NULL) return NULL;
  if (b->dl != NULL) {
    Py_BEGIN_ALLOW_THREADS dlclose(b->dl);
    Py_END_ALLOW_THREADS
  }
  free(b->name);
  free(b->location);
  free(b->config_json);
  free(b);
  Py_RETURN_NONE;
}

/* --- models ----------------------------------------------------------------------------------------------- */

static PyObject* py_model_new(PyObject* self, PyObject* args) {
  (void)self;
  PyObject *capsule, *outputs;
  const char *name, *repository, *config;
  unsigned long long version;
  Py_ssize_t config_size;
  int decoupled;
  if (!PyArg_ParseTuple(args, "OsKss#Op", &capsule, &name, &version, &repository, &config,
                        &config_size, &outputs, &decoupled))
    return NULL;
  TRITONBACKEND_Backend* b = from_capsule(capsule, BACKEND_CAPSULE);
  if (b == NULL) return NULL;
  PyObject* seq = PySequence_Fast(outputs, "output names must be a sequence");
  if (seq == NULL) return NULL;
  TRITONBACKEND_Model* m = calloc(1, sizeof(*m));
  m->backend = b;
  m->name = mh_strdup(name);
  m->version = version;
  m->repository = mh_strdup(repository);
  m->config_json = malloc((size_t)config_size + 1);
  memcpy(m->config_json, config, (size_t)config_size + 1);
  m->config_size = (size_t)config_size;
  m->decoupled = decoupled;
  pthread_mutex_init(&m->lock, NULL);
  m->output_count = (uint32_t)PySequence_Fast_GET_SIZE(seq);
  m->output_names = calloc(m->output_count ? m->output_count : 1, sizeof(char*));
  for (uint32_t i = 0; i < m->output_count; i++) {
    const char* s = PyUnicode_AsUTF8(PySequence_Fast_GET_ITEM(seq, i));
    m->output_names[i] = mh_strdup(s);
  }
  Py_DECREF(seq);
  PyErr_Clear();
  return PyCapsule_New(m, MODEL_CAPSULE, NULL);
}

static PyObject* py_model_initialize(PyObject* self, PyObject* capsule) {
  (void)self;
  TRITONBACKEND_Model* m = from_capsule(capsule, MODEL_CAPSULE);
  if (m == NULL) return NULL;
  CALL_BACKEND(m->backend->model_initialize, m);
  Py_RETURN_NONE;
}

static PyObject* py_model_finalize(PyObject* self, PyObject* capsule) {
  (void)self;
  TRITONBACKEND_Model* m = from_capsule(capsule, MODEL_CAPSULE);
  if (m == NULL) return NULL;
  CALL_BACKEND(m->backend->model_finalize, m);
  Py_RETURN_NONE;
}

static PyObject* py_model_free(PyObject* self, PyObject* capsule) {
  (void)self;
  TRITONBACKEND_Model* m = from_capsule(capsule, MODEL_CAPSULE);
  if (m == NULL) return NULL;
  for (uint32_t i = 0; i < m->output_count; i++) free(m->output_names[i]);
  free(m->output_names);
  free(m->name);
  free(m->repository);
  free(m->config_json);
  pthread_mutex_destroy(&m->lock);
  free(m);
  Py_RETURN_NONE;
}

/* --- instances -------------------------------------------------------------------------------------------- */

static PyObject* py_instance_new(PyObject* self, PyObject* args) {
  (void)self;
  PyObject* capsule;
  const char *name, *kind, *host_policy;
  int device_id, passive;
  if (!PyArg_ParseTuple(args, "Ossisp", &capsule, &name, &kind, &device_id, &host_policy,
                        &passive))
    return NULL;
  TRITONBACKEND_Model* m = from_capsule(capsule, MODEL_CAPSULE);
  if (m == NULL) return NULL;
  TRITONBACKEND_ModelInstance* i = calloc(1, sizeof(*i));
  i->model = m;
  i->name = mh_strdup(name);
  i->kind = strcmp(kind, "GPU") == 0     ? TRITONSERVER_INSTANCEGROUPKIND_GPU
            : strcmp(kind, "MODEL") == 0 ? TRITONSERVER_INSTANCEGROUPKIND_MODEL
                                         : TRITONSERVER_INSTANCEGROUPKIND_CPU;
  i->device_id = device_id;
  i->host_policy = mh_strdup(host_policy);
  i->passive = passive;
  pthread_mutex_init(&i->stats_lock, NULL);
  return PyCapsule_New(i, INSTANCE_CAPSULE, NULL);
}

static PyObject* py_instance_initialize(PyObject* self, PyObject* capsule) {
  (void)self;
  TRITONBACKEND_ModelInstance* i = from_capsule(capsule, INSTANCE_CAPSULE);
  if (i == NULL) return NULL;
  CALL_BACKEND(i->model->backend->instance_initialize, i);
  Py_RETURN_NONE;
}

static PyObject* py_instance_finalize(PyObject* self, PyObject* capsule) {
  (void)self;
  TRITONBACKEND_ModelInstance* i = from_capsule(capsule, INSTANCE_CAPSULE);
  if (i == NULL) return NULL;
  CALL_BACKEND(i->model->backend->instance_finalize, i);
  Py_RETURN_NONE;
}

static PyObject* py_instance_free(PyObject* self, PyObject* capsule) {
  (void)self;
  TRITONBACKEND_ModelInstance* i = from_capsule(capsule, INSTANCE_CAPSULE);
  if (i == NULL) return NULL;
  free(i->name);
  free(i->host_policy);
  free(i->responses);
  pthread_mutex_destroy(&i->stats_lock);
  free(i);
  Py_RETURN_NONE;
}

/* --- execute: one batch, one crossing ------------------------------------------------------------------------ */

static void flush_batch(mh_batch* batch) {
  for (uint32_t i = 0; i < batch->pending_count; i++) {
    mh_deliver(batch->pending[i], batch->pending_flags[i], batch->pending_errors[i]);
    if (batch->pending_errors[i]) TRITONSERVER_ErrorDelete(batch->pending_errors[i]);
  }
  free(batch->pending);
  free(batch->pending_flags);
  free(batch->pending_errors);
}

static PyObject* py_execute(PyObject* self, PyObject* args) {
  (void)self;
  PyObject *capsule, *requests;
  if (!PyArg_ParseTuple(args, "OO", &capsule, &requests)) return NULL;
  TRITONBACKEND_ModelInstance* inst = from_capsule(capsule, INSTANCE_CAPSULE);
  if (inst == NULL) return NULL;
  PyObject* seq = PySequence_Fast(requests, "requests must be a sequence");
  if (seq == NULL) return NULL;
  uint32_t n = (uint32_t)PySequence_Fast_GET_SIZE(seq);
  /* `reqs` is handed to the backend (which may overwrite its entries), `keep` is ours. */
  TRITONBACKEND_Request* small[8];
  TRITONBACKEND_Request** reqs = n <= 8 ? small : malloc(n * sizeof(*reqs));
  TRITONBACKEND_Request* mine[8];
  TRITONBACKEND_Request** keep = n <= 8 ? mine : malloc(n * sizeof(*keep));
  for (uint32_t k = 0; k < n; k++) {
    reqs[k] = mh_request_new(inst, PySequence_Fast_GET_ITEM(seq, k));
    if (reqs[k] == NULL) {
      for (uint32_t j = 0; j < k; j++) {
        mh_request_unref(reqs[j]);
        mh_request_unref(reqs[j]);
      }
      if (reqs != small) free(reqs);
      if (keep != mine) free(keep);
      Py_DECREF(seq);
      return NULL;
    }
    keep[k] = reqs[k];
  }
  Py_DECREF(seq);

  mh_batch batch = {0};
  TRITONSERVER_Error* err;
  Py_BEGIN_ALLOW_THREADS mh_current_batch = &batch;
  err = inst->model->backend->execute(inst, reqs, n);
  mh_current_batch = NULL;
  Py_END_ALLOW_THREADS

  flush_batch(&batch);
  for (uint32_t k = 0; k < n; k++) {
    /* On error the requests stay the host's (Triton's rule): drop the backend's share too. */
    if (err != NULL && !atomic_exchange(&keep[k]->released, true)) mh_request_unref(keep[k]);
    mh_request_unref(keep[k]);
  }
  if (reqs != small) free(reqs);
  if (keep != mine) free(keep);
  if (err != NULL) return mh_raise_error(err);
  Py_RETURN_NONE;
}

/* (compute_input_ns, compute_infer_ns, compute_output_ns) the backend reported since the last
 * call, or None when it reported nothing. A batch report wins over per-request reports. */
static PyObject* py_take_statistics(PyObject* self, PyObject* capsule) {
  (void)self;
  TRITONBACKEND_ModelInstance* i = from_capsule(capsule, INSTANCE_CAPSULE);
  if (i == NULL) return NULL;
  pthread_mutex_lock(&i->stats_lock);
  mh_reported r = i->reported;
  memset(&i->reported, 0, sizeof(i->reported));
  pthread_mutex_unlock(&i->stats_lock);
  if (r.batch)
    return Py_BuildValue("(KKK)", (unsigned long long)r.batch_input_ns,
                         (unsigned long long)r.batch_infer_ns, (unsigned long long)r.batch_output_ns);
  if (r.requests)
    return Py_BuildValue("(KKK)", (unsigned long long)(r.input_ns / r.requests),
                         (unsigned long long)(r.infer_ns / r.requests),
                         (unsigned long long)(r.output_ns / r.requests));
  Py_RETURN_NONE;
}

/* The per-response statistics the backend reported since the last call: a list of
 * (index, kind, infer_ns, output_ns, total_ns, has_infer, has_output), kind 0 success, 1 fail,
 * 2 empty response, 3 cancel (host.stats aggregates them as Triton does). */
static PyObject* py_take_response_statistics(PyObject* self, PyObject* capsule) {
  (void)self;
  TRITONBACKEND_ModelInstance* i = from_capsule(capsule, INSTANCE_CAPSULE);
  if (i == NULL) return NULL;
  pthread_mutex_lock(&i->stats_lock);
  mh_response_stat* taken = i->responses;
  size_t count = i->responses_len;
  i->responses = NULL;
  i->responses_len = i->responses_cap = 0;
  pthread_mutex_unlock(&i->stats_lock);
  PyObject* list = PyList_New((Py_ssize_t)count);
  for (size_t k = 0; list != NULL && k < count; k++) {
    const mh_response_stat* r = &taken[k];
    PyObject* item = Py_BuildValue("(KiKKKOO)", (unsigned long long)r->index, r->kind,
                                   (unsigned long long)r->infer_ns, (unsigned long long)r->output_ns,
                                   (unsigned long long)r->total_ns, r->has_infer ? Py_True : Py_False,
                                   r->has_output ? Py_True : Py_False);
    if (item == NULL) {
      Py_CLEAR(list);
      break;
    }
    PyList_SET_ITEM(list, (Py_ssize_t)k, item);
  }
  free(taken);
  return list;
}

/* --- module ------------------------------------------------------------------------------------------------------ */

extern PyMethodDef mh_cache_methods[];
extern PyMethodDef mh_batching_methods[];
extern PyMethodDef mh_repoagent_methods[];

PyObject* mh_metrics_snapshot(void); /* server.c */

static PyObject* py_metrics(PyObject* self, PyObject* unused) {
  (void)self;
  (void)unused;
  return mh_metrics_snapshot();
}

static PyMethodDef methods[] = {
    {"metrics", py_metrics, METH_NOARGS,
     "metrics() -> [(name, description, kind, [(labels, value), ...]), ...]: backend metrics"},
    {"configure", py_configure, METH_VARARGS, "configure(deliver, log, serialize_bytes, contiguous, levels)"},
    {"backend_load", py_backend_load, METH_VARARGS, "backend_load(path, name, location, config_json)"},
    {"backend_placeholder", py_backend_placeholder, METH_VARARGS,
     "backend_placeholder(name, location, config_json)"},
    {"backend_initialize", py_backend_initialize, METH_O, NULL},
    {"backend_attributes", py_backend_attributes, METH_O, NULL},
    {"backend_finalize", py_backend_finalize, METH_O, NULL},
    {"backend_unload", py_backend_unload, METH_O, NULL},
    {"model_new", py_model_new, METH_VARARGS,
     "model_new(backend, name, version, repository, config_json, output_names, decoupled)"},
    {"model_initialize", py_model_initialize, METH_O, NULL},
    {"model_finalize", py_model_finalize, METH_O, NULL},
    {"model_free", py_model_free, METH_O, NULL},
    {"instance_new", py_instance_new, METH_VARARGS,
     "instance_new(model, name, kind, device_id, host_policy, passive)"},
    {"instance_initialize", py_instance_initialize, METH_O, NULL},
    {"instance_finalize", py_instance_finalize, METH_O, NULL},
    {"instance_free", py_instance_free, METH_O, NULL},
    {"execute", py_execute, METH_VARARGS, "execute(instance, requests)"},
    {"take_statistics", py_take_statistics, METH_O, NULL},
    {"take_response_statistics", py_take_response_statistics, METH_O, NULL},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "libtritonserver",
                                        "modelhost's implementation of Triton's server C API.", -1,
                                        methods};

#define INTERN(var, text) \
  if ((var = PyUnicode_InternFromString(text)) == NULL) return NULL

MH_EXPORT PyObject* PyInit_libtritonserver(void) {
  INTERN(mh_attr_id, "id");
  INTERN(mh_attr_sequence_id, "sequence_id");
  INTERN(mh_attr_sequence_start, "sequence_start");
  INTERN(mh_attr_sequence_end, "sequence_end");
  INTERN(mh_attr_timeout_us, "timeout_us");
  INTERN(mh_attr_inputs, "inputs");
  INTERN(mh_attr_outputs, "outputs");
  INTERN(mh_attr_parameters, "parameters");
  INTERN(mh_attr_datatype, "datatype");
  INTERN(mh_attr_shape, "shape");
  INTERN(mh_attr_data, "data");
  INTERN(mh_attr_name, "name");
  INTERN(mh_attr_cancelled, "cancelled");
  if (PyType_Ready(&mh_BufferType) < 0) return NULL;
  PyObject* m = PyModule_Create(&module_def);
  if (m == NULL) return NULL;
  if (PyModule_AddFunctions(m, mh_cache_methods) < 0) return NULL;
  if (PyModule_AddFunctions(m, mh_batching_methods) < 0) return NULL;
  if (PyModule_AddFunctions(m, mh_repoagent_methods) < 0) return NULL;
  BridgeError = PyErr_NewException("host.native.libtritonserver.BridgeError", NULL, NULL);
  Py_INCREF(BridgeError);
  PyModule_AddObject(m, "BridgeError", BridgeError);
  Py_INCREF(&mh_BufferType);
  PyModule_AddObject(m, "Buffer", (PyObject*)&mh_BufferType);
  PyModule_AddIntConstant(m, "SERVER_API_MAJOR", TRITONSERVER_API_VERSION_MAJOR);
  PyModule_AddIntConstant(m, "SERVER_API_MINOR", TRITONSERVER_API_VERSION_MINOR);
  PyModule_AddIntConstant(m, "BACKEND_API_MAJOR", TRITONBACKEND_API_VERSION_MAJOR);
  PyModule_AddIntConstant(m, "BACKEND_API_MINOR", TRITONBACKEND_API_VERSION_MINOR);
  PyModule_AddIntConstant(m, "CACHE_API_MAJOR", TRITONCACHE_API_VERSION_MAJOR);
  PyModule_AddIntConstant(m, "CACHE_API_MINOR", TRITONCACHE_API_VERSION_MINOR);
  return m;
}
