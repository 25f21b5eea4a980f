/* Hot loops of recovery in C: record checksums, Kafka message -> row conversion, flat Avro decoding.
 *
 * Optional: `cec.native` falls back to pure Python when this module is not built, and every function here
 * is a *fast path* whose answers are checked against the Python definition by tests/test_native.py.
 * Each function declines (flags a row, returns None, or hands a message to a Python callback) whenever
 * its input is anything but the plain case, so the Python code keeps the final say on every error:
 * this module can never accept a record that the Python path would reject.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <float.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* ---- CRC32C (Castagnoli), slicing-by-8, reflected, as google_crc32c computes it ---------------------- */
static uint32_t crc_table[8][256];

static void crc_init(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1u)));
        crc_table[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = crc_table[0][i];
        for (int t = 1; t < 8; t++) {
            c = crc_table[0][c & 0xFF] ^ (c >> 8);
            crc_table[t][i] = c;
        }
    }
}

static uint32_t crc_extend(uint32_t crc, const unsigned char *p, Py_ssize_t n) {
    crc = ~crc;
    while (n >= 8) {
        uint32_t lo = crc ^ ((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24);
        uint32_t hi = (uint32_t)p[4] | (uint32_t)p[5] << 8 | (uint32_t)p[6] << 16 | (uint32_t)p[7] << 24;
        crc = crc_table[7][lo & 0xFF] ^ crc_table[6][(lo >> 8) & 0xFF] ^ crc_table[5][(lo >> 16) & 0xFF] ^
              crc_table[4][lo >> 24] ^ crc_table[3][hi & 0xFF] ^ crc_table[2][(hi >> 8) & 0xFF] ^
              crc_table[1][(hi >> 16) & 0xFF] ^ crc_table[0][hi >> 24];
        p += 8;
        n -= 8;
    }
    while (n-- > 0) crc = crc_table[0][(crc ^ *p++) & 0xFF] ^ (crc >> 8);
    return ~crc;
}

static PyObject *py_crc32c(PyObject *self, PyObject *args) {
    Py_buffer buf;
    unsigned int crc = 0;
    if (!PyArg_ParseTuple(args, "y*|I", &buf, &crc)) return NULL;
    uint32_t out = crc_extend(crc, buf.buf, buf.len);
    PyBuffer_Release(&buf);
    return PyLong_FromUnsignedLong(out);
}

/* ---- record checksums -------------------------------------------------------------------------------- */
/* Appends the decimal text of v; returns the new length or -1 if it does not fit. */
static Py_ssize_t put_int(char *out, Py_ssize_t at, Py_ssize_t cap, long long v) {
    /* Decimal by hand: snprintf cost as much as the CRC of a small record (it runs twice per record). */
    char tmp[24];
    int len = 0;
    unsigned long long u = v < 0 ? 0ull - (unsigned long long)v : (unsigned long long)v;
    do {
        tmp[sizeof tmp - 1 - len++] = (char)('0' + u % 10);
        u /= 10;
    } while (u > 0);
    if (v < 0) tmp[sizeof tmp - 1 - len++] = '-';
    if (at + len > cap) return -1;
    memcpy(out + at, tmp + sizeof tmp - len, (size_t)len);
    return at + len;
}

static Py_ssize_t put_bytes(char *out, Py_ssize_t at, Py_ssize_t cap, const char *s, Py_ssize_t n) {
    if (at + n > cap) return -1;
    memcpy(out + at, s, (size_t)n);
    return at + n;
}

/* Does one row (offset, kind, time, key, seq, value) pass the record checksum the plain way?
 * 1 yes, 0 no or not plain (the caller re-checks in Python), -1 a Python error. */
static int row_passes(PyObject *row, int magic, const unsigned char *versions, Py_ssize_t max_bytes) {
    if (!PyTuple_CheckExact(row) || PyTuple_GET_SIZE(row) != 6) return 0;
    PyObject *kind = PyTuple_GET_ITEM(row, 1), *time = PyTuple_GET_ITEM(row, 2);
    PyObject *key = PyTuple_GET_ITEM(row, 3), *seq = PyTuple_GET_ITEM(row, 4);
    PyObject *value = PyTuple_GET_ITEM(row, 5);
    if (!PyBytes_CheckExact(value) || !PyUnicode_CheckExact(kind) || !PyLong_CheckExact(time) ||
        !PyLong_CheckExact(seq) || (key != Py_None && !PyUnicode_CheckExact(key)))
        return 0;
    Py_ssize_t n = PyBytes_GET_SIZE(value);
    const unsigned char *v = (const unsigned char *)PyBytes_AS_STRING(value);
    if (n <= 6 || n > max_bytes || v[0] != magic || !versions[v[1]]) return 0;
    int overflow = 0;
    long long t = PyLong_AsLongLongAndOverflow(time, &overflow);
    if (overflow) return 0;
    long long s = PyLong_AsLongLongAndOverflow(seq, &overflow);
    if (overflow) return 0;
    Py_ssize_t kind_len, key_len = 0;
    const char *kind_s = PyUnicode_AsUTF8AndSize(kind, &kind_len);
    if (kind_s == NULL) { PyErr_Clear(); return 0; }
    const char *key_s = NULL;
    if (key != Py_None) {
        key_s = PyUnicode_AsUTF8AndSize(key, &key_len);
        if (key_s == NULL) { PyErr_Clear(); return 0; }
    }
    /* The metadata prefix of cec.records._meta_bytes: version US kind US time US [k key] US seq RS. */
    char stack[256];
    Py_ssize_t cap = 3 + 1 + kind_len + 1 + 20 + 1 + 1 + key_len + 1 + 20 + 1;
    char *meta = cap <= (Py_ssize_t)sizeof stack ? stack : PyMem_Malloc((size_t)cap);
    if (meta == NULL) { PyErr_NoMemory(); return -1; }
    Py_ssize_t at = put_int(meta, 0, cap, v[1]);
    at = at < 0 ? -1 : put_bytes(meta, at, cap, "\x1f", 1);
    at = at < 0 ? -1 : put_bytes(meta, at, cap, kind_s, kind_len);
    at = at < 0 ? -1 : put_bytes(meta, at, cap, "\x1f", 1);
    at = at < 0 ? -1 : put_int(meta, at, cap, t);
    at = at < 0 ? -1 : put_bytes(meta, at, cap, "\x1f", 1);
    if (key_s != NULL) {
        at = at < 0 ? -1 : put_bytes(meta, at, cap, "k", 1);
        at = at < 0 ? -1 : put_bytes(meta, at, cap, key_s, key_len);
    }
    at = at < 0 ? -1 : put_bytes(meta, at, cap, "\x1f", 1);
    at = at < 0 ? -1 : put_int(meta, at, cap, s);
    at = at < 0 ? -1 : put_bytes(meta, at, cap, "\x1e", 1);
    int ok = 0;
    if (at >= 0) {
        uint32_t crc = crc_extend(crc_extend(0, (const unsigned char *)meta, at), v + 6, n - 6);
        uint32_t stored = (uint32_t)v[2] << 24 | (uint32_t)v[3] << 16 | (uint32_t)v[4] << 8 | (uint32_t)v[5];
        ok = crc == stored;
    }
    if (meta != stack) PyMem_Free(meta);
    return ok;
}

/* verify_rows(rows, magic, versions: bytes[256], max_bytes) -> list of the indices that did not pass. */
static PyObject *py_verify_rows(PyObject *self, PyObject *args) {
    PyObject *rows;
    int magic;
    Py_buffer versions;
    Py_ssize_t max_bytes;
    if (!PyArg_ParseTuple(args, "O!iy*n", &PyList_Type, &rows, &magic, &versions, &max_bytes)) return NULL;
    if (versions.len != 256) {
        PyBuffer_Release(&versions);
        PyErr_SetString(PyExc_ValueError, "versions must be 256 bytes");
        return NULL;
    }
    PyObject *bad = PyList_New(0);
    if (bad == NULL) goto done;
    Py_ssize_t count = PyList_GET_SIZE(rows);
    for (Py_ssize_t i = 0; i < count; i++) {
        int r = row_passes(PyList_GET_ITEM(rows, i), magic, versions.buf, max_bytes);
        if (r < 0) { Py_CLEAR(bad); break; }
        if (r == 0) {
            PyObject *idx = PyLong_FromSsize_t(i);
            if (idx == NULL || PyList_Append(bad, idx) < 0) { Py_XDECREF(idx); Py_CLEAR(bad); break; }
            Py_DECREF(idx);
        }
    }
done:
    PyBuffer_Release(&versions);
    return bad;
}


/* ---- objects of __slots__ classes without running __init__ ------------------------------------------- */
/* A new instance of `cls` whose slots `descrs` (member descriptors, e.g. C.field) get `values`. Frozen
 * dataclasses included: a member descriptor writes the slot without the class's __setattr__. */
static PyObject *new_slots(PyObject *cls, PyObject *descrs, PyObject *const *values) {
    if (!PyType_Check(cls)) { PyErr_SetString(PyExc_TypeError, "not a class"); return NULL; }
    PyTypeObject *type = (PyTypeObject *)cls;
    PyObject *obj = type->tp_alloc(type, 0);
    if (obj == NULL) return NULL;
    Py_ssize_t count = PyTuple_GET_SIZE(descrs);
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *d = PyTuple_GET_ITEM(descrs, i);
        descrsetfunc set = Py_TYPE(d)->tp_descr_set;
        if (set == NULL || set(d, obj, values[i]) < 0) {
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "not a slot descriptor");
            Py_DECREF(obj);
            return NULL;
        }
    }
    return obj;
}

/* make(cls, descrs, values) -> a new instance with its slots set, __init__ not run. */
static PyObject *py_make(PyObject *self, PyObject *args) {
    PyObject *cls, *descrs, *values;
    if (!PyArg_ParseTuple(args, "OO!O!", &cls, &PyTuple_Type, &descrs, &PyTuple_Type, &values)) return NULL;
    if (PyTuple_GET_SIZE(values) != PyTuple_GET_SIZE(descrs)) {
        PyErr_SetString(PyExc_ValueError, "one value per slot");
        return NULL;
    }
    return new_slots(cls, descrs, &PyTuple_GET_ITEM(values, 0));
}

/* ---- the EC scan ------------------------------------------------------------------------------------- */
static PyObject *s_part, *s_r;

/* ec_scan(rows, first, failed, windows, closed, n, footprint_kinds, fp_cls, fp_descrs, codec)
 *   -> (next index, status, extent start or None)
 * The classification loop of EventualCheckpointBuilder.build step 2 (its Python twin is
 * recovery.eventual._scan_rows, which defines it): rows from `first` on, newest first; PART rows shaped
 * like parts are passed over (any other PART row stops the scan as a failed row does); a row whose index is in `failed` stops the scan (status 2, next index = that row) for the
 * caller to handle in Python; an R closes (key, seq); a footprint of a key not in `windows` whose window
 * is not closed enters `windows` as fp_cls(offset, key, row, codec, None) (slots in fp_descrs order; the
 * whole row, whose metadata decodes the value at EC-load).
 * Status 1: `windows` reached n entries (next index = the row after the last one used); 0: end of rows. */
static PyObject *py_ec_scan(PyObject *self, PyObject *args) {
    PyObject *rows, *failed, *windows, *closed, *kinds, *fp_cls, *fp_descrs, *codec;
    Py_ssize_t i, n;
    if (!PyArg_ParseTuple(args, "O!nOO!OnOOO!O", &PyList_Type, &rows, &i, &failed, &PyDict_Type, &windows, &closed,
                          &n, &kinds, &fp_cls, &PyTuple_Type, &fp_descrs, &codec))
        return NULL;
    if (PyTuple_GET_SIZE(fp_descrs) != 5) { PyErr_SetString(PyExc_ValueError, "five footprint slots"); return NULL; }
    Py_ssize_t count = PyList_GET_SIZE(rows);
    int check_failed = PyObject_IsTrue(failed);
    if (check_failed < 0) return NULL;
    PyObject *extent = NULL; /* borrowed from rows */
    int status = 0;
    /* The keys of the closed windows: a footprint builds its (key, seq) only when its key is among them
     * (a few results in an extent of ~100k footprints: a tuple per row cost more than the rest). */
    PyObject *closed_keys = PySet_New(NULL);
    if (closed_keys == NULL) return NULL;
    {
        PyObject *it = PyObject_GetIter(closed), *wid;
        if (it == NULL) { Py_DECREF(closed_keys); return NULL; }
        while ((wid = PyIter_Next(it)) != NULL) {
            int rc = PyTuple_Check(wid) && PyTuple_GET_SIZE(wid) == 2 ? PySet_Add(closed_keys, PyTuple_GET_ITEM(wid, 0)) : 0;
            Py_DECREF(wid);
            if (rc < 0) { Py_DECREF(it); Py_DECREF(closed_keys); return NULL; }
        }
        Py_DECREF(it);
        if (PyErr_Occurred()) { Py_DECREF(closed_keys); return NULL; }
    }
    for (; i < count; i++) {
        PyObject *row = PyList_GET_ITEM(rows, i);
        if (!PyTuple_CheckExact(row) || PyTuple_GET_SIZE(row) != 6) { PyErr_SetString(PyExc_TypeError, "row"); goto fail; }
        PyObject *kind = PyTuple_GET_ITEM(row, 1);
        int eq = PyUnicode_Check(kind) ? PyUnicode_Compare(kind, s_part) == 0 : 0;
        if (eq) {  /* a part is passed over only if shaped like one (queuestore.chunks.is_part) */
            PyObject *v = PyTuple_GET_ITEM(row, 5);
            if (PyBytes_CheckExact(v) && PyBytes_GET_SIZE(v) >= 9) {
                const unsigned char *b = (const unsigned char *)PyBytes_AS_STRING(v);
                uint32_t index = (uint32_t)b[1] << 24 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 8 | b[4];
                uint32_t count = (uint32_t)b[5] << 24 | (uint32_t)b[6] << 16 | (uint32_t)b[7] << 8 | b[8];
                if (b[0] == 0xCD && index < count) continue;
            }
            status = 2;
            break;
        }
        if (check_failed) {
            PyObject *idx = PyLong_FromSsize_t(i);
            if (idx == NULL) goto fail;
            int in = PySet_Contains(failed, idx);
            Py_DECREF(idx);
            if (in < 0) goto fail;
            if (in) { status = 2; break; }
        }
        PyObject *key = PyTuple_GET_ITEM(row, 3);
        if (key == Py_None) continue;
        int is_r = PyUnicode_Check(kind) && PyUnicode_Compare(kind, s_r) == 0;
        if (is_r) {
            PyObject *wid = PyTuple_Pack(2, key, PyTuple_GET_ITEM(row, 4));
            if (wid == NULL) goto fail;
            int rc = PySet_Add(closed, wid);
            Py_DECREF(wid);
            if (rc < 0 || PySet_Add(closed_keys, key) < 0) goto fail;
            continue;
        }
        int fp = PySet_Contains(kinds, kind);
        if (fp <= 0) { if (fp < 0) goto fail; continue; }
        int known = PyDict_Contains(windows, key);
        if (known) { if (known < 0) goto fail; continue; }
        int maybe = PySet_GET_SIZE(closed_keys) > 0 ? PySet_Contains(closed_keys, key) : 0;
        if (maybe < 0) goto fail;
        if (maybe) {  /* (key, seq) only built when a window of this key is closed */
            PyObject *wid = PyTuple_Pack(2, key, PyTuple_GET_ITEM(row, 4));
            if (wid == NULL) goto fail;
            int shut = PySet_Contains(closed, wid);
            Py_DECREF(wid);
            if (shut) { if (shut < 0) goto fail; continue; }
        }
        PyObject *values[5] = {PyTuple_GET_ITEM(row, 0), key, row, codec, Py_None};
        PyObject *footprint = new_slots(fp_cls, fp_descrs, values);
        if (footprint == NULL) goto fail;
        int rc = PyDict_SetItem(windows, key, footprint);
        Py_DECREF(footprint);
        if (rc < 0) goto fail;
        extent = PyTuple_GET_ITEM(row, 0);
        if (PyDict_GET_SIZE(windows) >= n) { i++; status = 1; break; }
    }
    Py_DECREF(closed_keys);
    return Py_BuildValue("(niO)", i, status, extent == NULL ? Py_None : extent);
fail:
    Py_DECREF(closed_keys);
    return NULL;
}

/* ---- Kafka messages -> rows -------------------------------------------------------------------------- */
static PyObject *s_error, *s_offset, *s_key, *s_value, *empty_bytes;

/* Strict decimal (optional '-'), as written by the cec writer; anything else is left to Python. */
static int parse_dec(const char *s, Py_ssize_t n, long long *out) {
    Py_ssize_t i = 0;
    int neg = 0;
    if (n > 0 && s[0] == '-') { neg = 1; i = 1; }
    if (i >= n || n - i > 18) return 0;
    long long v = 0;
    for (; i < n; i++) {
        if (s[i] < '0' || s[i] > '9') return 0;
        v = v * 10 + (s[i] - '0');
    }
    *out = neg ? -v : v;
    return 1;
}

/* The row of a message whose key is the cec meta key `kind US time US seq [US key]`; NULL without an
 * exception when the key is anything else. */
static PyObject *row_from_key(PyObject *offset, PyObject *key, PyObject *value) {
    if (!PyBytes_CheckExact(key)) return NULL;
    const char *k = PyBytes_AS_STRING(key);
    Py_ssize_t n = PyBytes_GET_SIZE(key);
    const char *us1 = memchr(k, 0x1f, (size_t)n);
    if (us1 == NULL) return NULL;
    const char *us2 = memchr(us1 + 1, 0x1f, (size_t)(k + n - us1 - 1));
    if (us2 == NULL) return NULL;
    const char *us3 = memchr(us2 + 1, 0x1f, (size_t)(k + n - us2 - 1));
    const char *seq_end = us3 == NULL ? k + n : us3;
    long long t, s;
    if (!parse_dec(us1 + 1, us2 - us1 - 1, &t) || !parse_dec(us2 + 1, seq_end - us2 - 1, &s)) return NULL;
    PyObject *kind = PyUnicode_DecodeUTF8(k, us1 - k, NULL);
    if (kind == NULL) { PyErr_Clear(); return NULL; }
    PyObject *wkey;
    if (us3 == NULL) {
        wkey = Py_NewRef(Py_None);
    } else {
        wkey = PyUnicode_DecodeUTF8(us3 + 1, k + n - us3 - 1, NULL);
        if (wkey == NULL) { PyErr_Clear(); Py_DECREF(kind); return NULL; }
    }
    PyObject *pt = PyLong_FromLongLong(t), *ps = PyLong_FromLongLong(s);
    if (pt == NULL || ps == NULL) {
        Py_XDECREF(pt); Py_XDECREF(ps); Py_DECREF(kind); Py_DECREF(wkey);
        return NULL;  /* with the exception set */
    }
    PyObject *v = PyBytes_CheckExact(value) ? value : empty_bytes;
    Py_INCREF(offset);
    Py_INCREF(v);
    PyObject *row = PyTuple_New(6);
    if (row == NULL) return NULL;
    PyTuple_SET_ITEM(row, 0, offset);
    PyTuple_SET_ITEM(row, 1, kind);
    PyTuple_SET_ITEM(row, 2, pt);
    PyTuple_SET_ITEM(row, 3, wkey);
    PyTuple_SET_ITEM(row, 4, ps);
    PyTuple_SET_ITEM(row, 5, v);
    return row;
}

/* A zigzag varint (Avro's long) at *p, before end; 0 when malformed. */
static int frame_long(const unsigned char **p, const unsigned char *end, long long *out) {
    unsigned long long v = 0;
    for (int shift = 0; shift <= 63 && *p < end; shift += 7) {
        unsigned char b = *(*p)++;
        if (shift == 63 && (b & 0x7E)) return 0;
        v |= (unsigned long long)(b & 0x7F) << shift;
        if (!(b & 0x80)) {
            *out = (long long)(v >> 1) ^ -(long long)(v & 1);
            return 1;
        }
    }
    return 0;
}

/* The row of a message in the framed layout (queuestore.kafka: value = FRAME code time seq value, message
 * key = the window key): NULL without an exception when the message is anything else (or the frame is
 * not plain: a kind spelled out, a key that is not UTF-8), for the Python fallback to read. */
static PyObject *row_from_frame(PyObject *offset, PyObject *key, PyObject *value, int magic, PyObject *codes) {
    if (!PyBytes_CheckExact(value)) return NULL;
    const unsigned char *v = (const unsigned char *)PyBytes_AS_STRING(value);
    const unsigned char *end = v + PyBytes_GET_SIZE(value), *p = v + 2;
    if (end - v < 4 || v[0] != magic || v[1] == 0 || v[1] >= PyTuple_GET_SIZE(codes)) return NULL;
    long long t, s;
    if (!frame_long(&p, end, &t) || !frame_long(&p, end, &s)) return NULL;
    PyObject *wkey;
    if (key == Py_None) {
        wkey = Py_NewRef(Py_None);
    } else if (PyBytes_CheckExact(key)) {
        wkey = PyUnicode_DecodeUTF8(PyBytes_AS_STRING(key), PyBytes_GET_SIZE(key), NULL);
        if (wkey == NULL) { PyErr_Clear(); return NULL; }
    } else {
        return NULL;
    }
    PyObject *pt = PyLong_FromLongLong(t), *ps = PyLong_FromLongLong(s);
    PyObject *body = PyBytes_FromStringAndSize((const char *)p, end - p);
    PyObject *row = PyTuple_New(6);
    if (pt == NULL || ps == NULL || body == NULL || row == NULL) {
        Py_XDECREF(pt); Py_XDECREF(ps); Py_XDECREF(body); Py_XDECREF(row); Py_DECREF(wkey);
        return NULL;  /* with the exception set */
    }
    Py_INCREF(offset);
    PyTuple_SET_ITEM(row, 0, offset);
    PyTuple_SET_ITEM(row, 1, Py_NewRef(PyTuple_GET_ITEM(codes, v[1])));
    PyTuple_SET_ITEM(row, 2, pt);
    PyTuple_SET_ITEM(row, 3, wkey);
    PyTuple_SET_ITEM(row, 4, ps);
    PyTuple_SET_ITEM(row, 5, body);
    return row;
}

/* message_rows(batch, i, start, stop_before, out, fallback, magic, codes) -> (next index, stopped)
 * Appends the rows of batch[i:] with start <= offset < stop_before to `out`, skipping offsets below
 * start. Returns at the first message with an error (its index, stopped False: the caller handles it),
 * at the first offset >= stop_before or == stop_before - 1 after appending (stopped True), or at the end
 * of the batch. A message in the framed layout (frame `magic`, kind codes `codes`) is read from its value
 * and key, one in the legacy layout from its meta key; `fallback(msg, offset)` builds the row of any other. */
static PyObject *py_message_rows(PyObject *self, PyObject *args) {
    PyObject *batch, *out, *fallback, *codes;
    Py_ssize_t i;
    long long start, stop_before;
    int magic;
    if (!PyArg_ParseTuple(args, "O!nLLO!OiO!", &PyList_Type, &batch, &i, &start, &stop_before, &PyList_Type, &out,
                          &fallback, &magic, &PyTuple_Type, &codes))
        return NULL;
    Py_ssize_t count = PyList_GET_SIZE(batch);
    int stopped = 0;
    for (; i < count; i++) {
        PyObject *msg = PyList_GET_ITEM(batch, i);
        PyObject *err = PyObject_CallMethodNoArgs(msg, s_error);
        if (err == NULL) return NULL;
        int has_err = err != Py_None;
        Py_DECREF(err);
        if (has_err) break;
        PyObject *offset = PyObject_CallMethodNoArgs(msg, s_offset);
        if (offset == NULL) return NULL;
        long long off = PyLong_AsLongLong(offset);
        if (off == -1 && PyErr_Occurred()) { Py_DECREF(offset); return NULL; }
        if (off < start) { Py_DECREF(offset); continue; }
        if (stop_before >= 0 && off >= stop_before) { Py_DECREF(offset); stopped = 1; break; }
        PyObject *key = PyObject_CallMethodNoArgs(msg, s_key);
        if (key == NULL) { Py_DECREF(offset); return NULL; }
        PyObject *value = PyObject_CallMethodNoArgs(msg, s_value);
        if (value == NULL) { Py_DECREF(offset); Py_DECREF(key); return NULL; }
        PyObject *row = row_from_frame(offset, key, value, magic, codes);
        if (row == NULL && !PyErr_Occurred()) row = row_from_key(offset, key, value);
        Py_DECREF(key);
        Py_DECREF(value);
        if (row == NULL) {
            if (PyErr_Occurred()) { Py_DECREF(offset); return NULL; }
            row = PyObject_CallFunctionObjArgs(fallback, msg, offset, NULL);
            if (row == NULL) { Py_DECREF(offset); return NULL; }
        }
        Py_DECREF(offset);
        int rc = PyList_Append(out, row);
        Py_DECREF(row);
        if (rc < 0) return NULL;
        if (stop_before >= 0 && off == stop_before - 1) { i++; stopped = 1; break; }
    }
    return Py_BuildValue("(nO)", i, stopped ? Py_True : Py_False);
}

/* ---- flat Avro --------------------------------------------------------------------------------------- */
/* Op codes of a decoding program (see cec.native.compile_avro). */
enum { OP_NULL = 0, OP_BOOL, OP_LONG, OP_FLOAT, OP_DOUBLE, OP_BYTES, OP_STRING, OP_ENUM, OP_UNION, OP_ARRAY };

typedef struct {
    const unsigned char *p, *end;
} cursor;

static int read_long(cursor *c, long long *out) {
    unsigned long long v = 0;
    int shift = 0;
    while (c->p < c->end) {
        unsigned char b = *c->p++;
        if (shift == 63 && (b & 0x7E)) return 0;
        v |= (unsigned long long)(b & 0x7F) << shift;
        if (!(b & 0x80)) {
            *out = (long long)(v >> 1) ^ -(long long)(v & 1);
            return 1;
        }
        shift += 7;
        if (shift > 63) return 0;
    }
    return 0;
}

/* One value of primitive op `code` (arg: enum symbols); NULL without an exception when malformed. */
static PyObject *read_prim(cursor *c, long code, PyObject *arg) {
    long long n;
    switch (code) {
    case OP_NULL:
        return Py_NewRef(Py_None);
    case OP_BOOL:
        if (c->p >= c->end || *c->p > 1) return NULL;
        return PyBool_FromLong(*c->p++);
    case OP_LONG:
        if (!read_long(c, &n)) return NULL;
        return PyLong_FromLongLong(n);
    case OP_FLOAT: {
        if (c->end - c->p < 4) return NULL;
        float f;
        memcpy(&f, c->p, 4);  /* Avro is little-endian, as every platform CPython's wheels target here */
        c->p += 4;
        return PyFloat_FromDouble(f);
    }
    case OP_DOUBLE: {
        if (c->end - c->p < 8) return NULL;
        double d;
        memcpy(&d, c->p, 8);
        c->p += 8;
        return PyFloat_FromDouble(d);
    }
    case OP_BYTES:
    case OP_STRING: {
        if (!read_long(c, &n) || n < 0 || n > c->end - c->p) return NULL;
        PyObject *o = code == OP_BYTES ? PyBytes_FromStringAndSize((const char *)c->p, (Py_ssize_t)n)
                                       : PyUnicode_DecodeUTF8((const char *)c->p, (Py_ssize_t)n, NULL);
        if (o == NULL) PyErr_Clear();
        c->p += n;
        return o;
    }
    case OP_ENUM:
        if (!read_long(c, &n) || n < 0 || n >= PyTuple_GET_SIZE(arg)) return NULL;
        return Py_NewRef(PyTuple_GET_ITEM(arg, n));
    }
    return NULL;
}

static PyObject *read_op(cursor *c, PyObject *op) {
    long code = PyLong_AsLong(PyTuple_GET_ITEM(op, 0));
    PyObject *arg = PyTuple_GET_ITEM(op, 1);
    long long n;
    if (code == OP_UNION) {  /* arg: tuple of branch ops */
        if (!read_long(c, &n) || n < 0 || n >= PyTuple_GET_SIZE(arg)) return NULL;
        return read_op(c, PyTuple_GET_ITEM(arg, n));
    }
    if (code == OP_ARRAY) {  /* arg: the item op; decoded as a tuple */
        PyObject *items = PyList_New(0);
        if (items == NULL) { PyErr_Clear(); return NULL; }
        for (;;) {
            if (!read_long(c, &n)) goto bad;
            if (n == 0) break;
            if (n < 0) {
                long long size;
                if (!read_long(c, &size)) goto bad;
                n = -n;
            }
            if (n > c->end - c->p) goto bad;  /* every item takes at least one byte */
            for (long long k = 0; k < n; k++) {
                PyObject *item = read_op(c, arg);
                if (item == NULL) goto bad;
                int rc = PyList_Append(items, item);
                Py_DECREF(item);
                if (rc < 0) { PyErr_Clear(); goto bad; }
            }
        }
        PyObject *t = PyList_AsTuple(items);
        Py_DECREF(items);
        if (t == NULL) PyErr_Clear();
        return t;
    bad:
        Py_DECREF(items);
        return NULL;
    }
    return read_prim(c, code, arg);
}

/* decode_avro(program, data, start, cls=None, descrs=None) -> tuple of the record's fields (or, with cls,
 * an instance of cls whose slot descriptors `descrs` get the fields in order), or None when the body is malformed
 * or does not end exactly at the end of `data` (the caller then decodes with fastavro for the error). */
/* One record of `data[start:]`: a new reference, Py_None (borrowed-style: returned with a new ref) when
 * declined, NULL with an exception on a real error. */
/* `head` (NULL: none): values placed before the decoded fields (the metadata kept beside the value). */
static PyObject *decode_one(PyObject *program, const unsigned char *data, Py_ssize_t len, Py_ssize_t start,
                            PyObject *cls, PyObject *descrs, PyObject *const *head, Py_ssize_t nhead) {
    if (start < 0 || start > len) Py_RETURN_NONE;
    cursor c = {data + start, data + len};
    Py_ssize_t fields = nhead + PyTuple_GET_SIZE(program);
    PyObject *out = PyTuple_New(fields);
    if (out == NULL) return NULL;
    for (Py_ssize_t i = 0; i < nhead; i++) PyTuple_SET_ITEM(out, i, Py_NewRef(head[i]));
    for (Py_ssize_t i = nhead; i < fields; i++) {
        PyObject *v = read_op(&c, PyTuple_GET_ITEM(program, i - nhead));
        if (v == NULL) {
            Py_DECREF(out);
            if (PyErr_Occurred()) return NULL;
            Py_RETURN_NONE;
        }
        PyTuple_SET_ITEM(out, i, v);
    }
    if (c.p != c.end) {
        Py_DECREF(out);
        Py_RETURN_NONE;
    }
    if (cls == Py_None) return out;
    if (!PyTuple_Check(descrs) || PyTuple_GET_SIZE(descrs) != fields) {
        Py_DECREF(out);
        PyErr_SetString(PyExc_ValueError, "one slot descriptor per field");
        return NULL;
    }
    PyObject *obj = new_slots(cls, descrs, &PyTuple_GET_ITEM(out, 0));
    Py_DECREF(out);
    return obj;
}

/* decode_avro_many(program, values, start, cls=None, descrs=None) -> list: decode_avro of each bytes. */
static PyObject *py_decode_avro_many(PyObject *self, PyObject *args) {
    PyObject *program, *values, *cls = Py_None, *descrs = Py_None;
    Py_ssize_t start;
    if (!PyArg_ParseTuple(args, "O!O!n|OO", &PyTuple_Type, &program, &PyList_Type, &values, &start, &cls, &descrs))
        return NULL;
    Py_ssize_t count = PyList_GET_SIZE(values);
    PyObject *out = PyList_New(count);
    if (out == NULL) return NULL;
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *v = PyList_GET_ITEM(values, i);
        PyObject *r;
        if (PyBytes_CheckExact(v)) {
            r = decode_one(program, (const unsigned char *)PyBytes_AS_STRING(v), PyBytes_GET_SIZE(v), start, cls, descrs,
                           NULL, 0);
            if (r == NULL) { Py_DECREF(out); return NULL; }
        } else {
            r = Py_NewRef(Py_None);
        }
        PyList_SET_ITEM(out, i, r);
    }
    return out;
}

/* A stored row (offset, kind, time, key, seq, value) that a rows decoder takes: `head` set to (kinds[kind],
 * time, key, seq) (borrowed) and `*value` to its value. 1 taken, 0 declined (not such a row, an unknown
 * kind, a value too short or of another version), -1 error. */
static int row_head(PyObject *row, PyObject *kinds, Py_ssize_t start, int version, PyObject *head[4],
                    PyObject **value) {
    if (!PyTuple_Check(row) || PyTuple_GET_SIZE(row) != 6) return 0;
    PyObject *v = PyTuple_GET_ITEM(row, 5);
    PyObject *kind = PyDict_GetItemWithError(kinds, PyTuple_GET_ITEM(row, 1));
    if (kind == NULL) return PyErr_Occurred() ? -1 : 0;
    if (!PyBytes_CheckExact(v) || PyBytes_GET_SIZE(v) <= start || start < 2 ||
        (unsigned char)PyBytes_AS_STRING(v)[1] != version)
        return 0;
    head[0] = kind;
    head[1] = PyTuple_GET_ITEM(row, 2);
    head[2] = PyTuple_GET_ITEM(row, 3);
    head[3] = PyTuple_GET_ITEM(row, 4);
    *value = v;
    return 1;
}

/* decode_avro_rows(program, rows, start, cls, descrs, kinds, version) -> list, one entry per row
 * (offset, kind, time, key, seq, value): cls with slots `descrs` set to (kinds[kind], time, key, seq) and
 * then the fields of value[start:], or None (declined: another version, an unknown kind, a malformed body;
 * the caller decodes that one in Python, which reports the error). */
static PyObject *py_decode_avro_rows(PyObject *self, PyObject *args) {
    PyObject *program, *rows, *cls, *descrs, *kinds;
    Py_ssize_t start;
    int version;
    if (!PyArg_ParseTuple(args, "O!O!nOO!O!i", &PyTuple_Type, &program, &PyList_Type, &rows, &start, &cls,
                          &PyTuple_Type, &descrs, &PyDict_Type, &kinds, &version))
        return NULL;
    Py_ssize_t count = PyList_GET_SIZE(rows);
    PyObject *out = PyList_New(count);
    if (out == NULL) return NULL;
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *head[4], *v, *r = NULL;
        int taken = row_head(PyList_GET_ITEM(rows, i), kinds, start, version, head, &v);
        if (taken < 0) { Py_DECREF(out); return NULL; }
        if (taken) {
            r = decode_one(program, (const unsigned char *)PyBytes_AS_STRING(v), PyBytes_GET_SIZE(v), start, cls,
                           descrs, head, 4);
            if (r == NULL) { Py_DECREF(out); return NULL; }
        }
        PyList_SET_ITEM(out, i, r == NULL ? Py_NewRef(Py_None) : r);
    }
    return out;
}

static PyObject *py_decode_avro(PyObject *self, PyObject *args) {
    PyObject *program, *cls = Py_None, *descrs = Py_None;
    Py_buffer buf;
    Py_ssize_t start;
    if (!PyArg_ParseTuple(args, "O!y*n|OO", &PyTuple_Type, &program, &buf, &start, &cls, &descrs)) return NULL;
    PyObject *r = decode_one(program, buf.buf, buf.len, start, cls, descrs, NULL, 0);
    PyBuffer_Release(&buf);
    return r;
}

/* ---- compact record bodies (cec.records, version 4) -------------------------------------------------- */
/* The C twin of cec.records._decode_compact, which defines the layout and has the final word: anything
 * unusual here is declined (None) and decoded there, which reports the error. */
enum { F_STATE = 0x01, F_PAYLOAD = 0x02, F_MARKS = 0x04, F_PAYLOAD_KEYED = 0x08, F_POS_FROM_TIME = 0x10, F_ALL = 0x1F };

static int put_zigzag(unsigned char *out, long long v) {
    unsigned long long z = ((unsigned long long)v << 1) ^ (unsigned long long)(v >> 63);
    int n = 0;
    while (z >= 0x80) { out[n++] = (unsigned char)((z & 0x7F) | 0x80); z >>= 7; }
    out[n++] = (unsigned char)z;
    return n;
}

static int as_long_long(PyObject *o, long long *out) {
    if (!PyLong_Check(o)) return 0;
    int overflow = 0;
    *out = PyLong_AsLongLongAndOverflow(o, &overflow);
    if (overflow || (*out == -1 && PyErr_Occurred())) { PyErr_Clear(); return 0; }
    return 1;
}

/* A tuple of `count` longs read from c (the first plus `base`); NULL (no exception) when malformed. */
static PyObject *read_longs(cursor *c, long long count, long long base) {
    PyObject *t = PyTuple_New((Py_ssize_t)count);
    if (t == NULL) return NULL;
    for (long long k = 0; k < count; k++) {
        long long v;
        PyObject *o;
        if (!read_long(c, &v) || (k == 0 && __builtin_add_overflow(v, base, &v)) ||
            (o = PyLong_FromLongLong(v)) == NULL) {
            PyErr_Clear();
            Py_DECREF(t);
            return NULL;
        }
        PyTuple_SET_ITEM(t, (Py_ssize_t)k, o);
    }
    return t;
}

/* The record of the version-4 body at data[start:] whose metadata is head (kind, time, key, seq), as an
 * instance of cls with its nine slots `descrs` set: a new reference, Py_None when declined, NULL with an
 * exception on a real error. */
static PyObject *compact_one(const unsigned char *data, Py_ssize_t len, Py_ssize_t start, PyObject *const *head,
                             PyObject *cls, PyObject *descrs) {
    if (PyTuple_GET_SIZE(descrs) != 9) { PyErr_SetString(PyExc_ValueError, "nine slot descriptors"); return NULL; }
    if (start < 0 || start >= len) Py_RETURN_NONE;
    unsigned flags = data[start];
    if (flags & ~F_ALL) Py_RETURN_NONE;
    cursor c = {data + start + 1, data + len};
    PyObject *pos = NULL, *n_obj = NULL, *state = NULL, *payload = NULL, *marks = NULL, *obj = NULL;
    long long count, n, size, time = 0;
    if (!read_long(&c, &count) || count < 0 || count > c.end - c.p) goto done;
    if ((flags & F_POS_FROM_TIME) && (count == 0 || !as_long_long(head[1], &time))) goto done;
    if ((pos = read_longs(&c, count, time)) == NULL) goto done;
    if (!read_long(&c, &n)) goto done;
    if ((n_obj = PyLong_FromLongLong(n)) == NULL) goto error;
    if (flags & F_STATE) {
        if (!read_long(&c, &size) || size < 0 || size > c.end - c.p) goto done;
        if ((state = PyBytes_FromStringAndSize((const char *)c.p, (Py_ssize_t)size)) == NULL) goto error;
        c.p += size;
    } else {
        state = Py_NewRef(Py_None);
    }
    if (flags & F_PAYLOAD) {
        if (!read_long(&c, &size) || size < 0 || size > c.end - c.p) goto done;
        if (flags & F_PAYLOAD_KEYED) {  /* the Avro (string key, long seq) put back in front */
            long long seq;
            Py_ssize_t key_len;
            if (!PyUnicode_Check(head[2]) || !as_long_long(head[3], &seq)) goto done;
            const char *key = PyUnicode_AsUTF8AndSize(head[2], &key_len);
            if (key == NULL) { PyErr_Clear(); goto done; }
            unsigned char len_bytes[10], seq_bytes[10];
            int a = put_zigzag(len_bytes, (long long)key_len), b = put_zigzag(seq_bytes, seq);
            if ((payload = PyBytes_FromStringAndSize(NULL, a + key_len + b + (Py_ssize_t)size)) == NULL) goto error;
            char *out = PyBytes_AS_STRING(payload);
            memcpy(out, len_bytes, (size_t)a);
            memcpy(out + a, key, (size_t)key_len);
            memcpy(out + a + key_len, seq_bytes, (size_t)b);
            memcpy(out + a + key_len + b, c.p, (size_t)size);
        } else if ((payload = PyBytes_FromStringAndSize((const char *)c.p, (Py_ssize_t)size)) == NULL) {
            goto error;
        }
        c.p += size;
    } else {
        if (flags & F_PAYLOAD_KEYED) goto done;
        payload = Py_NewRef(Py_None);
    }
    if (flags & F_MARKS) {
        if (!read_long(&c, &count) || count <= 0 || count > c.end - c.p) goto done;
        if ((marks = read_longs(&c, count, 0)) == NULL) goto done;
    } else if ((marks = PyTuple_New(0)) == NULL) {
        goto error;
    }
    if (c.p != c.end) goto done;
    PyObject *values[9] = {head[0], head[1], head[2], head[3], pos, n_obj, state, payload, marks};
    obj = new_slots(cls, descrs, values);
    goto out;
done:
    obj = Py_NewRef(Py_None);
    goto out;
error:
    obj = NULL;
out:
    Py_XDECREF(pos);
    Py_XDECREF(n_obj);
    Py_XDECREF(state);
    Py_XDECREF(payload);
    Py_XDECREF(marks);
    return obj;
}

/* decode_compact(data, start, head, cls, descrs) -> an instance of cls, or None (declined). */
static PyObject *py_decode_compact(PyObject *self, PyObject *args) {
    PyObject *head, *cls, *descrs;
    Py_buffer buf;
    Py_ssize_t start;
    if (!PyArg_ParseTuple(args, "y*nO!OO!", &buf, &start, &PyTuple_Type, &head, &cls, &PyTuple_Type, &descrs))
        return NULL;
    PyObject *r;
    if (PyTuple_GET_SIZE(head) != 4) {
        PyErr_SetString(PyExc_ValueError, "head is (kind, time, key, seq)");
        r = NULL;
    } else {
        r = compact_one(buf.buf, buf.len, start, &PyTuple_GET_ITEM(head, 0), cls, descrs);
    }
    PyBuffer_Release(&buf);
    return r;
}

/* decode_compact_rows(rows, start, cls, descrs, kinds, version) -> list, one entry per row (offset, kind,
 * time, key, seq, value): the record (kind mapped through `kinds`), or None (declined: another version, an
 * unknown kind, a malformed body). */
static PyObject *py_decode_compact_rows(PyObject *self, PyObject *args) {
    PyObject *rows, *cls, *descrs, *kinds;
    Py_ssize_t start;
    int version;
    if (!PyArg_ParseTuple(args, "O!nOO!O!i", &PyList_Type, &rows, &start, &cls, &PyTuple_Type, &descrs,
                          &PyDict_Type, &kinds, &version))
        return NULL;
    Py_ssize_t count = PyList_GET_SIZE(rows);
    PyObject *out = PyList_New(count);
    if (out == NULL) return NULL;
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *head[4], *v, *r = NULL;
        int taken = row_head(PyList_GET_ITEM(rows, i), kinds, start, version, head, &v);
        if (taken < 0) { Py_DECREF(out); return NULL; }
        if (taken) {
            r = compact_one((const unsigned char *)PyBytes_AS_STRING(v), PyBytes_GET_SIZE(v), start, head, cls, descrs);
            if (r == NULL) { Py_DECREF(out); return NULL; }
            if (r == Py_None) { Py_DECREF(r); r = NULL; }
        }
        PyList_SET_ITEM(out, i, r == NULL ? Py_NewRef(Py_None) : r);
    }
    return out;
}


/* ---- the Kafka topic source's batches (operators.topic_source) --------------------------------------- */
/* A decoded input record as a read-only mapping: the fields the operator reads (key, value, time) held
 * directly, no dict per record. A layout, shared by every record of a source, is the tuple
 * (names, index, loader): `names` the held fields in order, `index` {name: position}, `loader` None when
 * the held fields are the whole record (flat Avro), else a callable that decodes the whole record from
 * `raw` (JSON: json.loads) the first time a field that is not held, the length, the keys... are asked
 * for. Either way the mapping equals the record the per-record decoder gives. */
typedef struct {
    PyObject_VAR_HEAD
    PyObject *layout;
    PyObject *raw;   /* the bytes the record was decoded from (NULL for Avro) */
    PyObject *full;  /* the whole record as a dict, once asked for */
    PyObject *items[1];
} RecordObject;

static PyTypeObject Record_Type;

static int record_traverse(RecordObject *self, visitproc visit, void *arg) {
    Py_VISIT(self->layout);
    Py_VISIT(self->raw);
    Py_VISIT(self->full);
    for (Py_ssize_t i = 0; i < Py_SIZE(self); i++) Py_VISIT(self->items[i]);
    return 0;
}

/* Only the loaded dict can hold mutable values (a cycle through it); the held fields stay. */
static int record_clear(RecordObject *self) {
    Py_CLEAR(self->full);
    return 0;
}

static void record_dealloc(RecordObject *self) {
    PyObject_GC_UnTrack(self);
    Py_XDECREF(self->layout);
    Py_XDECREF(self->raw);
    Py_XDECREF(self->full);
    for (Py_ssize_t i = 0; i < Py_SIZE(self); i++) Py_XDECREF(self->items[i]);
    PyObject_GC_Del(self);
}

/* The whole record as a dict (borrowed), loaded and kept on first use; NULL with an exception. */
static PyObject *record_full(RecordObject *self) {
    if (self->full != NULL) return self->full;
    PyObject *names = PyTuple_GET_ITEM(self->layout, 0), *loader = PyTuple_GET_ITEM(self->layout, 2);
    PyObject *d;
    if (loader == Py_None) {
        d = PyDict_New();
        if (d == NULL) return NULL;
        for (Py_ssize_t i = 0; i < Py_SIZE(self); i++) {
            if (PyDict_SetItem(d, PyTuple_GET_ITEM(names, i), self->items[i]) < 0) { Py_DECREF(d); return NULL; }
        }
    } else {
        d = PyObject_CallOneArg(loader, self->raw);
        if (d == NULL) return NULL;
        if (!PyDict_Check(d)) {
            Py_DECREF(d);
            PyErr_SetString(PyExc_TypeError, "a record loader must return a dict");
            return NULL;
        }
    }
    self->full = d;
    if (!PyObject_GC_IsTracked((PyObject *)self)) PyObject_GC_Track(self);  /* the dict may hold anything */
    return d;
}

/* The value of `key` (borrowed), NULL with no exception when absent, NULL with one on an error. */
static PyObject *record_lookup(RecordObject *self, PyObject *key) {
    PyObject *pos = PyDict_GetItemWithError(PyTuple_GET_ITEM(self->layout, 1), key);
    if (pos != NULL) return self->items[PyLong_AsSsize_t(pos)];
    if (PyErr_Occurred() || PyTuple_GET_ITEM(self->layout, 2) == Py_None) return NULL;
    PyObject *full = record_full(self);
    return full == NULL ? NULL : PyDict_GetItemWithError(full, key);
}

static PyObject *record_subscript(RecordObject *self, PyObject *key) {
    PyObject *v = record_lookup(self, key);
    if (v == NULL) {
        if (!PyErr_Occurred()) PyErr_SetObject(PyExc_KeyError, key);
        return NULL;
    }
    return Py_NewRef(v);
}

static Py_ssize_t record_length(RecordObject *self) {
    if (PyTuple_GET_ITEM(self->layout, 2) == Py_None) return Py_SIZE(self);
    PyObject *full = record_full(self);
    return full == NULL ? -1 : PyDict_GET_SIZE(full);
}

static int record_contains(RecordObject *self, PyObject *key) {
    PyObject *v = record_lookup(self, key);
    return v != NULL ? 1 : PyErr_Occurred() ? -1 : 0;
}

static PyObject *record_get(RecordObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs < 1 || nargs > 2) {
        PyErr_SetString(PyExc_TypeError, "get(key, default=None)");
        return NULL;
    }
    PyObject *v = record_lookup(self, args[0]);
    if (v == NULL) {
        if (PyErr_Occurred()) return NULL;
        v = nargs == 2 ? args[1] : Py_None;
    }
    return Py_NewRef(v);
}

static PyObject *record_delegate(RecordObject *self, const char *name) {
    PyObject *full = record_full(self);
    return full == NULL ? NULL : PyObject_CallMethod(full, name, NULL);
}

static PyObject *record_keys(RecordObject *self, PyObject *unused) { return record_delegate(self, "keys"); }
static PyObject *record_values(RecordObject *self, PyObject *unused) { return record_delegate(self, "values"); }
static PyObject *record_items(RecordObject *self, PyObject *unused) { return record_delegate(self, "items"); }

/* Pickled and copied as the dict it equals. */
static PyObject *record_reduce(RecordObject *self, PyObject *unused) {
    PyObject *full = record_full(self);
    return full == NULL ? NULL : Py_BuildValue("(O(O))", (PyObject *)&PyDict_Type, full);
}

static PyObject *record_iter(RecordObject *self) {
    PyObject *full = record_full(self);
    return full == NULL ? NULL : PyObject_GetIter(full);
}

static PyObject *record_repr(RecordObject *self) {
    PyObject *full = record_full(self);
    return full == NULL ? NULL : PyObject_Repr(full);
}

static PyObject *record_richcompare(RecordObject *self, PyObject *other, int op) {
    if ((op != Py_EQ && op != Py_NE) || !(PyDict_Check(other) || Py_IS_TYPE(other, &Record_Type)))
        Py_RETURN_NOTIMPLEMENTED;
    PyObject *mine = record_full(self);
    if (mine == NULL) return NULL;
    PyObject *theirs = other;
    if (Py_IS_TYPE(other, &Record_Type)) {
        theirs = record_full((RecordObject *)other);
        if (theirs == NULL) return NULL;
    }
    return PyObject_RichCompare(mine, theirs, op);
}

static PyMethodDef record_methods[] = {
    {"get", (PyCFunction)(void (*)(void))record_get, METH_FASTCALL, "get(key, default=None)"},
    {"keys", (PyCFunction)record_keys, METH_NOARGS, NULL},
    {"values", (PyCFunction)record_values, METH_NOARGS, NULL},
    {"items", (PyCFunction)record_items, METH_NOARGS, NULL},
    {"__reduce__", (PyCFunction)record_reduce, METH_NOARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static PyMappingMethods record_as_mapping = {(lenfunc)record_length, (binaryfunc)record_subscript, NULL};
static PySequenceMethods record_as_sequence = {.sq_contains = (objobjproc)record_contains};

static PyTypeObject Record_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "cec._native.Record",
    .tp_doc = "A decoded input record: a read-only mapping equal to the record's dict.",
    .tp_basicsize = offsetof(RecordObject, items),
    .tp_itemsize = sizeof(PyObject *),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_MAPPING,
    .tp_dealloc = (destructor)record_dealloc,
    .tp_traverse = (traverseproc)record_traverse,
    .tp_clear = (inquiry)record_clear,
    .tp_repr = (reprfunc)record_repr,
    .tp_hash = PyObject_HashNotImplemented,
    .tp_as_mapping = &record_as_mapping,
    .tp_as_sequence = &record_as_sequence,
    .tp_iter = (getiterfunc)record_iter,
    .tp_richcompare = (richcmpfunc)record_richcompare,
    .tp_methods = record_methods,
};

/* Objects that cannot refer to anything: a record or tuple holding only these needs no GC tracking. */
static int atomic(PyObject *o) {
    return o == Py_None || PyUnicode_CheckExact(o) || PyLong_CheckExact(o) || PyFloat_CheckExact(o) ||
           PyBool_Check(o) || PyBytes_CheckExact(o);
}

/* A new record of `n` fields of `layout` with no fields set yet (untracked: see record_finish). */
static RecordObject *record_new(PyObject *layout, Py_ssize_t n, PyObject *raw) {
    RecordObject *r = PyObject_GC_NewVar(RecordObject, &Record_Type, n);
    if (r == NULL) return NULL;
    r->layout = Py_NewRef(layout);
    r->raw = raw == NULL ? NULL : Py_NewRef(raw);
    r->full = NULL;
    for (Py_ssize_t i = 0; i < n; i++) r->items[i] = NULL;
    return r;
}

/* Tracked by the cyclic GC only if a field could be part of a cycle (a batch allocates one per record). */
static void record_finish(RecordObject *r) {
    for (Py_ssize_t i = 0; i < Py_SIZE(r); i++) {
        if (!atomic(r->items[i])) { PyObject_GC_Track(r); return; }
    }
}

/* -- JSON: a strict scanner that holds the wanted top-level fields and checks the rest ----------------- */
/* It accepts a subset of what the json format accepts (operators.formats), with the same values, which
 * are also json.loads's: one object, RFC 8259 syntax, strict UTF-8 (json.loads would pass encoded
 * surrogates), no byte order mark, no NaN / Infinity, strings without control characters or lone
 * surrogate escapes, nesting up to JSON_DEPTH, numbers of at most JSON_DIGITS characters. Anything else,
 * and a record whose wanted field is missing, null or not a string / number / boolean, is declined: the
 * caller decodes that one on its own, which gives its value or its reason. */
#define JSON_DEPTH 64
#define JSON_DIGITS 600  /* below the least int_max_str_digits Python allows (640) */

typedef struct {
    const unsigned char *p, *end;
} jcur;

static void json_ws(jcur *c) {
    while (c->p < c->end && (*c->p == ' ' || *c->p == '\t' || *c->p == '\n' || *c->p == '\r')) c->p++;
}

static int hex4(const unsigned char *p, unsigned int *out) {
    unsigned int v = 0;
    for (int i = 0; i < 4; i++) {
        unsigned char ch = p[i];
        v <<= 4;
        if (ch >= '0' && ch <= '9') v |= ch - '0';
        else if (ch >= 'a' && ch <= 'f') v |= ch - 'a' + 10;
        else if (ch >= 'A' && ch <= 'F') v |= ch - 'A' + 10;
        else return 0;
    }
    *out = v;
    return 1;
}

/* Length of the valid UTF-8 sequence (2-4 bytes, no overlongs, no surrogates, <= U+10FFFF) at p, or 0. */
static int utf8_seq(const unsigned char *p, const unsigned char *end) {
    unsigned char b = p[0];
    Py_ssize_t left = end - p;
#define CONT(i) (left > (i) && (p[i] & 0xC0) == 0x80)
    if (b >= 0xC2 && b <= 0xDF) return CONT(1) ? 2 : 0;
    if (b >= 0xE0 && b <= 0xEF) {
        if (!CONT(1) || !CONT(2)) return 0;
        if (b == 0xE0 && p[1] < 0xA0) return 0;
        if (b == 0xED && p[1] > 0x9F) return 0;
        return 3;
    }
    if (b >= 0xF0 && b <= 0xF4) {
        if (!CONT(1) || !CONT(2) || !CONT(3)) return 0;
        if (b == 0xF0 && p[1] < 0x90) return 0;
        if (b == 0xF4 && p[1] > 0x8F) return 0;
        return 4;
    }
#undef CONT
    return 0;
}

/* A string at c->p (its opening quote): 1 with c->p past the closing quote, [*s, *s + *n) its contents
 * as written and *escaped whether they hold a backslash; 0 when it is not a valid string. */
static int json_string(jcur *c, const unsigned char **s, Py_ssize_t *n, int *escaped) {
    const unsigned char *p = c->p + 1, *end = c->end;
    *escaped = 0;
    while (p < end) {
        unsigned char b = *p;
        if (b == '"') {
            *s = c->p + 1;
            *n = p - *s;
            c->p = p + 1;
            return 1;
        }
        if (b < 0x20) return 0;
        if (b == '\\') {
            *escaped = 1;
            if (end - p < 2) return 0;
            unsigned char e = p[1];
            if (e == 'u') {
                unsigned int u, lo;
                if (end - p < 6 || !hex4(p + 2, &u)) return 0;
                p += 6;
                /* A surrogate escape must be a high one followed by a low one (the format refuses a lone
                 * surrogate anywhere in a record, a field it skips included: operators.formats). */
                if (u >= 0xDC00 && u <= 0xDFFF) return 0;
                if (u >= 0xD800 && u <= 0xDBFF) {
                    if (end - p < 6 || p[0] != '\\' || p[1] != 'u' || !hex4(p + 2, &lo) || lo < 0xDC00 || lo > 0xDFFF)
                        return 0;
                    p += 6;
                }
            } else if (e == '"' || e == '\\' || e == '/' || e == 'b' || e == 'f' || e == 'n' || e == 'r' || e == 't') {
                p += 2;
            } else {
                return 0;
            }
        } else if (b < 0x80) {
            p++;
        } else {
            int k = utf8_seq(p, end);
            if (k == 0) return 0;
            p += k;
        }
    }
    return 0;
}

static Py_ssize_t put_utf8(unsigned char *out, unsigned int cp) {
    if (cp < 0x80) { out[0] = (unsigned char)cp; return 1; }
    if (cp < 0x800) { out[0] = 0xC0 | (cp >> 6); out[1] = 0x80 | (cp & 0x3F); return 2; }
    if (cp < 0x10000) {
        out[0] = 0xE0 | (cp >> 12); out[1] = 0x80 | ((cp >> 6) & 0x3F); out[2] = 0x80 | (cp & 0x3F);
        return 3;
    }
    out[0] = 0xF0 | (cp >> 18); out[1] = 0x80 | ((cp >> 12) & 0x3F);
    out[2] = 0x80 | ((cp >> 6) & 0x3F); out[3] = 0x80 | (cp & 0x3F);
    return 4;
}

/* The str of a scanned string's contents; NULL without an exception to decline (a lone surrogate, which
 * json.loads keeps but UTF-8 cannot hold: json_string refuses it already), NULL with one on a memory error. */
static PyObject *json_str(const unsigned char *s, Py_ssize_t n, int escaped) {
    if (!escaped) return PyUnicode_DecodeUTF8((const char *)s, n, NULL);
    unsigned char *buf = PyMem_Malloc(n > 0 ? (size_t)n : 1);  /* unescaping never lengthens */
    if (buf == NULL) return PyErr_NoMemory();
    Py_ssize_t k = 0;
    for (Py_ssize_t i = 0; i < n;) {
        if (s[i] != '\\') { buf[k++] = s[i++]; continue; }
        unsigned char e = s[i + 1];
        if (e != 'u') {
            buf[k++] = e == 'b' ? '\b' : e == 'f' ? '\f' : e == 'n' ? '\n' : e == 'r' ? '\r' : e == 't' ? '\t' : e;
            i += 2;
            continue;
        }
        unsigned int u, lo;
        hex4(s + i + 2, &u);
        i += 6;
        if (u >= 0xD800 && u <= 0xDBFF && i + 6 <= n && s[i] == '\\' && s[i + 1] == 'u' && hex4(s + i + 2, &lo) &&
            lo >= 0xDC00 && lo <= 0xDFFF) {
            u = 0x10000 + ((u - 0xD800) << 10) + (lo - 0xDC00);
            i += 6;
        } else if (u >= 0xD800 && u <= 0xDFFF) {
            PyMem_Free(buf);
            return NULL;
        }
        k += put_utf8(buf + k, u);
    }
    PyObject *out = PyUnicode_DecodeUTF8((const char *)buf, k, NULL);
    PyMem_Free(buf);
    return out;
}

/* A number at c->p: 1 with c->p past it and *is_int set; 0 when it is not one (or too long). */
static int json_number(jcur *c, int *is_int) {
    const unsigned char *p = c->p, *end = c->end, *start = c->p;
    *is_int = 1;
    if (p < end && *p == '-') p++;
    if (p >= end) return 0;
    if (*p == '0') {
        p++;
    } else if (*p >= '1' && *p <= '9') {
        while (p < end && *p >= '0' && *p <= '9') p++;
    } else {
        return 0;
    }
    if (p < end && *p == '.') {
        *is_int = 0;
        p++;
        if (p >= end || *p < '0' || *p > '9') return 0;
        while (p < end && *p >= '0' && *p <= '9') p++;
    }
    if (p < end && (*p == 'e' || *p == 'E')) {
        *is_int = 0;
        p++;
        if (p < end && (*p == '+' || *p == '-')) p++;
        if (p >= end || *p < '0' || *p > '9') return 0;
        while (p < end && *p >= '0' && *p <= '9') p++;
    }
    if (p - start > JSON_DIGITS) return 0;
    c->p = p;
    return 1;
}

/* A decimal float of at most 15 significant digits... exactly: the digits as an integer m <= 2^53 and a
 * power of ten 10^k with |k| <= 22 are both exact doubles, so one IEEE multiplication or division gives
 * the correctly rounded value, as float() does (Clinger's fast path; strtod takes it too, after more
 * work). 0 when the number is not that simple. */
static int json_fast_double(const unsigned char *s, Py_ssize_t n, double *out) {
#if defined(FLT_EVAL_METHOD) && FLT_EVAL_METHOD == 0
    static const double pow10[] = {1e0,  1e1,  1e2,  1e3,  1e4,  1e5,  1e6,  1e7,  1e8,  1e9,  1e10, 1e11,
                                   1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};
    Py_ssize_t i = 0;
    int neg = s[0] == '-', digits = 0;
    unsigned long long m = 0;
    long e = 0;
    if (neg) i++;
    for (; i < n && s[i] >= '0' && s[i] <= '9'; i++) {
        if (m || s[i] != '0') digits++;
        if (digits > 15) return 0;
        m = m * 10 + (unsigned long long)(s[i] - '0');
    }
    if (i < n && s[i] == '.') {
        for (i++; i < n && s[i] >= '0' && s[i] <= '9'; i++) {
            if (m || s[i] != '0') digits++;
            if (digits > 15) return 0;
            m = m * 10 + (unsigned long long)(s[i] - '0');
            e--;
        }
    }
    if (i < n) {  /* the exponent (the scanner checked its syntax) */
        int eneg = 0;
        long x = 0;
        i++;
        if (s[i] == '+' || s[i] == '-') eneg = s[i++] == '-';
        for (; i < n; i++) {
            if (x > 1000) return 0;
            x = x * 10 + (s[i] - '0');
        }
        e += eneg ? -x : x;
    }
    double d = (double)m;  /* exact: m < 10^15 < 2^53 */
    if (m == 0) {
        d = 0.0;
    } else if (e >= 0 && e <= 22) {
        d *= pow10[e];
    } else if (e < 0 && e >= -22) {
        d /= pow10[-e];
    } else {
        return 0;
    }
    *out = neg ? -d : d;
    return 1;
#else
    return 0;
#endif
}

/* The int or float of a scanned number (as int() / float() read it, like json.loads). */
static PyObject *json_number_value(const unsigned char *s, Py_ssize_t n, int is_int) {
    double fast;
    if (!is_int && json_fast_double(s, n, &fast)) return PyFloat_FromDouble(fast);
    if (is_int && n <= 18) {
        long long v = 0;
        Py_ssize_t i = s[0] == '-';
        for (; i < n; i++) v = v * 10 + (s[i] - '0');
        return PyLong_FromLongLong(s[0] == '-' ? -v : v);
    }
    char small[64];
    char *buf = n < (Py_ssize_t)sizeof(small) ? small : PyMem_Malloc((size_t)n + 1);
    if (buf == NULL) return PyErr_NoMemory();
    memcpy(buf, s, (size_t)n);
    buf[n] = 0;
    PyObject *out;
    if (is_int) {
        out = PyLong_FromString(buf, NULL, 10);
    } else {
        double d = PyOS_string_to_double(buf, NULL, NULL);
        out = d == -1.0 && PyErr_Occurred() ? NULL : PyFloat_FromDouble(d);
    }
    if (buf != small) PyMem_Free(buf);
    return out;
}

static int json_literal(jcur *c, const char *word, Py_ssize_t n) {
    if (c->end - c->p < n || memcmp(c->p, word, (size_t)n) != 0) return 0;
    c->p += n;
    return 1;
}

/* Skip one value (checking it); 0 when invalid or nested deeper than JSON_DEPTH. */
static int json_skip(jcur *c, int depth) {
    if (c->p >= c->end) return 0;
    unsigned char b = *c->p;
    const unsigned char *s;
    Py_ssize_t n;
    int flag;
    if (b == '"') return json_string(c, &s, &n, &flag);
    if (b == '-' || (b >= '0' && b <= '9')) return json_number(c, &flag);
    if (b == 't') return json_literal(c, "true", 4);
    if (b == 'f') return json_literal(c, "false", 5);
    if (b == 'n') return json_literal(c, "null", 4);
    if (b != '{' && b != '[') return 0;
    if (depth >= JSON_DEPTH) return 0;
    unsigned char close = b == '{' ? '}' : ']';
    c->p++;
    json_ws(c);
    if (c->p < c->end && *c->p == close) { c->p++; return 1; }
    for (;;) {
        if (b == '{') {
            if (c->p >= c->end || *c->p != '"' || !json_string(c, &s, &n, &flag)) return 0;
            json_ws(c);
            if (c->p >= c->end || *c->p != ':') return 0;
            c->p++;
            json_ws(c);
        }
        if (!json_skip(c, depth + 1)) return 0;
        json_ws(c);
        if (c->p >= c->end) return 0;
        if (*c->p == close) { c->p++; return 1; }
        if (*c->p != ',') return 0;
        c->p++;
        json_ws(c);
    }
}

typedef struct {
    const char *name;
    Py_ssize_t len;
} wanted_field;

/* The record of one JSON value with the wanted fields held: a new reference, Py_None when declined,
 * NULL with an exception on a real error. */
static PyObject *json_record(PyObject *raw, PyObject *layout, const wanted_field *want, Py_ssize_t nwant) {
    jcur c = {(const unsigned char *)PyBytes_AS_STRING(raw),
              (const unsigned char *)PyBytes_AS_STRING(raw) + PyBytes_GET_SIZE(raw)};
    RecordObject *r = record_new(layout, nwant, raw);
    if (r == NULL) return NULL;
    json_ws(&c);
    if (c.p >= c.end || *c.p != '{') goto decline;
    c.p++;
    json_ws(&c);
    if (c.p < c.end && *c.p == '}') goto decline;  /* {}: no wanted field */
    for (;;) {
        const unsigned char *k, *s;
        Py_ssize_t kn, n;
        int kesc, esc;
        if (c.p >= c.end || *c.p != '"' || !json_string(&c, &k, &kn, &kesc)) goto decline;
        json_ws(&c);
        if (c.p >= c.end || *c.p != ':') goto decline;
        c.p++;
        json_ws(&c);
        PyObject *kstr = NULL;
        if (kesc) {  /* a name spelled with escapes (json.dumps writes non-ASCII so) may be a wanted one */
            kstr = json_str(k, kn, 1);
            if (kstr == NULL) {
                if (PyErr_Occurred()) { Py_DECREF(r); return NULL; }
                kn = -1;  /* a lone surrogate (json_string refused it already): no wanted name */
            } else {
                k = (const unsigned char *)PyUnicode_AsUTF8AndSize(kstr, &kn);
                if (k == NULL) { Py_DECREF(kstr); Py_DECREF(r); return NULL; }
            }
        }
        Py_ssize_t w = 0;
        while (w < nwant && !(want[w].len == kn && memcmp(want[w].name, k, (size_t)kn) == 0)) w++;
        Py_XDECREF(kstr);
        if (w == nwant) {
            if (!json_skip(&c, 1)) goto decline;
        } else {  /* a wanted field: its value (a repeated name: the last one, as json.loads) */
            PyObject *v = NULL;
            const unsigned char *at = c.p;
            int is_int, is_null = 0;
            if (c.p >= c.end) goto decline;
            if (*c.p == '"') {
                if (!json_string(&c, &s, &n, &esc)) goto decline;
                v = json_str(s, n, esc);
            } else if (*c.p == '-' || (*c.p >= '0' && *c.p <= '9')) {
                if (!json_number(&c, &is_int)) goto decline;
                v = json_number_value(at, c.p - at, is_int);
            } else if (json_literal(&c, "true", 4)) {
                v = Py_NewRef(Py_True);
            } else if (json_literal(&c, "false", 5)) {
                v = Py_NewRef(Py_False);
            } else if (json_literal(&c, "null", 4)) {
                is_null = 1;
            } else {
                goto decline;  /* an object, an array, or not JSON */
            }
            if (is_null) {
                Py_CLEAR(r->items[w]);  /* null, unless a later one of the same name has a value */
            } else if (v != NULL) {
                Py_XSETREF(r->items[w], v);
            } else {  /* a lone surrogate, or a number Python will not read (its digit limit) */
                PyErr_Clear();
                goto decline;
            }
        }
        json_ws(&c);
        if (c.p >= c.end) goto decline;
        if (*c.p == '}') { c.p++; break; }
        if (*c.p != ',') goto decline;
        c.p++;
        json_ws(&c);
    }
    json_ws(&c);
    if (c.p != c.end) goto decline;
    for (Py_ssize_t w = 0; w < nwant; w++) {
        if (r->items[w] == NULL) goto decline;  /* absent, or null */
    }
    return (PyObject *)r;  /* every field atomic: untracked */
decline:
    Py_DECREF(r);
    Py_RETURN_NONE;
}

/* -- Avro: the flat-record program of decode_avro, each record one Record of all its fields ------------ */
static PyObject *avro_record(PyObject *raw, PyObject *layout, PyObject *program, const Py_ssize_t *required,
                             Py_ssize_t nrequired) {
    Py_ssize_t fields = PyTuple_GET_SIZE(program);
    cursor c = {(const unsigned char *)PyBytes_AS_STRING(raw),
                (const unsigned char *)PyBytes_AS_STRING(raw) + PyBytes_GET_SIZE(raw)};
    RecordObject *r = record_new(layout, fields, NULL);
    if (r == NULL) return NULL;
    for (Py_ssize_t i = 0; i < fields; i++) {
        PyObject *v = read_op(&c, PyTuple_GET_ITEM(program, i));
        if (v == NULL) {
            Py_DECREF(r);
            if (PyErr_Occurred()) return NULL;
            Py_RETURN_NONE;
        }
        r->items[i] = v;
    }
    int bad = c.p != c.end;
    for (Py_ssize_t i = 0; i < nrequired && !bad; i++) bad = r->items[required[i]] == Py_None;
    if (bad) {
        Py_DECREF(r);
        Py_RETURN_NONE;
    }
    record_finish(r);
    return (PyObject *)r;
}

/* topic_batch(msgs, accessors, cls, local_of, limits, nxt, decoder) -> (list, declined) or None
 *
 * The tuples `cls(j, offset, record, None, raw)` (cls: a tuple subclass of 5 fields, InputTuple) of a
 * batch of confluent-kafka messages, when the batch is plain: no error event, every partition one this
 * source reads (`local_of[partition]` its local index j, -1 if not read), every offset below its
 * partition's limit (`limits[j]`: an int, -1 once ended, or a float for none). Otherwise None, having
 * changed nothing. `accessors` are (Message.error, Message.partition, Message.offset, Message.value).
 * A record this decoder declines (a tombstone, malformed, a wanted field missing or null...) is None in
 * the list, for the caller to decode on its own; its position is consumed all the same. Returns
 * (list, number of None in it). On success, `nxt[j]` becomes the last offset read from j + 1.
 * `decoder`: ("json", layout) with layout's names the wanted fields, or ("avro", layout, program,
 * required positions) with layout's names all the schema's fields. */
static PyObject *py_topic_batch(PyObject *self, PyObject *args) {
    PyObject *msgs, *accessors, *clsobj, *local_of, *limits, *nxt, *decoder;
    if (!PyArg_ParseTuple(args, "O!O!OO!O!O!O!", &PyList_Type, &msgs, &PyTuple_Type, &accessors, &clsobj,
                          &PyList_Type, &local_of, &PyList_Type, &limits, &PyList_Type, &nxt, &PyTuple_Type,
                          &decoder))
        return NULL;
    if (!PyType_Check(clsobj) || !PyType_IsSubtype((PyTypeObject *)clsobj, &PyTuple_Type) ||
        ((PyTypeObject *)clsobj)->tp_basicsize != PyTuple_Type.tp_basicsize || PyTuple_GET_SIZE(accessors) != 4 ||
        PyTuple_GET_SIZE(decoder) < 2 || !PyUnicode_Check(PyTuple_GET_ITEM(decoder, 0)) ||
        !PyTuple_Check(PyTuple_GET_ITEM(decoder, 1)) || PyTuple_GET_SIZE(PyTuple_GET_ITEM(decoder, 1)) != 3 ||
        PyList_GET_SIZE(limits) != PyList_GET_SIZE(nxt)) {
        PyErr_SetString(PyExc_TypeError, "topic_batch: unexpected arguments");
        return NULL;
    }
    PyTypeObject *cls = (PyTypeObject *)clsobj;
    PyObject *layout = PyTuple_GET_ITEM(decoder, 1);
    PyObject *names = PyTuple_GET_ITEM(layout, 0);
    int is_json = PyUnicode_CompareWithASCIIString(PyTuple_GET_ITEM(decoder, 0), "json") == 0;
    PyObject *program = NULL;
    Py_ssize_t required[8], nrequired = 0;
    wanted_field want[8];
    Py_ssize_t nwant = 0;
    if (!PyTuple_Check(names)) goto bad_args;
    if (is_json) {
        nwant = PyTuple_GET_SIZE(names);
        if (nwant < 1 || nwant > 8) goto bad_args;
        for (Py_ssize_t w = 0; w < nwant; w++) {
            want[w].name = PyUnicode_AsUTF8AndSize(PyTuple_GET_ITEM(names, w), &want[w].len);
            if (want[w].name == NULL) return NULL;
        }
    } else {
        if (PyTuple_GET_SIZE(decoder) != 4) goto bad_args;
        program = PyTuple_GET_ITEM(decoder, 2);
        PyObject *req = PyTuple_GET_ITEM(decoder, 3);
        if (!PyTuple_Check(program) || PyTuple_GET_SIZE(program) != PyTuple_GET_SIZE(names) || !PyTuple_Check(req) ||
            PyTuple_GET_SIZE(req) > 8)
            goto bad_args;
        nrequired = PyTuple_GET_SIZE(req);
        for (Py_ssize_t i = 0; i < nrequired; i++) {
            required[i] = PyLong_AsSsize_t(PyTuple_GET_ITEM(req, i));
            if (required[i] < 0 || required[i] >= PyTuple_GET_SIZE(program)) {
                if (!PyErr_Occurred()) goto bad_args;
                return NULL;
            }
        }
    }
    PyObject *f_error = PyTuple_GET_ITEM(accessors, 0), *f_partition = PyTuple_GET_ITEM(accessors, 1);
    PyObject *f_offset = PyTuple_GET_ITEM(accessors, 2), *f_value = PyTuple_GET_ITEM(accessors, 3);
    Py_ssize_t count = PyList_GET_SIZE(msgs), parts = PyList_GET_SIZE(limits), nlocal = PyList_GET_SIZE(local_of);
    /* Pass 1: is the batch plain? Nothing is built or changed until it is known. */
    long long *limit = PyMem_Malloc(sizeof(long long) * (size_t)(parts + 1));
    long long *last = PyMem_Malloc(sizeof(long long) * (size_t)(parts + 1));
    Py_ssize_t *js = PyMem_Malloc(sizeof(Py_ssize_t) * (size_t)(count + 1));
    PyObject **offsets = PyMem_Calloc((size_t)(count + 1), sizeof(PyObject *));
    PyObject *out = NULL;
    Py_ssize_t declined = 0;
    int plain = 1;
    if (limit == NULL || last == NULL || js == NULL || offsets == NULL) { PyErr_NoMemory(); goto done; }
    for (Py_ssize_t j = 0; j < parts; j++) {
        PyObject *l = PyList_GET_ITEM(limits, j);
        limit[j] = PyLong_Check(l) ? PyLong_AsLongLong(l) : LLONG_MAX;
        if (limit[j] == -1 && PyErr_Occurred()) goto done;
        last[j] = -1;
    }
    for (Py_ssize_t i = 0; i < count && plain; i++) {
        PyObject *msg = PyList_GET_ITEM(msgs, i);
        PyObject *err = PyObject_Vectorcall(f_error, &msg, 1, NULL);
        if (err == NULL) goto done;
        /* Identity, not comparison: KafkaError's comparison with None raises (confluent-kafka). */
        plain = err == Py_None;
        Py_DECREF(err);
        if (!plain) break;
        PyObject *p = PyObject_Vectorcall(f_partition, &msg, 1, NULL);
        if (p == NULL) goto done;
        long g = PyLong_Check(p) ? PyLong_AsLong(p) : -1;
        Py_DECREF(p);
        if (g == -1 && PyErr_Occurred()) goto done;
        PyObject *jobj = g >= 0 && g < nlocal ? PyList_GET_ITEM(local_of, g) : NULL;
        Py_ssize_t j = jobj != NULL && PyLong_Check(jobj) ? PyLong_AsSsize_t(jobj) : -1;
        if (j < 0 || j >= parts) { PyErr_Clear(); plain = 0; break; }
        PyObject *o = PyObject_Vectorcall(f_offset, &msg, 1, NULL);
        if (o == NULL) goto done;
        offsets[i] = o;
        long long off = PyLong_Check(o) ? PyLong_AsLongLong(o) : -1;
        if (off == -1 && PyErr_Occurred()) goto done;
        if (off < 0 || off >= limit[j] || off <= last[j]) { plain = 0; break; }
        js[i] = j;
        last[j] = off;
    }
    if (!plain) { out = Py_NewRef(Py_None); goto done; }
    /* Pass 2: the tuples. */
    out = PyList_New(count);
    if (out == NULL) goto done;
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *msg = PyList_GET_ITEM(msgs, i);
        PyObject *raw = PyObject_Vectorcall(f_value, &msg, 1, NULL);
        if (raw == NULL) { Py_CLEAR(out); goto done; }
        PyObject *rec = !PyBytes_CheckExact(raw) ? Py_NewRef(Py_None)
                        : is_json ? json_record(raw, layout, want, nwant)
                                  : avro_record(raw, layout, program, required, nrequired);
        if (rec == NULL) { Py_DECREF(raw); Py_CLEAR(out); goto done; }
        if (rec == Py_None) {
            declined++;
            Py_DECREF(rec);
            Py_DECREF(raw);
            PyList_SET_ITEM(out, i, Py_NewRef(Py_None));
            continue;
        }
        PyObject *t = cls->tp_alloc(cls, 5);
        PyObject *jobj = PyLong_FromSsize_t(js[i]);
        if (t == NULL || jobj == NULL) { Py_XDECREF(t); Py_XDECREF(jobj); Py_DECREF(rec); Py_DECREF(raw); Py_CLEAR(out); goto done; }
        int track = PyObject_GC_IsTracked(rec);
        PyTuple_SET_ITEM(t, 0, jobj);
        PyTuple_SET_ITEM(t, 1, offsets[i]);
        offsets[i] = NULL;
        PyTuple_SET_ITEM(t, 2, rec);
        PyTuple_SET_ITEM(t, 3, Py_NewRef(Py_None));
        PyTuple_SET_ITEM(t, 4, raw);
        if (!track) PyObject_GC_UnTrack(t);  /* holds nothing that can be part of a cycle */
        PyList_SET_ITEM(out, i, t);
    }
    for (Py_ssize_t j = 0; j < parts; j++) {
        if (last[j] < 0) continue;
        PyObject *n = PyLong_FromLongLong(last[j] + 1);
        if (n == NULL || PyList_SetItem(nxt, j, n) < 0) { Py_CLEAR(out); goto done; }
    }
    Py_SETREF(out, Py_BuildValue("(On)", out, declined));
done:
    if (offsets != NULL) {
        for (Py_ssize_t i = 0; i < count; i++) Py_XDECREF(offsets[i]);
    }
    PyMem_Free(limit);
    PyMem_Free(last);
    PyMem_Free(js);
    PyMem_Free(offsets);
    return out;
bad_args:
    PyErr_SetString(PyExc_TypeError, "topic_batch: unexpected decoder");
    return NULL;
}

/* ---- the operator's write path: records encoded in one call ------------------------------------------ */
/* Appends the zigzag varint of v to a growing buffer (cap checked by the caller's sizing). */
static Py_ssize_t enc_long(unsigned char *out, Py_ssize_t at, long long v) { return at + put_zigzag(out + at, v); }

/* Sums the bytes a sequence of longs takes (10 each at most); -1 when an item is not a 64-bit int. */
static int longs_of(PyObject *seq, PyObject ***items, Py_ssize_t *n) {
    if (PyTuple_CheckExact(seq)) { *items = &PyTuple_GET_ITEM(seq, 0); *n = PyTuple_GET_SIZE(seq); return 1; }
    if (PyList_CheckExact(seq)) { *items = ((PyListObject *)seq)->ob_item; *n = PyList_GET_SIZE(seq); return 1; }
    return 0;
}

/* encode_compact(version, kind, time, key, seq, pos, n, state, payload, marks): the whole version-4 record
 * (MAGIC | version | CRC32C(meta + body) | body) exactly as `cec.records.RecordCodec.encode` writes it;
 * None for anything unusual (a key that is not UTF-8 text, an int beyond 64 bits, pos[0] - time beyond
 * them...), which the caller then encodes in Python (and which raises there). */
static PyObject *py_encode_compact(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 10) { PyErr_SetString(PyExc_TypeError, "encode_compact takes 10 arguments"); return NULL; }
    long long version, time, seq, n;
    if (!as_long_long(args[0], &version) || version < 0 || version > 255) Py_RETURN_NONE;
    if (!PyUnicode_Check(args[1])) Py_RETURN_NONE;
    Py_ssize_t kind_len;
    const char *kind = PyUnicode_AsUTF8AndSize(args[1], &kind_len);
    if (kind == NULL) { PyErr_Clear(); Py_RETURN_NONE; }
    if (!as_long_long(args[2], &time) || !as_long_long(args[4], &seq) || !as_long_long(args[6], &n)) Py_RETURN_NONE;
    const char *key = NULL;
    Py_ssize_t key_len = 0;
    if (args[3] != Py_None) {
        if (!PyUnicode_Check(args[3])) Py_RETURN_NONE;
        key = PyUnicode_AsUTF8AndSize(args[3], &key_len);
        if (key == NULL) { PyErr_Clear(); Py_RETURN_NONE; }
    }
    PyObject **pos, **marks;
    Py_ssize_t npos, nmarks;
    if (!longs_of(args[5], &pos, &npos) || !longs_of(args[9], &marks, &nmarks)) Py_RETURN_NONE;
    PyObject *state = args[7], *payload = args[8];
    if ((state != Py_None && !PyBytes_CheckExact(state)) || (payload != Py_None && !PyBytes_CheckExact(payload)))
        Py_RETURN_NONE;
    Py_ssize_t state_len = state == Py_None ? 0 : PyBytes_GET_SIZE(state);
    Py_ssize_t payload_len = payload == Py_None ? 0 : PyBytes_GET_SIZE(payload);
    /* header 6, flags 1, counts and longs 10 each, lengths 10 each */
    Py_ssize_t cap = 6 + 1 + 10 * (npos + nmarks + 5) + state_len + payload_len;
    unsigned char small[512];
    unsigned char *out = cap <= (Py_ssize_t)sizeof small ? small : PyMem_Malloc((size_t)cap);
    if (out == NULL) return PyErr_NoMemory();
    PyObject *result = NULL;
    int flags = 0;
    Py_ssize_t at = 7;
    at = enc_long(out, at, (long long)npos);
    for (Py_ssize_t i = 0; i < npos; i++) {
        long long v;
        if (!as_long_long(pos[i], &v)) goto decline;
        if (i == 0) {
            /* pos[0] - time when that is shorter (|rel| < |v|), computed without overflow */
            if (!((time > 0 && v < LLONG_MIN + time) || (time < 0 && v > LLONG_MAX + time))) {
                long long rel = v - time;
                unsigned long long arel = rel < 0 ? 0ull - (unsigned long long)rel : (unsigned long long)rel;
                unsigned long long av = v < 0 ? 0ull - (unsigned long long)v : (unsigned long long)v;
                if (arel < av) { flags |= F_POS_FROM_TIME; v = rel; }
            }
        }
        at = enc_long(out, at, v);
    }
    at = enc_long(out, at, n);
    if (state != Py_None) {
        flags |= F_STATE;
        at = enc_long(out, at, (long long)state_len);
        memcpy(out + at, PyBytes_AS_STRING(state), (size_t)state_len);
        at += state_len;
    }
    if (payload != Py_None) {
        flags |= F_PAYLOAD;
        const char *p = PyBytes_AS_STRING(payload);
        Py_ssize_t plen = payload_len;
        if (key != NULL) {
            unsigned char prefix[32];
            int pl = put_zigzag(prefix, (long long)key_len);
            if (plen >= pl + key_len && memcmp(p, prefix, (size_t)pl) == 0 && memcmp(p + pl, key, (size_t)key_len) == 0) {
                int sl = put_zigzag(prefix, seq);
                if (plen >= pl + key_len + sl && memcmp(p + pl + key_len, prefix, (size_t)sl) == 0) {
                    flags |= F_PAYLOAD_KEYED;
                    p += pl + key_len + sl;
                    plen -= pl + key_len + sl;
                }
            }
        }
        at = enc_long(out, at, (long long)plen);
        memcpy(out + at, p, (size_t)plen);
        at += plen;
    }
    if (nmarks > 0) {
        flags |= F_MARKS;
        at = enc_long(out, at, (long long)nmarks);
        for (Py_ssize_t i = 0; i < nmarks; i++) {
            long long v;
            if (!as_long_long(marks[i], &v)) goto decline;
            at = enc_long(out, at, v);
        }
    }
    out[6] = (unsigned char)flags;
    {
        /* the checksum's metadata: "{version}\x1f{kind}\x1f{time}\x1f{'' | 'k' + key}\x1f{seq}\x1e" */
        char small_meta[256];
        Py_ssize_t mcap = 4 + 3 + kind_len + 20 + 2 + key_len + 20 + 2;
        char *meta = mcap <= (Py_ssize_t)sizeof small_meta ? small_meta : PyMem_Malloc((size_t)mcap);
        if (meta == NULL) { PyErr_NoMemory(); goto done; }
        Py_ssize_t m = put_int(meta, 0, mcap, version);
        meta[m++] = '\x1f';
        m = put_bytes(meta, m, mcap, kind, kind_len);
        meta[m++] = '\x1f';
        m = put_int(meta, m, mcap, time);
        meta[m++] = '\x1f';
        if (key != NULL) { meta[m++] = 'k'; m = put_bytes(meta, m, mcap, key, key_len); }
        meta[m++] = '\x1f';
        m = put_int(meta, m, mcap, seq);
        meta[m++] = '\x1e';
        uint32_t crc = crc_extend(crc_extend(0, (const unsigned char *)meta, m), out + 6, at - 6);
        if (meta != small_meta) PyMem_Free(meta);
        out[0] = 0xCE;
        out[1] = (unsigned char)version;
        out[2] = (unsigned char)(crc >> 24); out[3] = (unsigned char)(crc >> 16);
        out[4] = (unsigned char)(crc >> 8); out[5] = (unsigned char)crc;
    }
    result = PyBytes_FromStringAndSize((const char *)out, at);
    goto done;
decline:
    result = Py_NewRef(Py_None);
done:
    if (out != small) PyMem_Free(out);
    return result;
}

/* kafka_frame(head, time, seq, value): head + zigzag(time) + zigzag(seq) + value in one allocation (the
 * value frame of `queuestore.kafka.encode_message`); None when time or seq is not a 64-bit int. */
static PyObject *py_kafka_frame(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4 || !PyBytes_CheckExact(args[0]) || !PyBytes_CheckExact(args[3])) {
        PyErr_SetString(PyExc_TypeError, "kafka_frame(head: bytes, time: int, seq: int, value: bytes)");
        return NULL;
    }
    long long time, seq;
    if (!as_long_long(args[1], &time) || !as_long_long(args[2], &seq)) Py_RETURN_NONE;
    Py_ssize_t hl = PyBytes_GET_SIZE(args[0]), vl = PyBytes_GET_SIZE(args[3]);
    PyObject *out = PyBytes_FromStringAndSize(NULL, hl + 20 + vl);
    if (out == NULL) return NULL;
    unsigned char *p = (unsigned char *)PyBytes_AS_STRING(out);
    memcpy(p, PyBytes_AS_STRING(args[0]), (size_t)hl);
    Py_ssize_t at = hl;
    at = enc_long(p, at, time);
    at = enc_long(p, at, seq);
    memcpy(p + at, PyBytes_AS_STRING(args[3]), (size_t)vl);
    at += vl;
    if (_PyBytes_Resize(&out, at) < 0) return NULL;
    return out;
}

/* One value of a plain Avro type `code` (null, boolean, long, double, bytes, string) at out[at...]; the new
 * end, or -1 when the value is not exactly of that type (the caller then declines). */
static Py_ssize_t enc_avro_value(unsigned char *out, Py_ssize_t at, Py_ssize_t cap, long code, PyObject *v) {
    switch (code) {
    case 0: /* null */
        return v == Py_None ? at : -1;
    case 1: /* boolean */
        if (!PyBool_Check(v)) return -1;
        out[at++] = v == Py_True ? 1 : 0;
        return at;
    case 2: { /* int, long */
        long long x;
        if (PyBool_Check(v) || !as_long_long(v, &x)) return -1;
        return enc_long(out, at, x);
    }
    case 4: { /* double, little-endian IEEE 754 */
        if (!PyFloat_CheckExact(v)) return -1;
        double d = PyFloat_AS_DOUBLE(v);
        if (PyFloat_Pack8(d, (char *)out + at, 1) < 0) { PyErr_Clear(); return -1; }
        return at + 8;
    }
    case 5: { /* bytes */
        if (!PyBytes_CheckExact(v)) return -1;
        Py_ssize_t len = PyBytes_GET_SIZE(v);
        at = enc_long(out, at, (long long)len);
        memcpy(out + at, PyBytes_AS_STRING(v), (size_t)len);
        return at + len;
    }
    case 6: { /* string */
        if (!PyUnicode_CheckExact(v)) return -1;
        Py_ssize_t len;
        const char *u = PyUnicode_AsUTF8AndSize(v, &len);
        if (u == NULL) { PyErr_Clear(); return -1; }
        if (at + 10 + len > cap) return -1; /* not expected: 4 bytes per code point at most */
        at = enc_long(out, at, (long long)len);
        memcpy(out + at, u, (size_t)len);
        return at + len;
    }
    default:
        return -1;
    }
}

/* The branch of a two-branch union of null and one plain type (["null", "double"], ["string", "null"]:
 * an optional field, as the several-aggregate results' nullable columns) that `v` takes, or -1. Only these
 * unions: the value None fits the null branch alone and a value exactly of the other type fits that one
 * alone, so the branch is the one fastavro picks (the first branch its looser checks accept: an int in
 * ["null", "double"] would be a double there, and is declined here since it is not exactly a float). */
static int avro_union_branch(PyObject *branches, PyObject *v, long *code) {
    if (!PyTuple_Check(branches) || PyTuple_GET_SIZE(branches) != 2) return -1;
    long codes[2];
    for (int i = 0; i < 2; i++) {
        PyObject *b = PyTuple_GET_ITEM(branches, i);
        if (!PyTuple_Check(b) || PyTuple_GET_SIZE(b) < 1) return -1;
        codes[i] = PyLong_AsLong(PyTuple_GET_ITEM(b, 0));
        if (codes[i] == -1 && PyErr_Occurred()) { PyErr_Clear(); return -1; }
    }
    int null_at = codes[0] == 0 ? 0 : codes[1] == 0 ? 1 : -1;
    if (null_at < 0) return -1;
    long other = codes[1 - null_at];
    if (other != 1 && other != 2 && other != 4 && other != 5 && other != 6) return -1;
    *code = v == Py_None ? 0 : other;
    return v == Py_None ? null_at : 1 - null_at;
}

/* encode_avro(program, values): the schemaless Avro encoding of a flat record whose field values are
 * `values` (a list or tuple, in the program's field order; a `compile_avro` program); None when a field's
 * type is not a plain null, boolean, long, double, string or bytes, or a union of null and one of them, or
 * a value is not exactly of that type (an int for a double, a long beyond 64 bits...): the caller then
 * encodes with fastavro, which converts or raises as it always did. */
static PyObject *py_encode_avro(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2 || !PyTuple_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "encode_avro(program: tuple, values: list | tuple)");
        return NULL;
    }
    PyObject *program = args[0];
    PyObject **values;
    Py_ssize_t n;
    if (!longs_of(args[1], &values, &n) || n != PyTuple_GET_SIZE(program)) Py_RETURN_NONE;
    Py_ssize_t cap = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *v = values[i];
        cap += 20; /* a union's branch index, then the value */
        if (PyBytes_CheckExact(v)) cap += PyBytes_GET_SIZE(v);
        else if (PyUnicode_Check(v)) cap += 4 * PyUnicode_GET_LENGTH(v);
    }
    unsigned char small[512];
    unsigned char *out = cap <= (Py_ssize_t)sizeof small ? small : PyMem_Malloc((size_t)cap);
    if (out == NULL) return PyErr_NoMemory();
    PyObject *result = NULL;
    Py_ssize_t at = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *op = PyTuple_GET_ITEM(program, i), *v = values[i];
        if (!PyTuple_Check(op) || PyTuple_GET_SIZE(op) < 1) goto decline;
        long code = PyLong_AsLong(PyTuple_GET_ITEM(op, 0));
        if (code == -1 && PyErr_Occurred()) { PyErr_Clear(); goto decline; }
        if (code == 8) { /* a union: its branch's index, then the value as that branch */
            if (PyTuple_GET_SIZE(op) < 2) goto decline;
            int branch = avro_union_branch(PyTuple_GET_ITEM(op, 1), v, &code);
            if (branch < 0) goto decline;
            at = enc_long(out, at, (long long)branch);
        }
        at = enc_avro_value(out, at, cap, code, v);
        if (at < 0) goto decline;
    }
    result = PyBytes_FromStringAndSize((const char *)out, at);
    goto done;
decline:
    result = Py_NewRef(Py_None);
done:
    if (out != small) PyMem_Free(out);
    return result;
}

/* ==== G-check batch (gchecktput) ==== */
/* encode_gchecks(version, kind, time, pos, n, marks, keys, seqs, states): the records of a run of G-checks
 * taken at one moment (same time, pos, N and marks; no payload), one list item per window, each exactly
 * what encode_compact(version, kind, time, keys[i], seqs[i], pos, n, states[i], None, marks) returns;
 * None when any of them would be None (the caller then encodes them one by one, in Python if need be). */
static PyObject *py_encode_gchecks(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 9 || !PyList_CheckExact(args[6]) || !PyList_CheckExact(args[7]) || !PyList_CheckExact(args[8])) {
        PyErr_SetString(PyExc_TypeError,
                        "encode_gchecks(version, kind, time, pos, n, marks, keys: list, seqs: list, states: list)");
        return NULL;
    }
    PyObject *keys = args[6], *seqs = args[7], *states = args[8];
    Py_ssize_t count = PyList_GET_SIZE(keys);
    if (PyList_GET_SIZE(seqs) != count || PyList_GET_SIZE(states) != count) {
        PyErr_SetString(PyExc_ValueError, "encode_gchecks: keys, seqs and states differ in length");
        return NULL;
    }
    PyObject *out = PyList_New(count);
    if (out == NULL) return NULL;
    PyObject *one[10] = {args[0], args[1], args[2], NULL, NULL, args[3], args[4], NULL, Py_None, args[5]};
    for (Py_ssize_t i = 0; i < count; i++) {
        one[3] = PyList_GET_ITEM(keys, i);
        one[4] = PyList_GET_ITEM(seqs, i);
        one[7] = PyList_GET_ITEM(states, i);
        PyObject *value = py_encode_compact(NULL, one, 10);
        if (value == NULL) { Py_DECREF(out); return NULL; }
        if (value == Py_None) { Py_DECREF(value); Py_DECREF(out); Py_RETURN_NONE; }
        PyList_SET_ITEM(out, i, value);
    }
    return out;
}

/* encode_avro_each(program, rows): [encode_avro(program, row) for row in rows] in one call (a run of window
 * states); None when any of them would be None (the caller then encodes them one by one). */
static PyObject *py_encode_avro_each(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2 || !PyTuple_Check(args[0]) || !PyList_CheckExact(args[1])) {
        PyErr_SetString(PyExc_TypeError, "encode_avro_each(program: tuple, rows: list)");
        return NULL;
    }
    Py_ssize_t count = PyList_GET_SIZE(args[1]);
    PyObject *out = PyList_New(count);
    if (out == NULL) return NULL;
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *one[2] = {args[0], PyList_GET_ITEM(args[1], i)};
        PyObject *value = py_encode_avro(NULL, one, 2);
        if (value == NULL) { Py_DECREF(out); return NULL; }
        if (value == Py_None) { Py_DECREF(value); Py_DECREF(out); Py_RETURN_NONE; }
        PyList_SET_ITEM(out, i, value);
    }
    return out;
}

static PyMethodDef methods[] = {
    {"crc32c", py_crc32c, METH_VARARGS, "crc32c(data, crc=0): CRC32C of data, extending crc."},
    {"verify_rows", py_verify_rows, METH_VARARGS, "Indices of the rows that fail the plain checksum check."},
    {"message_rows", py_message_rows, METH_VARARGS, "Rows of Kafka messages written by the cec store."},
    {"make", py_make, METH_VARARGS, "A new instance of a slots class with its slots set, no __init__."},
    {"ec_scan", py_ec_scan, METH_VARARGS, "The EC scan's classification loop over a chunk of rows."},
    {"decode_avro_many", py_decode_avro_many, METH_VARARGS, "decode_avro of every bytes in a list."},
    {"decode_avro", py_decode_avro, METH_VARARGS, "Decode a flat Avro record with a compiled program."},
    {"decode_avro_rows", py_decode_avro_rows, METH_VARARGS, "Decode rows' values with their metadata first."},
    {"decode_compact", py_decode_compact, METH_VARARGS, "Decode a compact (version-4) record body."},
    {"decode_compact_rows", py_decode_compact_rows, METH_VARARGS, "decode_compact of rows with their metadata."},
    {"topic_batch", py_topic_batch, METH_VARARGS, "The input tuples of a plain batch of Kafka topic messages."},
    {"encode_compact", (PyCFunction)(void (*)(void))py_encode_compact, METH_FASTCALL,
     "A whole version-4 record from its fields, or None (encode it in Python)."},
    {"kafka_frame", (PyCFunction)(void (*)(void))py_kafka_frame, METH_FASTCALL,
     "The framed Kafka value: head + zigzag(time) + zigzag(seq) + value."},
    {"encode_avro", (PyCFunction)(void (*)(void))py_encode_avro, METH_FASTCALL,
     "Schemaless Avro of a flat record's field values, or None (encode it with fastavro)."},
    {"encode_gchecks", (PyCFunction)(void (*)(void))py_encode_gchecks, METH_FASTCALL,
     "The records of a run of G-checks taken at one moment, or None (encode them one by one)."},
    {"encode_avro_each", (PyCFunction)(void (*)(void))py_encode_avro_each, METH_FASTCALL,
     "encode_avro of every row in a list, or None (encode them one by one)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "cec._native", NULL, -1, methods};

PyMODINIT_FUNC PyInit__native(void) {
    crc_init();
    s_error = PyUnicode_InternFromString("error");
    s_offset = PyUnicode_InternFromString("offset");
    s_key = PyUnicode_InternFromString("key");
    s_value = PyUnicode_InternFromString("value");
    empty_bytes = PyBytes_FromStringAndSize("", 0);
    s_part = PyUnicode_InternFromString("PART");
    s_r = PyUnicode_InternFromString("R");
    if (!s_part || !s_r || !s_error || !s_offset || !s_key || !s_value || !empty_bytes) return NULL;
    if (PyType_Ready(&Record_Type) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m != NULL && PyModule_AddObjectRef(m, "Record", (PyObject *)&Record_Type) < 0) { Py_DECREF(m); return NULL; }
    /* cec.native loads this module only when its ABI is the one the Python code calls (a stale build
     * left by an older checkout would be called with other arguments). */
    if (m != NULL && PyModule_AddIntConstant(m, "ABI", 5) < 0) { Py_DECREF(m); return NULL; }
    return m;
}
