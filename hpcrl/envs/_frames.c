/* The Atari frames' 84x84 resize in C (optional extension; hpcrl.envs.atari falls back to PIL).
 *
 * The same result as Pillow's BOX resize of an 8-bit image (src/libImaging/Resample.c): a
 * horizontal pass into an 8-bit intermediate image, then a vertical pass, each output pixel the
 * rounded fixed-point sum (22 fraction bits) of its window's input pixels times the window's
 * weight. A BOX window weighs all its pixels alike (1 / count, in fixed point), so that sum is
 * the weight times the pixels' plain sum: each pass adds up its windows and looks the result up
 * in a table by count and sum, made in Python from Pillow's own weights
 * (hpcrl.envs.atari.box_windows). The pixels are Pillow's, bit for bit (tests/test_envs.py).
 * The vertical pass adds whole rows, which the compiler vectorises; the batch is resized in
 * one call straight from the emulators' buffer, without PIL's image objects and copies.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* One filter direction: for each output index the first input index and the input count of
 * its window, and the table of results by window sum: lut[count * lut_stride + sum]. */
typedef struct {
    const int32_t *first, *count;
    const uint8_t *lut;
    Py_ssize_t out, lut_stride;
    int32_t max_count;
} Windows;

/* The horizontal pass of one row by selection (see `averaging`): sel[xx] indexes a 320-byte
 * buffer holding the row itself (0..159), the rounded means of its pixel pairs (2k, 2k + 1)
 * at 160 + k and of its pairs (2k + 1, 2k + 2) at 240 + k. Both means are whole-row loops the
 * compiler vectorises; what is left per output is one byte copy. */
#define SEL_ROW 160
static void select_row(const uint8_t *restrict line, const uint16_t *restrict sel,
                       Py_ssize_t ow, uint8_t *restrict buf, uint8_t *restrict out) {
    memcpy(buf, line, SEL_ROW);
    for (int k = 0; k < SEL_ROW / 2; k++)
        buf[SEL_ROW + k] = (uint8_t)(((unsigned)line[2 * k] + line[2 * k + 1] + 1) >> 1);
    for (int k = 0; k < SEL_ROW / 2 - 1; k++)
        buf[SEL_ROW + SEL_ROW / 2 + k] =
            (uint8_t)(((unsigned)line[2 * k + 1] + line[2 * k + 2] + 1) >> 1);
    for (Py_ssize_t xx = 0; xx < ow; xx++) out[xx] = buf[sel[xx]];
}

/* The row `y` of a screen as the horizontal pass reads it: the screen's own row, or, with a
 * second screen `b`, the pixelwise max of the two rows written into `pooled`. */
static inline const uint8_t *source_row(const uint8_t *a, const uint8_t *b, Py_ssize_t w,
                                        Py_ssize_t y, uint8_t *restrict pooled) {
    const uint8_t *ra = a + y * w;
    if (b == NULL) return ra;
    const uint8_t *rb = b + y * w;
    for (Py_ssize_t x = 0; x < w; x++) pooled[x] = ra[x] > rb[x] ? ra[x] : rb[x];
    return pooled;
}

/* One screen (or the max of two, `b` not NULL): rows [row0, row0 + rows) of it (width w)
 * through the horizontal pass into tmp (rows x h.out), then tmp through the vertical pass into
 * dst (v.out x h.out). The vertical pass sums whole rows of tmp (contiguous, so the compiler
 * vectorises it) into `sums`. `sel`, where not NULL, is the horizontal pass by selection. */
static void resize_one(const uint8_t *a, const uint8_t *b, Py_ssize_t w, Py_ssize_t row0,
                       Py_ssize_t rows, uint8_t *restrict tmp, uint16_t *restrict sums,
                       uint8_t *restrict pooled, const uint16_t *sel, uint8_t *restrict dst,
                       const Windows *h, const Windows *v) {
    const Py_ssize_t ow = h->out;
    for (Py_ssize_t y = 0; y < rows; y++) {
        const uint8_t *line = source_row(a, b, w, row0 + y, pooled);
        uint8_t *out = tmp + y * ow;
        if (sel != NULL) {
            select_row(line, sel, ow, pooled + w, out);
            continue;
        }
        if (h->max_count == 2) { /* the ALE's 160 columns: windows of 1 or 2 pixels */
            for (Py_ssize_t xx = 0; xx < ow; xx++) {
                const int32_t f = h->first[xx], c = h->count[xx];
                const int32_t one = line[f] & -(int32_t)(c > 0);
                const int32_t two = line[f + (c > 1)] & -(int32_t)(c > 1);
                out[xx] = h->lut[c * h->lut_stride + one + two];
            }
            continue;
        }
        for (Py_ssize_t xx = 0; xx < ow; xx++) {
            const uint8_t *in = line + h->first[xx];
            const int32_t count = h->count[xx];
            int32_t sum = 0;
            for (int32_t x = 0; x < count; x++) sum += in[x];
            out[xx] = h->lut[count * h->lut_stride + sum];
        }
    }
    for (Py_ssize_t yy = 0; yy < v->out; yy++) {
        const int32_t count = v->count[yy];
        const uint8_t *lut = v->lut + count * v->lut_stride;
        for (Py_ssize_t xx = 0; xx < ow; xx++) sums[xx] = 0;
        if (count > 0) { /* an empty window's first row may lie outside tmp */
            const uint8_t *in = tmp + (v->first[yy] - row0) * ow;
            for (int32_t y = 0; y < count; y++)
                for (Py_ssize_t xx = 0; xx < ow; xx++) sums[xx] += in[y * ow + xx];
        }
        uint8_t *out = dst + yy * ow;
        for (Py_ssize_t xx = 0; xx < ow; xx++) out[xx] = lut[sums[xx]];
    }
}

/* Whether the horizontal windows are those of a 160-pixel row whose table is a plain mean:
 * every window of 1 pixel (table: the pixel) or of 2 (table: their rounded mean, (s + 1) >> 1,
 * which a BOX weight of exactly 1/2 in fixed point gives). Then the pass can select from the
 * row and its pair means (`select_row`), the same bytes. Fills `sel`. */
static int averaging(const Windows *h, Py_ssize_t in_size, uint16_t *sel) {
    if (in_size != SEL_ROW || h->max_count != 2 || h->lut_stride < 511) return 0;
    for (int s = 0; s < 256; s++)
        if (h->lut[h->lut_stride + s] != s) return 0;
    for (int s = 0; s < 511; s++)
        if (h->lut[2 * h->lut_stride + s] != (s + 1) >> 1) return 0;
    for (Py_ssize_t xx = 0; xx < h->out; xx++) {
        const int32_t f = h->first[xx], c = h->count[xx];
        if (c == 1) sel[xx] = (uint16_t)f;
        else if (c == 2 && f % 2 == 0) sel[xx] = (uint16_t)(SEL_ROW + f / 2);
        else if (c == 2) sel[xx] = (uint16_t)(SEL_ROW + SEL_ROW / 2 + (f - 1) / 2);
        else return 0;                      /* an empty window: the general pass */
    }
    return 1;
}

/* Takes a C-contiguous buffer of `format` with `ndim` dimensions; -1 with an error set. */
static int take(PyObject *obj, Py_buffer *b, const char *name, const char *format, int ndim,
                int writable) {
    int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj, b, flags) != 0) return -1;
    const char *f = b->format ? b->format : "B";
    if (f[0] == '=' || f[0] == '<' || f[0] == '@') f++;
    int ok = b->ndim == ndim && strcmp(f, format) == 0 &&
             b->itemsize == (format[0] == 'B' ? 1 : (Py_ssize_t)sizeof(int32_t));
    if (!ok) {
        PyErr_Format(PyExc_TypeError, "%s must be a contiguous %dD %s array", name, ndim,
                     format[0] == 'B' ? "uint8" : "int32");
        PyBuffer_Release(b);
        return -1;
    }
    return 0;
}

/* Checks one direction's arrays: every window inside [0, in_size) (an empty one's first index
 * too: the two-pixel loop reads it), every count and sum inside the table (a sum of `count`
 * uint8 values is at most 255 * count); notes the largest count. */
static int check_windows(Windows *c, const Py_buffer *first, const Py_buffer *count,
                         const Py_buffer *lut, Py_ssize_t in_size, const char *which) {
    if (first->shape[0] != c->out || count->shape[0] != c->out) {
        PyErr_Format(PyExc_ValueError, "%s windows do not match the output size", which);
        return -1;
    }
    for (Py_ssize_t i = 0; i < c->out; i++) {
        if (c->first[i] < 0 || c->count[i] < 0 || c->count[i] >= lut->shape[0] ||
            c->count[i] > 255 || 255 * (Py_ssize_t)c->count[i] >= c->lut_stride ||
            (Py_ssize_t)c->first[i] + (c->count[i] > 0 ? c->count[i] : 1) > in_size) {
            PyErr_Format(PyExc_ValueError, "%s window %zd reaches outside the input or its table",
                         which, i);
            return -1;
        }
        if (c->count[i] > c->max_count) c->max_count = c->count[i];
    }
    return 0;
}

#define NBUF 9

/* box_resize and pool_box_resize: `pooled` says whether args hold (src [n, 2, H, W], grabbed
 * [n] uint8, dst, windows...) — each screen the max of its two frames where grabbed is 2, its
 * first frame where it is 1 — or (src [n, H, W], dst, windows...). */
static PyObject *resize_call(PyObject *const *args, Py_ssize_t nargs, int pooled) {
    static const char *names[NBUF] = {"src", "grabbed", "dst", "h_first", "h_count", "h_lut",
                                      "v_first", "v_count", "v_lut"};
    static const char *formats[NBUF] = {"B", "B", "B", "i", "i", "B", "i", "i", "B"};
    static const int dims[NBUF] = {3, 1, 3, 1, 1, 2, 1, 1, 2};
    const int skip = pooled ? 0 : 1;       /* box_resize takes no `grabbed` */
    if (nargs != NBUF - skip) {
        PyErr_SetString(PyExc_TypeError, pooled
            ? "pool_box_resize(src, grabbed, dst, h_first, h_count, h_lut, v_first, v_count, v_lut)"
            : "box_resize(src, dst, h_first, h_count, h_lut, v_first, v_count, v_lut)");
        return NULL;
    }
    Py_buffer b[NBUF];
    int taken = 0;
    for (; taken < NBUF; taken++) {
        if (taken == 1 && skip) {           /* no grabbed: an empty placeholder */
            memset(&b[1], 0, sizeof(Py_buffer));
            continue;
        }
        if (take(args[taken - (taken > 1 ? skip : 0)], &b[taken], names[taken], formats[taken],
                 taken == 0 && pooled ? 4 : dims[taken], taken == 2) != 0)
            goto fail;
    }
    const Py_ssize_t n = b[0].shape[0];
    const Py_ssize_t hin = b[0].shape[pooled ? 2 : 1], win = b[0].shape[pooled ? 3 : 2];
    Windows h = {b[3].buf, b[4].buf, b[5].buf, b[2].shape[2], b[5].shape[1], 0};
    Windows v = {b[6].buf, b[7].buf, b[8].buf, b[2].shape[1], b[8].shape[1], 0};
    if (b[2].shape[0] != n || (pooled && b[1].shape[0] != n)) {
        PyErr_SetString(PyExc_ValueError, "src, grabbed and dst hold different numbers of screens");
        goto fail;
    }
    if (pooled && b[0].shape[1] != 2) {
        PyErr_SetString(PyExc_ValueError, "src must hold 2 frames a screen, [n, 2, H, W]");
        goto fail;
    }
    for (Py_ssize_t i = 0; pooled && i < n; i++) {
        const uint8_t g = ((const uint8_t *)b[1].buf)[i];
        if (g != 1 && g != 2) {
            PyErr_Format(PyExc_ValueError, "grabbed[%zd] is %d: 1 or 2 frames a screen", i, g);
            goto fail;
        }
    }
    if (check_windows(&h, &b[3], &b[4], &b[5], win, "horizontal") != 0 ||
        check_windows(&v, &b[6], &b[7], &b[8], hin, "vertical") != 0)
        goto fail;
    Py_ssize_t row0 = hin, row1 = 0; /* the input rows the vertical pass reads */
    for (Py_ssize_t i = 0; i < v.out; i++) {
        if (v.count[i] == 0) continue;
        if (v.first[i] < row0) row0 = v.first[i];
        if ((Py_ssize_t)v.first[i] + v.count[i] > row1) row1 = (Py_ssize_t)v.first[i] + v.count[i];
    }
    if (row1 < row0) row0 = row1 = 0;
    uint8_t *tmp = malloc((size_t)((row1 - row0) * h.out + 1));
    uint16_t *sums = malloc((size_t)(h.out + 1) * sizeof(uint16_t));
    uint16_t *sel = malloc((size_t)(h.out + 1) * sizeof(uint16_t));
    uint8_t *rows = malloc((size_t)(win + 2 * SEL_ROW)); /* a pooled row, then select_row's */
    if (tmp == NULL || sums == NULL || sel == NULL || rows == NULL) {
        free(tmp);
        free(sums);
        free(sel);
        free(rows);
        PyErr_NoMemory();
        goto fail;
    }
    const int by_selection = averaging(&h, win, sel);
    /* The GIL stays held: the windows were checked in the caller's arrays, which another
     * thread could otherwise change under the loop (a rank steps its environments on one
     * thread, so releasing it would gain nothing). */
    const Py_ssize_t frame = hin * win;
    for (Py_ssize_t i = 0; i < n; i++) {
        const uint8_t *a = (const uint8_t *)b[0].buf + i * (pooled ? 2 : 1) * frame;
        const uint8_t *second = pooled && ((const uint8_t *)b[1].buf)[i] == 2 ? a + frame : NULL;
        resize_one(a, second, win, row0, row1 - row0, tmp, sums, rows,
                   by_selection ? sel : NULL, (uint8_t *)b[2].buf + i * v.out * h.out, &h, &v);
    }
    free(tmp);
    free(sums);
    free(sel);
    free(rows);
    for (int i = 0; i < NBUF; i++)
        if (!(i == 1 && skip)) PyBuffer_Release(&b[i]);
    Py_RETURN_NONE;
fail:
    while (taken-- > 0)
        if (!(taken == 1 && skip)) PyBuffer_Release(&b[taken]);
    return NULL;
}

static PyObject *box_resize(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    return resize_call(args, nargs, 0);
}

static PyObject *pool_box_resize(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    return resize_call(args, nargs, 1);
}

/* A learner's image batch from frame stacks: src [n, c, p] uint8 (n stacks of c frames of p
 * pixels) -> dst [n, p, c] (channels-last), each pixel replaced by lut[pixel]: the scaled float
 * value, 4 bytes, or its bfloat16 bits, 2 bytes (the table is made by torch from the very
 * function it replaces, so the values are torch's bit for bit; tests/test_networks.py). One
 * pass that writes dst in order, in place of one strided copy per frame and a scaling pass. */
static PyObject *stack_channels_last(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "stack_channels_last(src, lut, dst)");
        return NULL;
    }
    Py_buffer src, lut, dst;
    if (take(args[0], &src, "src", "B", 3, 0) != 0) return NULL;
    if (PyObject_GetBuffer(args[1], &lut, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) != 0) {
        PyBuffer_Release(&src);
        return NULL;
    }
    if (PyObject_GetBuffer(args[2], &dst, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | PyBUF_WRITABLE) != 0) {
        PyBuffer_Release(&src);
        PyBuffer_Release(&lut);
        return NULL;
    }
    const Py_ssize_t n = src.shape[0], c = src.shape[1], p = src.shape[2];
    const Py_ssize_t size = lut.itemsize;
    const char *lf = lut.format ? lut.format : "B", *df = dst.format ? dst.format : "B";
    if (lf[0] == '=' || lf[0] == '@') lf++; /* native order only ('<' and '>' refused) */
    if (df[0] == '=' || df[0] == '@') df++;
    if (lut.ndim != 1 || lut.shape[0] != 256 || (size != 2 && size != 4) ||
        strcmp(lf, size == 2 ? "h" : "i") != 0) {
        PyErr_SetString(PyExc_TypeError, "lut must be a contiguous native int16 or int32 array of "
                                         "256 items (the bits of bfloat16 or float32 values)");
        goto fail;
    }
    if (strcmp(lf, df) != 0 || (uintptr_t)lut.buf % size != 0 || (uintptr_t)dst.buf % size != 0) {
        PyErr_SetString(PyExc_TypeError, "dst must be an aligned array of lut's item type");
        goto fail;
    }
    if (dst.ndim != 3 || dst.itemsize != size || dst.shape[0] != n || dst.shape[1] != p ||
        dst.shape[2] != c) {
        PyErr_SetString(PyExc_ValueError, "dst must be [n, p, c] of src [n, c, p], items the size of lut's");
        goto fail;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        const uint8_t *in = (const uint8_t *)src.buf + i * c * p;
        if (size == 4 && c == 4) { /* a stack of 4 frames: four streams in, one out */
            const uint32_t *table = lut.buf;
            uint32_t *restrict out = (uint32_t *)dst.buf + i * p * c;
            const uint8_t *f0 = in, *f1 = in + p, *f2 = in + 2 * p, *f3 = in + 3 * p;
            for (Py_ssize_t k = 0; k < p; k++) {
                out[4 * k] = table[f0[k]];
                out[4 * k + 1] = table[f1[k]];
                out[4 * k + 2] = table[f2[k]];
                out[4 * k + 3] = table[f3[k]];
            }
        } else if (size == 2 && c == 4) {
            const uint16_t *table = lut.buf;
            uint16_t *restrict out = (uint16_t *)dst.buf + i * p * c;
            const uint8_t *f0 = in, *f1 = in + p, *f2 = in + 2 * p, *f3 = in + 3 * p;
            for (Py_ssize_t k = 0; k < p; k++) {
                out[4 * k] = table[f0[k]];
                out[4 * k + 1] = table[f1[k]];
                out[4 * k + 2] = table[f2[k]];
                out[4 * k + 3] = table[f3[k]];
            }
        } else if (size == 4) {
            const uint32_t *table = lut.buf;
            uint32_t *out = (uint32_t *)dst.buf + i * p * c;
            for (Py_ssize_t k = 0; k < p; k++)
                for (Py_ssize_t j = 0; j < c; j++) out[k * c + j] = table[in[j * p + k]];
        } else {
            const uint16_t *table = lut.buf;
            uint16_t *out = (uint16_t *)dst.buf + i * p * c;
            for (Py_ssize_t k = 0; k < p; k++)
                for (Py_ssize_t j = 0; j < c; j++) out[k * c + j] = table[in[j * p + k]];
        }
    }
    PyBuffer_Release(&src);
    PyBuffer_Release(&lut);
    PyBuffer_Release(&dst);
    Py_RETURN_NONE;
fail:
    PyBuffer_Release(&src);
    PyBuffer_Release(&lut);
    PyBuffer_Release(&dst);
    return NULL;
}

/* The ALE's grayscale screen from its palette indices: dst[k] = gray[src[k]], and whether
 * every index met was known (unknown[index] == 0). `gray` and `unknown` are 256-entry tables
 * learned from the ALE's own grayscale screens (hpcrl.envs.atari.PaletteGray), so a screen
 * whose indices are all known gets the ALE's pixels exactly; one with an index not yet seen
 * is grabbed from the ALE in grayscale instead (and teaches the tables). With AVX-512 VBMI a
 * 256-entry byte table is two 128-entry permutes of 64 pixels at a time; elsewhere a plain
 * loop (slower than the ALE's own conversion, so Python uses the ALE's where VBMI is absent). */
static int gray_scalar(const uint8_t *restrict src, uint8_t *restrict dst, Py_ssize_t n,
                       const uint8_t *gray, const uint8_t *unknown) {
    uint8_t bad = 0;
    for (Py_ssize_t k = 0; k < n; k++) {
        dst[k] = gray[src[k]];
        bad |= unknown[src[k]];
    }
    return bad == 0;
}

#if defined(__GNUC__) && defined(__x86_64__)
#include <immintrin.h>
#define HAVE_GRAY_VBMI 1

/* One 256-entry byte table applied to 64 indices: the low 7 bits pick in the table's half
 * that the top bit names. */
__attribute__((target("avx512f,avx512bw,avx512vbmi")))
static inline __m512i lookup256(__m512i x, const __m512i t[4]) {
    __m512i lo = _mm512_permutex2var_epi8(t[0], x, t[1]);
    __m512i hi = _mm512_permutex2var_epi8(t[2], x, t[3]);
    return _mm512_mask_blend_epi8(_mm512_movepi8_mask(x), lo, hi);
}

__attribute__((target("avx512f,avx512bw,avx512vbmi")))
static int gray_vbmi(const uint8_t *src, uint8_t *dst, Py_ssize_t n, const uint8_t *gray,
                     const uint8_t *unknown) {
    __m512i g[4], u[4];
    for (int j = 0; j < 4; j++) {
        g[j] = _mm512_loadu_si512((const void *)(gray + 64 * j));
        u[j] = _mm512_loadu_si512((const void *)(unknown + 64 * j));
    }
    __m512i bad = _mm512_setzero_si512();
    Py_ssize_t k = 0;
    for (; k + 64 <= n; k += 64) {
        __m512i x = _mm512_loadu_si512((const void *)(src + k));
        _mm512_storeu_si512((void *)(dst + k), lookup256(x, g));
        bad = _mm512_or_si512(bad, lookup256(x, u));
    }
    if (k < n) {
        __mmask64 m = ~0ULL >> (64 - (n - k));
        __m512i x = _mm512_maskz_loadu_epi8(m, src + k);
        _mm512_mask_storeu_epi8(dst + k, m, lookup256(x, g));
        bad = _mm512_or_si512(bad, _mm512_maskz_mov_epi8(m, lookup256(x, u)));
    }
    return _mm512_test_epi8_mask(bad, bad) == 0;
}
#endif

static int have_vbmi(void) {
#ifdef HAVE_GRAY_VBMI
    static int cached = -1;
    if (cached < 0) {
        __builtin_cpu_init();
        cached = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                 __builtin_cpu_supports("avx512vbmi");
    }
    return cached;
#else
    return 0;
#endif
}

static PyObject *palette_gray(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "palette_gray(src, dst, gray, unknown, simd)");
        return NULL;
    }
    int simd = PyObject_IsTrue(args[4]);
    if (simd < 0) return NULL;
    Py_buffer b[4];
    static const char *names[4] = {"src", "dst", "gray", "unknown"};
    int got = 0, ok = 0;
    for (; got < 4; got++) {
        int flags = PyBUF_C_CONTIGUOUS | (got == 1 ? PyBUF_WRITABLE : 0);
        if (PyObject_GetBuffer(args[got], &b[got], flags) != 0) goto done;
        if (b[got].itemsize != 1) {
            PyErr_Format(PyExc_TypeError, "%s must be a contiguous uint8 array", names[got]);
            got++;
            goto done;
        }
    }
    if (b[1].len != b[0].len || b[2].len != 256 || b[3].len != 256) {
        PyErr_SetString(PyExc_ValueError, "dst must be the size of src, gray and unknown 256 bytes");
        goto done;
    }
    if (b[1].buf == b[0].buf) {
        PyErr_SetString(PyExc_ValueError, "dst must not be src");
        goto done;
    }
    const uint8_t *src = b[0].buf, *gray = b[2].buf, *unknown = b[3].buf;
    uint8_t *dst = b[1].buf;
#ifdef HAVE_GRAY_VBMI
    if (simd && have_vbmi())
        ok = gray_vbmi(src, dst, b[0].len, gray, unknown);
    else
#endif
        ok = gray_scalar(src, dst, b[0].len, gray, unknown);
    got = 4;
done:
    for (int j = 0; j < got; j++) PyBuffer_Release(&b[j]);
    if (PyErr_Occurred()) return NULL;
    return PyBool_FromLong(ok);
}

static PyObject *palette_simd(PyObject *self, PyObject *unused) {
    (void)self;
    (void)unused;
    return PyBool_FromLong(have_vbmi());
}

static PyMethodDef methods[] = {
    {"stack_channels_last", (PyCFunction)(void (*)(void))stack_channels_last, METH_FASTCALL,
     "stack_channels_last(src, lut, dst): [n, c, p] uint8 -> [n, p, c], each pixel lut[pixel] "
     "(items of 2 or 4 bytes)."},
    {"pool_box_resize", (PyCFunction)(void (*)(void))pool_box_resize, METH_FASTCALL,
     "pool_box_resize(src, grabbed, dst, h_first, h_count, h_lut, v_first, v_count, v_lut): "
     "[n, 2, H, W] uint8 frame pairs -> [n, OH, OW] uint8, each screen the pixelwise max of its "
     "two frames (grabbed 2) or its first (grabbed 1), then Pillow's BOX resize arithmetic."},
    {"palette_gray", (PyCFunction)(void (*)(void))palette_gray, METH_FASTCALL,
     "palette_gray(src, dst, gray, unknown, simd) -> bool: dst = gray[src] (uint8 arrays of "
     "one size, 256-entry tables); whether unknown[src] was 0 everywhere. simd: the AVX-512 "
     "VBMI loop where the CPU has it."},
    {"palette_simd", (PyCFunction)palette_simd, METH_NOARGS,
     "palette_simd() -> bool: whether palette_gray has its AVX-512 VBMI loop on this CPU."},
    {"box_resize", (PyCFunction)(void (*)(void))box_resize, METH_FASTCALL,
     "box_resize(src, dst, h_first, h_count, h_lut, v_first, v_count, v_lut): "
     "[n, H, W] uint8 screens -> [n, OH, OW] uint8, Pillow's BOX resize arithmetic."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_frames", NULL, -1, methods};

PyMODINIT_FUNC PyInit__frames(void) { return PyModule_Create(&module); }
