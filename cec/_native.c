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
        PyObject *row = PyList_GET_ITEM(rows, i), *r = NULL;
        if (PyTuple_Check(row) && PyTuple_GET_SIZE(row) == 6) {
            PyObject *v = PyTuple_GET_ITEM(row, 5);
            PyObject *kind = PyDict_GetItemWithError(kinds, PyTuple_GET_ITEM(row, 1));
            if (kind == NULL && PyErr_Occurred()) { Py_DECREF(out); return NULL; }
            if (kind != NULL && PyBytes_CheckExact(v) && PyBytes_GET_SIZE(v) > start && start >= 2 &&
                (unsigned char)PyBytes_AS_STRING(v)[1] == version) {
                PyObject *head[4] = {kind, PyTuple_GET_ITEM(row, 2), PyTuple_GET_ITEM(row, 3), PyTuple_GET_ITEM(row, 4)};
                r = decode_one(program, (const unsigned char *)PyBytes_AS_STRING(v), PyBytes_GET_SIZE(v), start, cls,
                               descrs, head, 4);
                if (r == NULL) { Py_DECREF(out); return NULL; }
            }
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
        PyObject *row = PyList_GET_ITEM(rows, i), *r = NULL;
        if (PyTuple_Check(row) && PyTuple_GET_SIZE(row) == 6) {
            PyObject *v = PyTuple_GET_ITEM(row, 5);
            PyObject *kind = PyDict_GetItemWithError(kinds, PyTuple_GET_ITEM(row, 1));
            if (kind == NULL && PyErr_Occurred()) { Py_DECREF(out); return NULL; }
            if (kind != NULL && PyBytes_CheckExact(v) && PyBytes_GET_SIZE(v) > start && start >= 2 &&
                (unsigned char)PyBytes_AS_STRING(v)[1] == version) {
                PyObject *head[4] = {kind, PyTuple_GET_ITEM(row, 2), PyTuple_GET_ITEM(row, 3), PyTuple_GET_ITEM(row, 4)};
                r = compact_one((const unsigned char *)PyBytes_AS_STRING(v), PyBytes_GET_SIZE(v), start, head, cls, descrs);
                if (r == NULL) { Py_DECREF(out); return NULL; }
                if (r == Py_None) { Py_DECREF(r); r = NULL; }
            }
        }
        PyList_SET_ITEM(out, i, r == NULL ? Py_NewRef(Py_None) : r);
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
    PyObject *m = PyModule_Create(&module);
    /* cec.native loads this module only when its ABI is the one the Python code calls (a stale build
     * left by an older checkout would be called with other arguments). */
    if (m != NULL && PyModule_AddIntConstant(m, "ABI", 3) < 0) { Py_DECREF(m); return NULL; }
    return m;
}
