/* Test repository agent (Triton's TRITONREPOAGENT API), used by tests/test_repoagent.py. Its behaviour comes from the agent's parameters in the model's
 * configuration:
 *   LOG=<file>         every call appends a line: "<call> <model folder name> ..."
 *   REQUIRE=<relative> LOAD fails (INVALID_ARG "missing required file <relative>") unless the
 *                      model folder holds that file
 *   RELOCATE=1         LOAD copies the model folder (one level of subfolders) into a location it
 *                      acquires and points the load there (ModelRepositoryUpdate); it releases the
 *                      location at UNLOAD_COMPLETE
 *   FAIL=<action>      that action (LOAD, UNLOAD, ...) returns an error */
#define _DEFAULT_SOURCE
#include <dirent.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "triton/core/tritonrepoagent.h"

typedef struct {
  char log[1024];
  char require[256];
  char fail[32];
  int relocate;
  char acquired[4096];
} model_t;

static const char* ACTIONS[] = {"LOAD", "LOAD_COMPLETE", "LOAD_FAIL", "UNLOAD", "UNLOAD_COMPLETE"};

static void note(const model_t* m, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
static void note(const model_t* m, const char* fmt, ...) {
  if (m == NULL || m->log[0] == '\0') return;
  FILE* f = fopen(m->log, "a");
  if (f == NULL) return;
  va_list args;
  va_start(args, fmt);
  vfprintf(f, fmt, args);
  va_end(args);
  fputc('\n', f);
  fclose(f);
}

static const char* base_name(const char* path) {
  const char* slash = strrchr(path, '/');
  return slash ? slash + 1 : path;
}

static int copy_file(const char* from, const char* to) {
  FILE* in = fopen(from, "rb");
  if (in == NULL) return -1;
  FILE* out = fopen(to, "wb");
  if (out == NULL) {
    fclose(in);
    return -1;
  }
  char buf[8192];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), in)) > 0) fwrite(buf, 1, n, out);
  fclose(in);
  fclose(out);
  return 0;
}

/* Copy the files of `from` and of its direct subfolders into `to`. */
static int copy_tree(const char* from, const char* to, int depth) {
  DIR* d = opendir(from);
  if (d == NULL) return -1;
  struct dirent* e;
  char src[4096], dst[4096];
  while ((e = readdir(d)) != NULL) {
    if (e->d_name[0] == '.') continue;
    snprintf(src, sizeof(src), "%s/%s", from, e->d_name);
    snprintf(dst, sizeof(dst), "%s/%s", to, e->d_name);
    struct stat st;
    if (stat(src, &st) != 0) continue;
    if (S_ISDIR(st.st_mode)) {
      if (depth > 0) {
        mkdir(dst, 0755);
        copy_tree(src, dst, depth - 1);
      }
    } else {
      copy_file(src, dst);
    }
  }
  closedir(d);
  return 0;
}

TRITONSERVER_Error* TRITONREPOAGENT_Initialize(TRITONREPOAGENT_Agent* agent) {
  uint32_t major = 0, minor = 0;
  TRITONSERVER_Error* err = TRITONREPOAGENT_ApiVersion(&major, &minor);
  if (err != NULL) return err;
  if (major != TRITONREPOAGENT_API_VERSION_MAJOR || minor < TRITONREPOAGENT_API_VERSION_MINOR)
    return TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_UNSUPPORTED, "API version mismatch");
  static int count = 0;
  count++;
  return TRITONREPOAGENT_SetState(agent, &count);
}

TRITONSERVER_Error* TRITONREPOAGENT_Finalize(TRITONREPOAGENT_Agent* agent) {
  (void)agent;
  return NULL;
}

TRITONSERVER_Error* TRITONREPOAGENT_ModelInitialize(TRITONREPOAGENT_Agent* agent,
                                                   TRITONREPOAGENT_AgentModel* model) {
  model_t* m = calloc(1, sizeof(*m));
  uint32_t count = 0;
  TRITONREPOAGENT_ModelParameterCount(agent, model, &count);
  for (uint32_t i = 0; i < count; i++) {
    const char *key, *value;
    TRITONREPOAGENT_ModelParameter(agent, model, i, &key, &value);
    if (strcmp(key, "LOG") == 0) snprintf(m->log, sizeof(m->log), "%s", value);
    if (strcmp(key, "REQUIRE") == 0) snprintf(m->require, sizeof(m->require), "%s", value);
    if (strcmp(key, "FAIL") == 0) snprintf(m->fail, sizeof(m->fail), "%s", value);
    if (strcmp(key, "RELOCATE") == 0) m->relocate = atoi(value);
  }
  TRITONREPOAGENT_ArtifactType type;
  const char* location;
  TRITONREPOAGENT_ModelRepositoryLocation(agent, model, &type, &location);
  TRITONSERVER_Message* config = NULL;
  const char* json = "";
  size_t size = 0;
  if (TRITONREPOAGENT_ModelConfig(agent, model, 1, &config) == NULL)
    TRITONSERVER_MessageSerializeToJson(config, &json, &size);
  int* agent_state = NULL;
  TRITONREPOAGENT_State(agent, (void**)&agent_state);
  note(m, "model_init %s config_has_name=%d agent_inits=%d", base_name(location),
       strstr(json, "\"name\"") != NULL, agent_state ? *agent_state : -1);
  if (config != NULL) TRITONSERVER_MessageDelete(config);
  return TRITONREPOAGENT_ModelSetState(model, m);
}

TRITONSERVER_Error* TRITONREPOAGENT_ModelFinalize(TRITONREPOAGENT_Agent* agent,
                                                 TRITONREPOAGENT_AgentModel* model) {
  (void)agent;
  model_t* m = NULL;
  TRITONREPOAGENT_ModelState(model, (void**)&m);
  note(m, "model_fini");
  free(m);
  return NULL;
}

TRITONSERVER_Error* TRITONREPOAGENT_ModelAction(TRITONREPOAGENT_Agent* agent,
                                               TRITONREPOAGENT_AgentModel* model,
                                               const TRITONREPOAGENT_ActionType action) {
  model_t* m = NULL;
  TRITONREPOAGENT_ModelState(model, (void**)&m);
  TRITONREPOAGENT_ArtifactType type;
  const char* location;
  TRITONREPOAGENT_ModelRepositoryLocation(agent, model, &type, &location);
  const char* name = ACTIONS[action];
  note(m, "%s %s", name, base_name(location));
  if (strcmp(m->fail, name) == 0)
    return TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_INTERNAL, "test agent failed as asked");
  if (action == TRITONREPOAGENT_ACTION_LOAD && m->require[0] != '\0') {
    char path[4096];
    struct stat st;
    snprintf(path, sizeof(path), "%s/%s", location, m->require);
    if (stat(path, &st) != 0) {
      char message[512];
      snprintf(message, sizeof(message), "missing required file %s", m->require);
      return TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_INVALID_ARG, message);
    }
  }
  if (action == TRITONREPOAGENT_ACTION_LOAD && m->relocate) {
    const char* acquired;
    TRITONSERVER_Error* err = TRITONREPOAGENT_ModelRepositoryLocationAcquire(
        agent, model, TRITONREPOAGENT_ARTIFACT_FILESYSTEM, &acquired);
    if (err != NULL) return err;
    snprintf(m->acquired, sizeof(m->acquired), "%s", acquired);
    copy_tree(location, m->acquired, 1);
    note(m, "relocated %s", m->acquired);
    return TRITONREPOAGENT_ModelRepositoryUpdate(agent, model, TRITONREPOAGENT_ARTIFACT_FILESYSTEM,
                                                 m->acquired);
  }
  if (action == TRITONREPOAGENT_ACTION_UNLOAD_COMPLETE && m->acquired[0] != '\0') {
    TRITONSERVER_Error* err =
        TRITONREPOAGENT_ModelRepositoryLocationRelease(agent, model, m->acquired);
    if (err != NULL) return err;
    m->acquired[0] = '\0';
  }
  return NULL;
}
