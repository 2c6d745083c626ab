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

static int get_buf(PyObject *obj, Py_buffer *view, int writable, const char *name,
                   const char *format, const char *what) {
    if (PyObject_GetBuffer(obj, view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT |
                           (writable ? PyBUF_WRITABLE : 0)) < 0)
        return -1;
    if (view->format == NULL || strcmp(view->format, format) != 0) {
        PyErr_Format(PyExc_TypeError, "%s must be a contiguous %s buffer", name, what);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

static int get_f32(PyObject *obj, Py_buffer *view, int writable, const char *name) {
    return get_buf(obj, view, writable, name, "f", "float32");
}

/* theta_in, grad (float32, read), acc (acc_format, written), theta_out (float32, written):
 * all four buffers or none (a failure releases those already taken and sets the error). */
static int get_four(PyObject *o_in, PyObject *o_g, PyObject *o_acc, PyObject *o_out,
                    Py_buffer *b, const char *acc_format, const char *acc_what) {
    if (get_f32(o_in, &b[0], 0, "theta_in") < 0) return -1;
    if (get_f32(o_g, &b[1], 0, "grad") < 0) { PyBuffer_Release(&b[0]); return -1; }
    if (get_buf(o_acc, &b[2], 1, "acc", acc_format, acc_what) < 0) {
        PyBuffer_Release(&b[0]); PyBuffer_Release(&b[1]); return -1;
    }
    if (get_f32(o_out, &b[3], 1, "theta_out") < 0) {
        PyBuffer_Release(&b[0]); PyBuffer_Release(&b[1]); PyBuffer_Release(&b[2]); return -1;
    }
    return 0;
}

static void release_four(Py_buffer *b) {
    for (int i = 0; i < 4; i++) PyBuffer_Release(&b[i]);
}

/* scaled_step(theta_in, grad, acc, theta_out, decay, eps, lr, adagrad) */
static PyObject *scaled_step(PyObject *self, PyObject *args) {
    PyObject *o_in, *o_g, *o_acc, *o_out;
    double decay;
    float eps, lr;
    int adagrad;
    if (!PyArg_ParseTuple(args, "OOOOdffp", &o_in, &o_g, &o_acc, &o_out, &decay, &eps, &lr,
                          &adagrad))
        return NULL;
    Py_buffer b[4];
    if (get_four(o_in, o_g, o_acc, o_out, b, "f", "float32") < 0) return NULL;
    Py_buffer b_in = b[0], b_g = b[1], b_acc = b[2], b_out = b[3];
    Py_ssize_t n = b_in.len / 4;
    PyObject *result = NULL;
    if (b_g.len / 4 != n || b_acc.len / 4 != n || b_out.len / 4 != n) {
        PyErr_SetString(PyExc_ValueError, "theta_in, grad, acc and theta_out differ in size");
    } else {
        const float *restrict th = (const float *)b_in.buf;
        const float *restrict g = (const float *)b_g.buf;
        float *restrict acc = (float *)b_acc.buf;
        float *restrict out = (float *)b_out.buf;
        /* 1 - decay in double, then rounded, as numpy's float32(1.0 - decay) */
        const float a = adagrad ? 1.0f : (float)decay, b = adagrad ? 1.0f : (float)(1.0 - decay);
        Py_BEGIN_ALLOW_THREADS
        FTZ_BEGIN
        for (Py_ssize_t i = 0; i < n; i++) {
            float gi = g[i];
            float ai = a * acc[i] + b * (gi * gi);
            ai = ai < FLT_MIN ? 0.0f : ai;       /* acc >= 0: no denormal is ever stored */
            acc[i] = ai;
            out[i] = th[i] - lr * (gi / sqrtf(ai + eps));
        }
        FTZ_END
        Py_END_ALLOW_THREADS
        result = Py_None;
        Py_INCREF(result);
    }
    release_four(b);
    return result;
}

/* adagrad_step(theta_in, grad, acc, theta_out, eps, lr): AdaGrad with a float64 accumulator.
 * G only grows: in float32, G + g*g == G once G / g*g passes 2^24 (about 1.7e7 steps of similar
 * size), and Gorila's long runs take more steps than that; in float64 the bound is 2^53.
 *   acc = acc + g*g (in double);  theta_out = theta_in - lr * g / sqrt(acc + eps)
 * The step itself is computed in float: its inputs and result are float32 anyway, and a
 * float32 sqrt and divide run at twice the vector width of double ones (the step was ~60 %
 * of the ps's time per gradient in double on a Nature-DQN shard). */
static PyObject *adagrad_step(PyObject *self, PyObject *args) {
    PyObject *o_in, *o_g, *o_acc, *o_out;
    double eps, lr;
    if (!PyArg_ParseTuple(args, "OOOOdd", &o_in, &o_g, &o_acc, &o_out, &eps, &lr))
        return NULL;
    Py_buffer b[4];
    if (get_four(o_in, o_g, o_acc, o_out, b, "d", "float64") < 0) return NULL;
    Py_buffer b_in = b[0], b_g = b[1], b_acc = b[2], b_out = b[3];
    Py_ssize_t n = b_in.len / 4;
    PyObject *result = NULL;
    if (b_g.len / 4 != n || b_acc.len / 8 != n || b_out.len / 4 != n) {
        PyErr_SetString(PyExc_ValueError, "theta_in, grad, acc and theta_out differ in size");
    } else {
        const float *restrict th = (const float *)b_in.buf;
        const float *restrict g = (const float *)b_g.buf;
        double *restrict acc = (double *)b_acc.buf;
        float *restrict out = (float *)b_out.buf;
        Py_BEGIN_ALLOW_THREADS
        const float lrf = (float)lr;
        for (Py_ssize_t i = 0; i < n; i++) {
            const float gi = g[i];
            const double ai = acc[i] + (double)gi * (double)gi;
            acc[i] = ai;
            out[i] = th[i] - lrf * (gi / sqrtf((float)(ai + eps)));
        }
        Py_END_ALLOW_THREADS
        result = Py_None;
        Py_INCREF(result);
    }
    release_four(b);
    return result;
}

/* momentum_step(theta_in, grad, m, theta_out, momentum, lr): one fused step of SGD with
 * momentum (Mnih et al. 2016, S7), m being one client's own float32 buffer:
 *   m = momentum * m + (1 - momentum) * g;  theta_out = theta_in - lr * m
 * Five numpy passes over the shard in one; |m| below FLT_MIN is stored as 0 (a dead unit's m
 * decays by the momentum per step into the denormal range, as RMSProp's statistic does). */
static PyObject *momentum_step(PyObject *self, PyObject *args) {
    PyObject *o_in, *o_g, *o_m, *o_out;
    double mom;
    float lr;
    if (!PyArg_ParseTuple(args, "OOOOdf", &o_in, &o_g, &o_m, &o_out, &mom, &lr))
        return NULL;
    Py_buffer b[4];
    if (get_four(o_in, o_g, o_m, o_out, b, "f", "float32") < 0) return NULL;
    Py_ssize_t n = b[0].len / 4;
    PyObject *result = NULL;
    if (b[1].len / 4 != n || b[2].len / 4 != n || b[3].len / 4 != n) {
        PyErr_SetString(PyExc_ValueError, "theta_in, grad, m and theta_out differ in size");
    } else {
        const float *restrict th = (const float *)b[0].buf;
        const float *restrict g = (const float *)b[1].buf;
        float *restrict m = (float *)b[2].buf;
        float *restrict out = (float *)b[3].buf;
        /* 1 - momentum in double, then rounded, as numpy's float32(1.0 - momentum) */
        const float keep = (float)mom, take = (float)(1.0 - mom);
        Py_BEGIN_ALLOW_THREADS
        FTZ_BEGIN
        for (Py_ssize_t i = 0; i < n; i++) {
            float mi = keep * m[i] + take * g[i];
            mi = fabsf(mi) < FLT_MIN ? 0.0f : mi;
            m[i] = mi;
            out[i] = th[i] - lr * mi;
        }
        FTZ_END
        Py_END_ALLOW_THREADS
        result = Py_None;
        Py_INCREF(result);
    }
    release_four(b);
    return result;
}

/* The loop of adam_step, in a function of its own: GCC takes restrict from function parameters
 * (not from the block's locals), and without it five arrays need more alias checks than it
 * versions a loop for, which left the loop scalar (4x the RMSProp kernel's time). */
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

/* adam_step(theta_in, grad, m, v, theta_out, beta1, beta2, eps, lr): one fused step of Adam
 * (Kingma & Ba 2015) with both moments shared by every client, as the shared Adam that
 * one-environment A3C reproductions run; the bias correction is folded into lr and eps by the
 * caller (lr sqrt(c2) / c1, eps c2), eps inside the square root as for RMSProp:
 *   m = beta1 m + (1 - beta1) g;  v = beta2 v + (1 - beta2) g*g
 *   theta_out = theta_in - lr * (m / sqrt(v + eps))
 * |m| and v below FLT_MIN are stored as 0, as the other kernels' statistics. */
static PyObject *adam_step(PyObject *self, PyObject *args) {
    PyObject *o_in, *o_g, *o_m, *o_v, *o_out;
    double beta1, beta2;
    float eps, lr;
    if (!PyArg_ParseTuple(args, "OOOOOddff", &o_in, &o_g, &o_m, &o_v, &o_out, &beta1, &beta2,
                          &eps, &lr))
        return NULL;
    Py_buffer b[4], b_v;
    if (get_four(o_in, o_g, o_m, o_out, b, "f", "float32") < 0) return NULL;
    if (get_f32(o_v, &b_v, 1, "v") < 0) { release_four(b); return NULL; }
    Py_ssize_t n = b[0].len / 4;
    PyObject *result = NULL;
    if (b[1].len / 4 != n || b[2].len / 4 != n || b_v.len / 4 != n || b[3].len / 4 != n) {
        PyErr_SetString(PyExc_ValueError, "theta_in, grad, m, v and theta_out differ in size");
    } else {
        /* 1 - beta in double, then rounded, as numpy's float32(1.0 - beta) */
        const float k1 = (float)beta1, t1 = (float)(1.0 - beta1);
        const float k2 = (float)beta2, t2 = (float)(1.0 - beta2);
        Py_BEGIN_ALLOW_THREADS
        FTZ_BEGIN
        adam_loop(n, (const float *)b[0].buf, (const float *)b[1].buf, (float *)b[2].buf,
                  (float *)b_v.buf, (float *)b[3].buf, k1, t1, k2, t2, eps, lr);
        FTZ_END
        Py_END_ALLOW_THREADS
        result = Py_None;
        Py_INCREF(result);
    }
    PyBuffer_Release(&b_v);
    release_four(b);
    return result;
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
