/* Fused parameter-server update rules (optional C extension; hpcrl.optim falls back to numpy):
 * AdaGrad, RMSProp, SGD with momentum and Adam.
 *
 * The numpy form of an AdaGrad / RMSProp step makes 8-9 passes over the shard (g*g, scale,
 * accumulate, +eps, sqrt, divide, *lr, subtract), each writing a temporary. Here it is one pass
 * reading theta_in, grad, acc and writing acc, theta_out: measured 1.6 -> 0.8 ms for a 677 k-float
 * A3C shard. The ps rank of an asynchronous job applies every actor-learner's gradient, so this is
 * the CPU it takes away from the actor-learners on a shared node.
 *
 * Arithmetic is float32 in the same order as the numpy path:
 *   acc = decay * acc + (1 - decay) * g*g      (rmsprop)     acc = acc + g*g   (adagrad)
 *   theta_out = theta_in - lr * (g / sqrt(acc + eps))
 * GCC may contract a*b+c into an FMA, so results can differ from numpy in the last bit.
 *
 * Statistics below FLT_MIN are stored as 0, and on x86 the loop runs with flush-to-zero and
 * denormals-are-zero set (MXCSR restored after). A unit that stops getting gradients (a dead
 * ReLU) decays its RMSProp statistics by 0.99 per step into the denormal range, where every
 * float operation takes a microcode assist: an A3C Pong run whose conv layers had died had 78 %
 * of its statistics denormal and its ps at 60 % of a core instead of about 14 %.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <float.h>
#include <math.h>
#if defined(__SSE__) || defined(__x86_64__)
#include <xmmintrin.h>
#define HPCRL_MXCSR 1
#endif

/* Flush-to-zero (MXCSR bit 15) and denormals-are-zero (bit 6) for one loop, restored after. */
#ifdef HPCRL_MXCSR
#define FTZ_BEGIN const unsigned int saved_csr = _mm_getcsr(); _mm_setcsr(saved_csr | 0x8040);
#define FTZ_END _mm_setcsr(saved_csr);
#else
#define FTZ_BEGIN
#define FTZ_END
#endif

/* One buffer argument of a kernel: its name in errors, its struct format and element size. */
typedef struct {
    const char *name;
    const char *format; /* "f" float32, "d" float64 */
    int writable;
} BufSpec;

#define MAX_BUFS 5

/* A kernel's loop: the buffers in BufSpec order, the element count, the kernel's constants. */
typedef void (*LoopFn)(void *const *bufs, Py_ssize_t n, const double *c);

/* Takes every buffer (all or none: a failure releases those already taken and sets the error),
 * checks each is C-contiguous with its format and that format's C size, and that all hold the
 * same number of elements. */
static int take_buffers(PyObject *const *objs, const BufSpec *specs, int count, Py_buffer *b,
                        Py_ssize_t *n, const char *names) {
    for (int i = 0; i < count; i++) {
        int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (specs[i].writable ? PyBUF_WRITABLE : 0);
        int ok = PyObject_GetBuffer(objs[i], &b[i], flags) == 0;
        const Py_ssize_t size = specs[i].format[0] == 'f' ? sizeof(float) : sizeof(double);
        if (ok && (b[i].format == NULL || strcmp(b[i].format, specs[i].format) != 0 ||
                   b[i].itemsize != size)) {
            PyErr_Format(PyExc_TypeError, "%s must be a contiguous %s buffer", specs[i].name,
                         specs[i].format[0] == 'f' ? "float32" : "float64");
            PyBuffer_Release(&b[i]);
            ok = 0;
        }
        if (!ok) {
            while (i-- > 0) PyBuffer_Release(&b[i]);
            return -1;
        }
    }
    *n = b[0].len / b[0].itemsize;
    for (int i = 1; i < count; i++) {
        if (b[i].len / b[i].itemsize != *n) {
            PyErr_Format(PyExc_ValueError, "%s differ in size", names);
            for (int j = 0; j < count; j++) PyBuffer_Release(&b[j]);
            return -1;
        }
    }
    return 0;
}

/* Runs `loop` over the buffers without the GIL (with flush-to-zero where `ftz`), then releases
 * them: the part every kernel shares. */
static PyObject *run_kernel(PyObject *const *objs, const BufSpec *specs, int count,
                            const char *names, LoopFn loop, const double *c, int ftz) {
    Py_buffer b[MAX_BUFS];
    void *bufs[MAX_BUFS];
    Py_ssize_t n;
    if (take_buffers(objs, specs, count, b, &n, names) < 0) return NULL;
    for (int i = 0; i < count; i++) bufs[i] = b[i].buf;
    Py_BEGIN_ALLOW_THREADS
    if (ftz) {
        FTZ_BEGIN
        loop(bufs, n, c);
        FTZ_END
    } else {
        loop(bufs, n, c);
    }
    Py_END_ALLOW_THREADS
    for (int i = 0; i < count; i++) PyBuffer_Release(&b[i]);
    Py_RETURN_NONE;
}

/* Each loop is compiled for AVX-512 and AVX2 besides the baseline and picked at load time by the
 * CPU (GCC's target_clones): the baseline x86-64 build has 4-float vectors, in which the sqrt
 * and the divide of 0.68 M floats take most of a step; the wider ones cut it (docs/performance.md).
 * FMA contraction in the AVX2/AVX-512 versions changes at most the last bit (as said above). */
#if defined(__GNUC__) && defined(__x86_64__) && !defined(__clang__)
#define HPCRL_CLONES __attribute__((target_clones("arch=x86-64-v4", "avx2", "default")))
#else
#define HPCRL_CLONES
#endif

/* Each loop is a function with restrict parameters: GCC takes restrict from function parameters
 * (not from a block's locals), and without it four or five arrays need alias checks that it may
 * not version a loop for (the Adam loop stayed scalar that way: 4x the RMSProp kernel's time). */

HPCRL_CLONES
static void scaled_loop(Py_ssize_t n, const float *restrict th, const float *restrict g,
                        float *restrict acc, float *restrict out, float a, float b, float eps,
                        float lr) {
    for (Py_ssize_t i = 0; i < n; i++) {
        float gi = g[i];
        float ai = a * acc[i] + b * (gi * gi);
        ai = ai < FLT_MIN ? 0.0f : ai; /* acc >= 0: no denormal is ever stored */
        acc[i] = ai;
        out[i] = th[i] - lr * (gi / sqrtf(ai + eps));
    }
}

static void scaled_bufs(void *const *p, Py_ssize_t n, const double *c) {
    scaled_loop(n, p[0], p[1], p[2], p[3], (float)c[0], (float)c[1], (float)c[2], (float)c[3]);
}

/* scaled_step(theta_in, grad, acc, theta_out, decay, eps, lr, adagrad) */
static PyObject *scaled_step(PyObject *self, PyObject *args) {
    static const BufSpec specs[4] = {
        {"theta_in", "f", 0}, {"grad", "f", 0}, {"acc", "f", 1}, {"theta_out", "f", 1}};
    PyObject *o[4];
    double decay;
    float eps, lr;
    int adagrad;
    if (!PyArg_ParseTuple(args, "OOOOdffp", &o[0], &o[1], &o[2], &o[3], &decay, &eps, &lr,
                          &adagrad))
        return NULL;
    /* 1 - decay in double, then rounded, as numpy's float32(1.0 - decay) */
    const double c[4] = {adagrad ? 1.0f : (float)decay, adagrad ? 1.0f : (float)(1.0 - decay),
                         eps, lr};
    return run_kernel(o, specs, 4, "theta_in, grad, acc and theta_out", scaled_bufs, c, 1);
}

/* adagrad_step(theta_in, grad, acc, theta_out, eps, lr): AdaGrad with a float64 accumulator.
 * G only grows: in float32, G + g*g == G once G / g*g passes 2^24 (about 1.7e7 steps of similar
 * size), and Gorila's long runs take more steps than that; in float64 the bound is 2^53.
 *   acc = acc + g*g (in double);  theta_out = theta_in - lr * g / sqrt(acc + eps)
 * The step itself is computed in float: its inputs and result are float32 anyway, and a
 * float32 sqrt and divide run at twice the vector width of double ones (the step was ~60 %
 * of the ps's time per gradient in double on a Nature-DQN shard). No flush-to-zero: the
 * accumulator only grows. */
HPCRL_CLONES
static void adagrad_loop(Py_ssize_t n, const float *restrict th, const float *restrict g,
                         double *restrict acc, float *restrict out, double eps, float lr) {
    for (Py_ssize_t i = 0; i < n; i++) {
        const float gi = g[i];
        const double ai = acc[i] + (double)gi * (double)gi;
        acc[i] = ai;
        out[i] = th[i] - lr * (gi / sqrtf((float)(ai + eps)));
    }
}

static void adagrad_bufs(void *const *p, Py_ssize_t n, const double *c) {
    adagrad_loop(n, p[0], p[1], p[2], p[3], c[0], (float)c[1]);
}

static PyObject *adagrad_step(PyObject *self, PyObject *args) {
    static const BufSpec specs[4] = {
        {"theta_in", "f", 0}, {"grad", "f", 0}, {"acc", "d", 1}, {"theta_out", "f", 1}};
    PyObject *o[4];
    double c[2]; /* eps, lr */
    if (!PyArg_ParseTuple(args, "OOOOdd", &o[0], &o[1], &o[2], &o[3], &c[0], &c[1]))
        return NULL;
    return run_kernel(o, specs, 4, "theta_in, grad, acc and theta_out", adagrad_bufs, c, 0);
}

/* momentum_step(theta_in, grad, m, theta_out, momentum, lr): one fused step of SGD with
 * momentum (Mnih et al. 2016, S7), m being one client's own float32 buffer:
 *   m = momentum * m + (1 - momentum) * g;  theta_out = theta_in - lr * m
 * Five numpy passes over the shard in one; |m| below FLT_MIN is stored as 0 (a dead unit's m
 * decays by the momentum per step into the denormal range, as RMSProp's statistic does). */
HPCRL_CLONES
static void momentum_loop(Py_ssize_t n, const float *restrict th, const float *restrict g,
                          float *restrict m, float *restrict out, float keep, float take,
                          float lr) {
    for (Py_ssize_t i = 0; i < n; i++) {
        float mi = keep * m[i] + take * g[i];
        mi = fabsf(mi) < FLT_MIN ? 0.0f : mi;
        m[i] = mi;
        out[i] = th[i] - lr * mi;
    }
}

static void momentum_bufs(void *const *p, Py_ssize_t n, const double *c) {
    momentum_loop(n, p[0], p[1], p[2], p[3], (float)c[0], (float)c[1], (float)c[2]);
}

static PyObject *momentum_step(PyObject *self, PyObject *args) {
    static const BufSpec specs[4] = {
        {"theta_in", "f", 0}, {"grad", "f", 0}, {"m", "f", 1}, {"theta_out", "f", 1}};
    PyObject *o[4];
    double mom;
    float lr;
    if (!PyArg_ParseTuple(args, "OOOOdf", &o[0], &o[1], &o[2], &o[3], &mom, &lr)) return NULL;
    /* 1 - momentum in double, then rounded, as numpy's float32(1.0 - momentum) */
    const double c[3] = {(float)mom, (float)(1.0 - mom), lr};
    return run_kernel(o, specs, 4, "theta_in, grad, m and theta_out", momentum_bufs, c, 1);
}

/* adam_step(theta_in, grad, m, v, theta_out, beta1, beta2, eps, lr): one fused step of Adam
 * (Kingma & Ba 2015) with both moments shared by every client, as the shared Adam that
 * one-environment A3C reproductions run; the bias correction is folded into lr and eps by the
 * caller (lr sqrt(c2) / c1, eps c2), eps inside the square root as for RMSProp:
 *   m = beta1 m + (1 - beta1) g;  v = beta2 v + (1 - beta2) g*g
 *   theta_out = theta_in - lr * (m / sqrt(v + eps))
 * |m| and v below FLT_MIN are stored as 0, as the other kernels' statistics. */
HPCRL_CLONES
static void adam_loop(Py_ssize_t n, const float *restrict th, const float *restrict g,
                      float *restrict m, float *restrict v, float *restrict out, float k1,
                      float t1, float k2, float t2, float eps, float lr) {
    for (Py_ssize_t i = 0; i < n; i++) {
        const float gi = g[i];
        float mi = k1 * m[i] + t1 * gi;
        mi = fabsf(mi) < FLT_MIN ? 0.0f : mi;
        float vi = k2 * v[i] + t2 * (gi * gi);
        vi = vi < FLT_MIN ? 0.0f : vi;
        m[i] = mi;
        v[i] = vi;
        out[i] = th[i] - lr * (mi / sqrtf(vi + eps));
    }
}

static void adam_bufs(void *const *p, Py_ssize_t n, const double *c) {
    adam_loop(n, p[0], p[1], p[2], p[3], p[4], (float)c[0], (float)c[1], (float)c[2],
              (float)c[3], (float)c[4], (float)c[5]);
}

static PyObject *adam_step(PyObject *self, PyObject *args) {
    static const BufSpec specs[5] = {{"theta_in", "f", 0}, {"grad", "f", 0}, {"m", "f", 1},
                                     {"v", "f", 1}, {"theta_out", "f", 1}};
    PyObject *o[5];
    double beta1, beta2;
    float eps, lr;
    if (!PyArg_ParseTuple(args, "OOOOOddff", &o[0], &o[1], &o[2], &o[3], &o[4], &beta1, &beta2,
                          &eps, &lr))
        return NULL;
    /* 1 - beta in double, then rounded, as numpy's float32(1.0 - beta) */
    const double c[6] = {(float)beta1, (float)(1.0 - beta1), (float)beta2, (float)(1.0 - beta2),
                         eps, lr};
    return run_kernel(o, specs, 5, "theta_in, grad, m, v and theta_out", adam_bufs, c, 1);
}

static PyMethodDef methods[] = {
    {"scaled_step", scaled_step, METH_VARARGS,
     "scaled_step(theta_in, grad, acc, theta_out, decay, eps, lr, adagrad): one fused "
     "AdaGrad (adagrad=True) or RMSProp step over float32 buffers of one size."},
    {"adagrad_step", adagrad_step, METH_VARARGS,
     "adagrad_step(theta_in, grad, acc, theta_out, eps, lr): one fused AdaGrad step, float32 "
     "parameters and gradient, float64 accumulator."},
    {"momentum_step", momentum_step, METH_VARARGS,
     "momentum_step(theta_in, grad, m, theta_out, momentum, lr): one fused step of SGD with "
     "momentum over float32 buffers of one size."},
    {"adam_step", adam_step, METH_VARARGS,
     "adam_step(theta_in, grad, m, v, theta_out, beta1, beta2, eps, lr): one fused Adam step "
     "over float32 buffers of one size (bias correction folded into lr and eps)."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_kernels",
                                    "Fused ps update rules (see hpcrl/_kernels.c).", -1, methods};

PyMODINIT_FUNC PyInit__kernels(void) { return PyModule_Create(&module); }
