/* SIGBUS guard for client shared-memory mappings.
 *
 * A client can shrink (ftruncate) the object under a region it registered. The host checks the
 * object's size before each access (host/shm/system.py), but a shrink in the instant between the
 * check and the access would still kill the process with SIGBUS. This handler turns such a fault
 * into a harmless one, as Wayland compositors do for their clients' pools: when the faulting
 * address lies in a guarded mapping, a private zero page is mapped over it (so the access that
 * faulted completes) and the mapping is marked faulted, which the host reports as the region's
 * error. A fault anywhere else goes to the handler that was there before (or the default one).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define MAX_RANGES 4096

typedef struct {
  _Atomic uintptr_t start; /* 0: free slot */
  _Atomic uintptr_t end;
  _Atomic int faulted;
} range_t;

static range_t ranges[MAX_RANGES];
static struct sigaction previous;
static int installed = 0;
static long page_size = 4096;

static void on_sigbus(int sig, siginfo_t* info, void* context) {
  uintptr_t addr = (uintptr_t)info->si_addr;
  for (int i = 0; i < MAX_RANGES; i++) {
    uintptr_t start = atomic_load(&ranges[i].start);
    if (start == 0 || addr < start || addr >= atomic_load(&ranges[i].end)) continue;
    void* page = (void*)(addr & ~((uintptr_t)page_size - 1));
    if (mmap(page, (size_t)page_size, PROT_READ | PROT_WRITE,
             MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS, -1, 0) != MAP_FAILED) {
      atomic_store(&ranges[i].faulted, 1);
      return; /* the faulting access is retried, now on the zero page */
    }
    break;
  }
  /* Not ours: hand it to the previous handler (re-raised on return with it in place). */
  sigaction(SIGBUS, &previous, NULL);
}

static int install(void) {
  if (installed) return 0;
  struct sigaction action;
  memset(&action, 0, sizeof(action));
  action.sa_sigaction = on_sigbus;
  action.sa_flags = SA_SIGINFO | SA_NODEFER;
  sigemptyset(&action.sa_mask);
  if (sigaction(SIGBUS, &action, &previous) != 0) return -1;
  page_size = sysconf(_SC_PAGESIZE);
  installed = 1;
  return 0;
}

/* guard(address, length) -> slot */
static PyObject* guard(PyObject* self, PyObject* args) {
  unsigned long long start, length;
  if (!PyArg_ParseTuple(args, "KK", &start, &length)) return NULL;
  if (install() != 0) return PyErr_SetFromErrno(PyExc_OSError);
  for (int i = 0; i < MAX_RANGES; i++) {
    uintptr_t expected = 0;
    atomic_store(&ranges[i].end, (uintptr_t)(start + length));
    atomic_store(&ranges[i].faulted, 0);
    if (atomic_compare_exchange_strong(&ranges[i].start, &expected, (uintptr_t)start))
      return PyLong_FromLong(i);
  }
  return PyLong_FromLong(-1); /* full: the size check alone protects this one */
}

static PyObject* unguard(PyObject* self, PyObject* args) {
  int slot;
  if (!PyArg_ParseTuple(args, "i", &slot)) return NULL;
  if (slot >= 0 && slot < MAX_RANGES) atomic_store(&ranges[slot].start, 0);
  Py_RETURN_NONE;
}

static PyObject* faulted(PyObject* self, PyObject* args) {
  int slot;
  if (!PyArg_ParseTuple(args, "i", &slot)) return NULL;
  if (slot < 0 || slot >= MAX_RANGES) Py_RETURN_FALSE;
  return PyBool_FromLong(atomic_load(&ranges[slot].faulted));
}

static PyMethodDef methods[] = {
    {"guard", guard, METH_VARARGS, "guard(address, length) -> slot: survive SIGBUS in the range"},
    {"unguard", unguard, METH_VARARGS, "unguard(slot)"},
    {"faulted", faulted, METH_VARARGS, "faulted(slot) -> whether an access in the range faulted"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_guard", NULL, -1, methods};

PyMODINIT_FUNC PyInit__guard(void) { return PyModule_Create(&module); }
