/* Repository agents (Triton's TRITONREPOAGENT API: `model_repository_agents` in a model's
 * configuration, libraries `<repoagent directory>/<name>/libtritonrepoagent_<name>.so`).
 *
 * The host (host.native.repoagent) loads an agent library once, makes an agent model for each
 * model that names the agent, and sends it the lifecycle actions of that model: LOAD before the
 * model loads (an error fails the load), then LOAD_COMPLETE or LOAD_FAIL, UNLOAD and
 * UNLOAD_COMPLETE. An agent may point the load at other files (ModelRepositoryUpdate, usually a
 * folder it made with ModelRepositoryLocationAcquire); the host then loads from there. Every
 * call into the library runs without the GIL. */
#define _XOPEN_SOURCE 700 /* nftw */
#define _DEFAULT_SOURCE
#include <dlfcn.h>
#include <ftw.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define _COMPILING_TRITONREPOAGENT 1
#include "bridge.h"
#include "triton/core/tritonrepoagent.h"

#define AGENT_CAPSULE "modelhost.TRITONREPOAGENT_Agent"
#define AGENT_MODEL_CAPSULE "modelhost.TRITONREPOAGENT_AgentModel"

typedef TRITONSERVER_Error* (*mh_agent_fn)(TRITONREPOAGENT_Agent*);
typedef TRITONSERVER_Error* (*mh_agent_model_fn)(TRITONREPOAGENT_Agent*, TRITONREPOAGENT_AgentModel*);
typedef TRITONSERVER_Error* (*mh_agent_action_fn)(TRITONREPOAGENT_Agent*, TRITONREPOAGENT_AgentModel*,
                                                  const TRITONREPOAGENT_ActionType);

struct TRITONREPOAGENT_Agent {
  char* name;
  void* dl;
  void* state;
  mh_agent_fn initialize, finalize;
  mh_agent_model_fn model_initialize, model_finalize;
  mh_agent_action_fn model_action;
};

#define MH_MAX_ACQUIRED 16
struct TRITONREPOAGENT_AgentModel {
  TRITONREPOAGENT_Agent* agent;
  char* location;         /* where the model's files are now (updated by ModelRepositoryUpdate) */
  char* config_json;      /* the model's configuration as read from its files */
  uint32_t param_count;
  char** keys;
  char** values;
  void* state;
  char* acquired[MH_MAX_ACQUIRED]; /* folders made by LocationAcquire, removed at release/free */
  bool updated;           /* ModelRepositoryUpdate was called: the host loads from `location` */
};


static int remove_entry(const char* path, const struct stat* sb, int flag, struct FTW* ftw) {
  (void)sb, (void)flag, (void)ftw;
  return remove(path);
}

static void remove_tree(const char* path) { nftw(path, remove_entry, 16, FTW_DEPTH | FTW_PHYS); }

/* --- the API an agent calls ------------------------------------------------------------------ */

MH_EXPORT TRITONSERVER_Error* TRITONREPOAGENT_ApiVersion(uint32_t* major, uint32_t* minor) {
  *major = TRITONREPOAGENT_API_VERSION_MAJOR;
  *minor = TRITONREPOAGENT_API_VERSION_MINOR;
  return NULL;
}

MH_EXPORT TRITONSERVER_Error* TRITONREPOAGENT_ModelRepositoryLocation(
    TRITONREPOAGENT_Agent* agent, TRITONREPOAGENT_AgentModel* model,
    TRITONREPOAGENT_ArtifactType* artifact_type, const char** location) {
  (void)agent;
  *artifact_type = TRITONREPOAGENT_ARTIFACT_FILESYSTEM;
  *location = model->location;
  return NULL;
}

MH_EXPORT TRITONSERVER_Error* TRITONREPOAGENT_ModelRepositoryLocationAcquire(
    TRITONREPOAGENT_Agent* agent, TRITONREPOAGENT_AgentModel* model,
    const TRITONREPOAGENT_ArtifactType artifact_type, const char** location) {
  (void)agent;
  if (artifact_type != TRITONREPOAGENT_ARTIFACT_FILESYSTEM)
    return mh_error(TRITONSERVER_ERROR_UNSUPPORTED,
                    "only local file system is supported for repository agent locations");
  int slot = -1;
  for (int i = 0; i < MH_MAX_ACQUIRED; i++)
    if (model->acquired[i] == NULL) {
      slot = i;
      break;
    }
  if (slot < 0) return mh_error(TRITONSERVER_ERROR_UNAVAILABLE, "too many acquired locations");
  const char* tmp = getenv("TMPDIR");
  char templ[4096];
  snprintf(templ, sizeof(templ), "%s/modelhost-repoagent-XXXXXX", tmp && *tmp ? tmp : "/tmp");
  if (mkdtemp(templ) == NULL)
    return mh_error(TRITONSERVER_ERROR_INTERNAL, "failed to create a location for the agent");
  model->acquired[slot] = mh_strdup(templ);
  *location = model->acquired[slot];
  return NULL;
}

MH_EXPORT TRITONSERVER_Error* TRITONREPOAGENT_ModelRepositoryLocationRelease(
    TRITONREPOAGENT_Agent* agent, TRITONREPOAGENT_AgentModel* model, const char* location) {
  (void)agent;
  for (int i = 0; i < MH_MAX_ACQUIRED; i++)
    if (model->acquired[i] != NULL && strcmp(model->acquired[i], location) == 0) {
      remove_tree(model->acquired[i]);
      free(model->acquired[i]);
      model->acquired[i] = NULL;
      return NULL;
    }
  /* Only what the agent acquired is ever removed: never the model's own folder. */
  return mh_error(TRITONSERVER_ERROR_NOT_FOUND, "location %s was not acquired by the agent",
                  location);
}

MH_EXPORT TRITONSERVER_Error* TRITONREPOAGENT_ModelRepositoryUpdate(
    TRITONREPOAGENT_Agent* agent, TRITONREPOAGENT_AgentModel* model,
    const TRITONREPOAGENT_ArtifactType artifact_type, const char* location) {
  (void)agent;
  if (artifact_type != TRITONREPOAGENT_ARTIFACT_FILESYSTEM)
    return mh_error(TRITONSERVER_ERROR_UNSUPPORTED,
                    "only local file system is supported for repository agent locations");
  free(model->location);
  model->location = mh_strdup(location);
  model->updated = true;
  return NULL;
}

MH_EXPORT TRITONSERVER_Error* TRITONREPOAGENT_ModelParameterCount(TRITONREPOAGENT_Agent* agent,
                                                                  TRITONREPOAGENT_AgentModel* model,
                                                                  uint32_t* count) {
  (void)agent;
  *count = model->param_count;
  return NULL;
}

MH_EXPORT TRITONSERVER_Error* TRITONREPOAGENT_ModelParameter(TRITONREPOAGENT_Agent* agent,
                                                             TRITONREPOAGENT_AgentModel* model,
                                                             const uint32_t index,
                                                             const char** parameter_name,
                                                             const char** parameter_value) {
  (void)agent;
  if (index >= model->param_count)
    return mh_error(TRITONSERVER_ERROR_INVALID_ARG, "index out of range for model parameters");
  *parameter_name = model->keys[index];
  *parameter_value = model->values[index];
  return NULL;
}

MH_EXPORT TRITONSERVER_Error* TRITONREPOAGENT_ModelConfig(TRITONREPOAGENT_Agent* agent,
                                                          TRITONREPOAGENT_AgentModel* model,
                                                          const uint32_t config_version,
                                                          TRITONSERVER_Message** model_config) {
  (void)agent;
  if (config_version != 1)
    return mh_error(TRITONSERVER_ERROR_UNSUPPORTED,
                    "model configuration version %u not supported, supported versions are: 1",
                    config_version);
  *model_config = mh_message(model->config_json, strlen(model->config_json));
  return NULL;
}

MH_EXPORT TRITONSERVER_Error* TRITONREPOAGENT_ModelState(TRITONREPOAGENT_AgentModel* model,
                                                         void** state) {
  *state = model->state;
  return NULL;
}

MH_EXPORT TRITONSERVER_Error* TRITONREPOAGENT_ModelSetState(TRITONREPOAGENT_AgentModel* model,
                                                            void* state) {
  model->state = state;
  return NULL;
}

MH_EXPORT TRITONSERVER_Error* TRITONREPOAGENT_State(TRITONREPOAGENT_Agent* agent, void** state) {
  *state = agent->state;
  return NULL;
}

MH_EXPORT TRITONSERVER_Error* TRITONREPOAGENT_SetState(TRITONREPOAGENT_Agent* agent, void* state) {
  agent->state = state;
  return NULL;
}

/* --- the host's side --------------------------------------------------------------------------- */

/* agent_load(path, name) -> capsule: dlopen, then TRITONREPOAGENT_Initialize when defined. */
static PyObject* py_agent_load(PyObject* self, PyObject* args) {
  (void)self;
  const char *path, *name;
  if (!PyArg_ParseTuple(args, "ss", &path, &name)) return NULL;
  void* dl = NULL;
  TRITONSERVER_Error* err = mh_dlopen(path, "repository agent", &dl);
  if (err != NULL) return mh_raise_error(err);
  mh_agent_action_fn action = (mh_agent_action_fn)dlsym(dl, "TRITONREPOAGENT_ModelAction");
  if (action == NULL) {
    dlclose(dl);
    return mh_raise_error(mh_error(TRITONSERVER_ERROR_NOT_FOUND,
                                "unable to find required entrypoint 'TRITONREPOAGENT_ModelAction' "
                                "in repository agent library: %s",
                                path));
  }
  TRITONREPOAGENT_Agent* a = calloc(1, sizeof(*a));
  a->name = mh_strdup(name);
  a->dl = dl;
  a->model_action = action;
  a->initialize = (mh_agent_fn)dlsym(dl, "TRITONREPOAGENT_Initialize");
  a->finalize = (mh_agent_fn)dlsym(dl, "TRITONREPOAGENT_Finalize");
  a->model_initialize = (mh_agent_model_fn)dlsym(dl, "TRITONREPOAGENT_ModelInitialize");
  a->model_finalize = (mh_agent_model_fn)dlsym(dl, "TRITONREPOAGENT_ModelFinalize");
  if (a->initialize != NULL) {
    Py_BEGIN_ALLOW_THREADS err = a->initialize(a);
    Py_END_ALLOW_THREADS
  }
  if (err != NULL) {
    dlclose(dl);
    free(a->name);
    free(a);
    return mh_raise_error(err);
  }
  return PyCapsule_New(a, AGENT_CAPSULE, NULL);
}

/* agent_unload(agent): TRITONREPOAGENT_Finalize when defined, then dlclose. */
static PyObject* py_agent_unload(PyObject* self, PyObject* capsule) {
  (void)self;
  TRITONREPOAGENT_Agent* a = PyCapsule_GetPointer(capsule, AGENT_CAPSULE);
  if (a == NULL) return NULL;
  TRITONSERVER_Error* err = NULL;
  Py_BEGIN_ALLOW_THREADS if (a->finalize != NULL) err = a->finalize(a);
  dlclose(a->dl);
  Py_END_ALLOW_THREADS free(a->name);
  free(a);
  if (err != NULL) return mh_raise_error(err);
  Py_RETURN_NONE;
}

static void agent_model_free(TRITONREPOAGENT_AgentModel* m) {
  for (int i = 0; i < MH_MAX_ACQUIRED; i++)
    if (m->acquired[i] != NULL) {
      remove_tree(m->acquired[i]);
      free(m->acquired[i]);
    }
  for (uint32_t i = 0; i < m->param_count; i++) {
    free(m->keys[i]);
    free(m->values[i]);
  }
  free(m->keys);
  free(m->values);
  free(m->location);
  free(m->config_json);
  free(m);
}

/* agent_model_new(agent, location, config_json, [(key, value), ...]) -> capsule, after
 * TRITONREPOAGENT_ModelInitialize (its error is raised, and nothing is kept). */
static PyObject* py_agent_model_new(PyObject* self, PyObject* args) {
  (void)self;
  PyObject *capsule, *params;
  const char *location, *config;
  if (!PyArg_ParseTuple(args, "OssO", &capsule, &location, &config, &params)) return NULL;
  TRITONREPOAGENT_Agent* a = PyCapsule_GetPointer(capsule, AGENT_CAPSULE);
  if (a == NULL) return NULL;
  PyObject* seq = PySequence_Fast(params, "parameters must be a sequence of (key, value)");
  if (seq == NULL) return NULL;
  TRITONREPOAGENT_AgentModel* m = calloc(1, sizeof(*m));
  m->agent = a;
  m->location = mh_strdup(location);
  m->config_json = mh_strdup(config);
  Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
  m->keys = calloc(n ? (size_t)n : 1, sizeof(char*));
  m->values = calloc(n ? (size_t)n : 1, sizeof(char*));
  for (Py_ssize_t i = 0; i < n; i++) {
    const char *key, *value;
    if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(seq, i), "ss", &key, &value)) {
      Py_DECREF(seq);
      agent_model_free(m);
      return NULL;
    }
    m->keys[i] = mh_strdup(key);
    m->values[i] = mh_strdup(value);
    m->param_count = (uint32_t)(i + 1);
  }
  Py_DECREF(seq);
  TRITONSERVER_Error* err = NULL;
  if (a->model_initialize != NULL) {
    Py_BEGIN_ALLOW_THREADS err = a->model_initialize(a, m);
    Py_END_ALLOW_THREADS
  }
  if (err != NULL) {
    agent_model_free(m);
    return mh_raise_error(err);
  }
  return PyCapsule_New(m, AGENT_MODEL_CAPSULE, NULL);
}

/* agent_model_action(model, action) -> (location, updated); raises the agent's error. */
static PyObject* py_agent_model_action(PyObject* self, PyObject* args) {
  (void)self;
  PyObject* capsule;
  int action;
  if (!PyArg_ParseTuple(args, "Oi", &capsule, &action)) return NULL;
  TRITONREPOAGENT_AgentModel* m = PyCapsule_GetPointer(capsule, AGENT_MODEL_CAPSULE);
  if (m == NULL) return NULL;
  TRITONSERVER_Error* err;
  Py_BEGIN_ALLOW_THREADS err = m->agent->model_action(m->agent, m, (TRITONREPOAGENT_ActionType)action);
  Py_END_ALLOW_THREADS if (err != NULL) return mh_raise_error(err);
  return Py_BuildValue("(sO)", m->location, m->updated ? Py_True : Py_False);
}

/* agent_model_free(model): TRITONREPOAGENT_ModelFinalize when defined; the folders the agent
 * acquired and did not release are removed. */
static PyObject* py_agent_model_free(PyObject* self, PyObject* capsule) {
  (void)self;
  TRITONREPOAGENT_AgentModel* m = PyCapsule_GetPointer(capsule, AGENT_MODEL_CAPSULE);
  if (m == NULL) return NULL;
  TRITONSERVER_Error* err = NULL;
  Py_BEGIN_ALLOW_THREADS if (m->agent->model_finalize != NULL) err =
      m->agent->model_finalize(m->agent, m);
  Py_END_ALLOW_THREADS agent_model_free(m);
  if (err != NULL) return mh_raise_error(err);
  Py_RETURN_NONE;
}

PyMethodDef mh_repoagent_methods[] = {
    {"agent_load", py_agent_load, METH_VARARGS, "agent_load(path, name) -> agent"},
    {"agent_unload", py_agent_unload, METH_O, "agent_unload(agent)"},
    {"agent_model_new", py_agent_model_new, METH_VARARGS,
     "agent_model_new(agent, location, config_json, params) -> model"},
    {"agent_model_action", py_agent_model_action, METH_VARARGS,
     "agent_model_action(model, action) -> (location, updated)"},
    {"agent_model_free", py_agent_model_free, METH_O, "agent_model_free(model)"},
    {NULL, NULL, 0, NULL},
};
