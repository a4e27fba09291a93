/* Decode attention over the paged KV cache, float32 on the CPU (host/inflight/attention.py).
 *
 * One query token per request attends to that request's cached keys and values, which lie in
 * fixed-size blocks of one pool ([slots, kv_heads, dim] per layer; slot = block * block_size +
 * offset). Done with PyTorch operations, this costs a gather of every block, batched products
 * whose operands are a few kilobytes, and a dozen passes over the scores: on one core most of
 * that time is spent moving and dispatching, not multiplying (a decode step at 16 requests of
 * 100 tokens spent a quarter of its time there). Here each request's slots are read in place,
 * once per pass (a slot holds every KV head's vector side by side, so it is one run of memory),
 * with a two-pass softmax over a per-call buffer of scores.
 *
 * The caller (attention.py) checks dtypes, shapes and contiguity; the functions here trust them.
 * The GIL is released while they run. With several intra-op threads (PyTorch's setting, passed
 * in) and enough work, threads share the requests.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* The hot loop, compiled twice on x86-64 GCC (AVX2 + FMA, and the baseline) and picked at load
 * time by the CPU it runs on: the inner loops over the head dimension vectorize either way. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define CLONES
#endif

typedef struct {
  const float* q;      /* [n, heads, dim] */
  const float* keys;   /* [slots, kv_heads, dim] */
  const float* values; /* [slots, kv_heads, dim] */
  float* out;          /* [n, heads, dim] */
  const int64_t* blocks;  /* block ids of every request, request after request */
  const int64_t* starts;  /* [n + 1]: request i's blocks are blocks[starts[i] .. starts[i+1]) */
  const int64_t* lengths; /* [n]: tokens request i attends over (its cached ones + the new one) */
  int64_t n, heads, kv_heads, dim, block_size, window;
  float scale;
} decode_args;

/* Requests begin .. end-1; scores: heads x (longest length) floats, acc: heads x dim. */
CLONES static void decode(const decode_args* a, int64_t begin, int64_t end, float* scores, float* acc) {
  const int64_t heads = a->heads, group = heads / a->kv_heads, dim = a->dim, bs = a->block_size;
  const int64_t row = a->kv_heads * dim; /* floats per slot: every KV head's, side by side */
  for (int64_t i = begin; i < end; i++) {
    const int64_t len = a->lengths[i];
    const int64_t first = (a->window > 0 && len > a->window) ? len - a->window : 0;
    const int64_t count = len - first;
    const int64_t* table = a->blocks + a->starts[i];
    const float* q = a->q + i * heads * dim;
    /* pass 1: each token's slot is read once, whole, for every query head (scores [heads][count]) */
    for (int64_t t = first; t < len; t++) {
      const float* k = a->keys + (table[t / bs] * bs + t % bs) * row;
      for (int64_t h = 0; h < heads; h++) {
        const float* qh = q + h * dim;
        const float* kh = k + (h / group) * dim;
        float s = 0.0f;
#pragma omp simd reduction(+ : s)
        for (int64_t d = 0; d < dim; d++) s += qh[d] * kh[d];
        scores[h * count + (t - first)] = s * a->scale;
      }
    }
    /* softmax per query head */
    for (int64_t h = 0; h < heads; h++) {
      float* s = scores + h * count;
      float peak = -INFINITY, total = 0.0f;
      for (int64_t t = 0; t < count; t++) peak = s[t] > peak ? s[t] : peak;
      for (int64_t t = 0; t < count; t++) {
        s[t] = expf(s[t] - peak);
        total += s[t];
      }
      const float inv = 1.0f / total;
      for (int64_t t = 0; t < count; t++) s[t] *= inv;
    }
    /* pass 2: the weighted sum of the values, each slot read once */
    memset(acc, 0, (size_t)(heads * dim) * sizeof(float));
    for (int64_t t = first; t < len; t++) {
      const float* v = a->values + (table[t / bs] * bs + t % bs) * row;
      for (int64_t h = 0; h < heads; h++) {
        const float w = scores[h * count + (t - first)];
        const float* vh = v + (h / group) * dim;
        float* o = acc + h * dim;
#pragma omp simd
        for (int64_t d = 0; d < dim; d++) o[d] += w * vh[d];
      }
    }
    memcpy(a->out + i * heads * dim, acc, (size_t)(heads * dim) * sizeof(float));
  }
}

static void* pointer(PyObject* value) { return PyLong_AsVoidPtr(value); }

/* Several threads (the caller's intra-op thread count) split the requests when there is enough
 * work to pay for starting them: parts of about equal tokens, one per thread. */
#define MIN_WORK_PER_THREAD 32768 /* token x query-head pairs */

typedef struct {
  const decode_args* args;
  int64_t begin, end;
  float *scores, *acc;
} part_t;

static void* run_part(void* p) {
  part_t* part = p;
  decode(part->args, part->begin, part->end, part->scores, part->acc);
  return NULL;
}

static void decode_parallel(const decode_args* a, int threads, int64_t longest, float* buffer) {
  part_t parts[64];
  pthread_t ids[64];
  int started[64] = {0};
  const int64_t per = a->heads * longest + a->heads * a->dim;
  int64_t total = 0, done = 0, at = 0;
  for (int64_t i = 0; i < a->n; i++) total += a->lengths[i];
  for (int k = 0; k < threads; k++) {
    const int64_t goal = total * (k + 1) / threads;
    const int64_t begin = at;
    while (at < a->n && (done < goal || at == begin)) done += a->lengths[at++];
    if (k == threads - 1) at = a->n;
    parts[k] = (part_t){a, begin, at, buffer + k * per, buffer + k * per + a->heads * longest};
  }
  for (int k = 0; k < threads - 1; k++)
    if (parts[k].begin < parts[k].end)
      started[k] = pthread_create(&ids[k], NULL, run_part, &parts[k]) == 0;
  for (int k = 0; k < threads - 1; k++)
    if (!started[k] && parts[k].begin < parts[k].end) run_part(&parts[k]); /* could not start one */
  run_part(&parts[threads - 1]);
  for (int k = 0; k < threads - 1; k++)
    if (started[k]) pthread_join(ids[k], NULL);
}

/* decode(q, keys, values, out, blocks, starts, lengths, n, heads, kv_heads, dim, block_size,
 *        window, scale, threads): the data pointers of contiguous float32 / int64 tensors, then
 * sizes, the softmax scale and how many threads may share the work. */
static PyObject* py_decode(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 15) {
    PyErr_SetString(PyExc_TypeError, "decode() takes 15 arguments");
    return NULL;
  }
  decode_args a;
  a.q = pointer(args[0]);
  a.keys = pointer(args[1]);
  a.values = pointer(args[2]);
  a.out = pointer(args[3]);
  a.blocks = pointer(args[4]);
  a.starts = pointer(args[5]);
  a.lengths = pointer(args[6]);
  int64_t* sizes[] = {&a.n, &a.heads, &a.kv_heads, &a.dim, &a.block_size, &a.window};
  for (int i = 0; i < 6; i++) *sizes[i] = PyLong_AsLongLong(args[7 + i]);
  a.scale = (float)PyFloat_AsDouble(args[13]);
  long threads = PyLong_AsLong(args[14]);
  if (PyErr_Occurred()) return NULL;
  if (a.n < 0 || a.kv_heads <= 0 || a.heads % a.kv_heads || a.dim <= 0 || a.block_size <= 0) {
    PyErr_SetString(PyExc_ValueError, "decode(): bad sizes");
    return NULL;
  }
  int64_t longest = 0;
  for (int64_t i = 0; i < a.n; i++) {
    if (a.lengths[i] <= 0) {
      PyErr_SetString(PyExc_ValueError, "decode(): a request attends over no token");
      return NULL;
    }
    longest = a.lengths[i] > longest ? a.lengths[i] : longest;
  }
  if (longest == 0) longest = 1;
  int64_t work = 0;
  for (int64_t i = 0; i < a.n; i++) work += a.lengths[i] * a.heads;
  if (threads > 64) threads = 64;
  if (threads > a.n) threads = (long)a.n;
  if (threads > work / MIN_WORK_PER_THREAD) threads = (long)(work / MIN_WORK_PER_THREAD);
  if (threads < 1) threads = 1;
  float* buffer = malloc((size_t)(threads * (a.heads * longest + a.heads * a.dim)) * sizeof(float));
  if (!buffer) return PyErr_NoMemory();
  Py_BEGIN_ALLOW_THREADS;
  if (threads == 1)
    decode(&a, 0, a.n, buffer, buffer + a.heads * longest);
  else
    decode_parallel(&a, (int)threads, longest, buffer);
  Py_END_ALLOW_THREADS;
  free(buffer);
  Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"decode", (PyCFunction)(void (*)(void))py_decode, METH_FASTCALL,
     "Decode attention of one query per request over its paged keys and values (float32)."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_attention", NULL, -1, methods};

PyMODINIT_FUNC PyInit__attention(void) { return PyModule_Create(&module); }
