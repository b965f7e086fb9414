/*
 * The worker's Python: its environment and rehearsal while idle, then
 * running the request's code as __main__ and ending the way python3 would.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "figures.h"
#include "pyrun.h"
#include "profile.h"
#include "sysutil.h"
#include "util.h"
#include "wire.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAIN_FILENAME "<main>"
/* The name of the code's file in tracebacks (and linecache): the
 * request's, else MAIN_FILENAME. */
static const char *code_name = MAIN_FILENAME;
/* Programs up to this size have their lines in linecache from the start. */
#define LINECACHE_EAGER_MAX (1u << 20)

int pyrun_error_text(const char *what, char *err, size_t errlen)
{
    PyObject *type = NULL, *value = NULL, *tb = NULL;
    PyObject *text = NULL;
    const char *s = NULL;

    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    if (value)
        text = PyObject_Str(value);
    if (text)
        s = PyUnicode_AsUTF8(text);
    fmt(err, errlen, "%s: %s: %s", what, type ? ((PyTypeObject *)type)->tp_name : "error",
        s ? s : "?");
    Py_XDECREF(text);
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(tb);
    PyErr_Clear();
    return -EIO;
}

/* linecache has no file to read the code from; give it the source so that
 * tracebacks and inspect show the lines. Best effort. */
static void seed_linecache(const char *code, size_t len)
{
    PyObject *lc = PyImport_ImportModule("linecache");
    PyObject *cache = lc ? PyObject_GetAttrString(lc, "cache") : NULL;
    PyObject *text = PyUnicode_DecodeUTF8(code, (Py_ssize_t)len, "replace");
    PyObject *lines = text ? PyUnicode_Splitlines(text, 1) : NULL;
    PyObject *entry =
        lines ? Py_BuildValue("(nOOs)", (Py_ssize_t)len, Py_None, lines, code_name) : NULL;

    if (!cache || !entry || !PyDict_Check(cache) ||
        PyDict_SetItemString(cache, code_name, entry) < 0)
        PyErr_Clear();
    Py_XDECREF(entry);
    Py_XDECREF(lines);
    Py_XDECREF(text);
    Py_XDECREF(cache);
    Py_XDECREF(lc);
}

/* compile() on bytes, as for a file: PEP 263 decoding, and a clear error
 * for NUL bytes or invalid UTF-8 instead of a silently cut C string. The
 * bytes are a view of |code|, not a copy: the program is held once, not once
 * more for each step. NULL with the exception set when it does not compile. */
static PyObject *compile_bytes(const char *code, size_t len, const char *mode)
{
    PyObject *builtins = PyEval_GetBuiltins(); /* borrowed */
    PyObject *compile = builtins ? PyDict_GetItemString(builtins, "compile") : NULL;
    PyObject *src = PyMemoryView_FromMemory((char *)code, (Py_ssize_t)len, PyBUF_READ);
    PyObject *co = NULL;

    if (compile && src)
        co = PyObject_CallFunction(compile, "Ossii", src, code_name, mode, 0, 1);
    Py_XDECREF(src);
    return co;
}

/* How many more brackets |line| closes than it opens (strings not
 * considered: this only proposes where to try; compiling decides). */
static int closes(const char *line, size_t len)
{
    int n = 0;

    for (size_t i = 0; i < len; i++)
        n += (strchr(")]}", line[i]) != NULL) - (strchr("([{", line[i]) != NULL);
    return n;
}

/* Where the program's last statement would start if it were an expression
 * of its own: its last line (not a comment), or, when that line closes
 * brackets, the line that opens them (up to LAST_EXPR_LINES_MAX lines up).
 * It must not be indented. Returns the offset, or -1; *tail_len is the
 * length from there. */
#define LAST_EXPR_LINES_MAX 64
static ssize_t last_statement(const char *code, size_t len, size_t *tail_len)
{
    size_t end = len;

    while (end > 0) {
        while (end > 0 && strchr(" \t\r\n\f", code[end - 1]))
            end--;
        size_t start = end;
        while (start > 0 && code[start - 1] != '\n')
            start--;
        if (code[start + strspn(code + start, " \t\f")] == '#') {
            end = start; /* a comment: the line before it */
            continue;
        }
        int open = closes(code + start, end - start);
        for (int up = 0; open > 0 && start > 0 && up < LAST_EXPR_LINES_MAX; up++) {
            size_t prev = start - 1;
            while (prev > 0 && code[prev - 1] != '\n')
                prev--;
            open += closes(code + prev, start - prev);
            start = prev;
        }
        *tail_len = end - start;
        return end > start && !strchr(" \t\f", code[start]) ? (ssize_t)start : -1;
    }
    return -1;
}

/* As a notebook cell: when the program's last statement is an expression,
 * it is compiled apart (*last, for eval) from the lines before it
 * (returned, for exec), so that its value can be had. The split stands only when both
 * parts compile; the lines before then hold no open bracket, string or
 * block, so the expression is a statement of its own (a line-based check,
 * without building the syntax tree: it costs two compilations of the usual
 * kind). Otherwise *last is NULL and the program compiles as a whole. The
 * expression is compiled after as many newlines as lines precede it, so its
 * line numbers stay the program's. */
static PyObject *compile_parts(const char *code, size_t len, PyObject **last)
{
    size_t tail_len = 0, lines = 0;
    ssize_t start = last_statement(code, len, &tail_len);
    PyObject *head = NULL;
    char *tail = NULL;

    *last = NULL;
    for (ssize_t i = 0; i < start; i++)
        lines += code[i] == '\n';
    if (start >= 0 && (tail = malloc(lines + tail_len + 1))) {
        memset(tail, '\n', lines);
        memcpy(tail + lines, code + start, tail_len);
        tail[lines + tail_len] = '\0';
        *last = compile_bytes(tail, lines + tail_len, "eval");
        free(tail);
        head = *last ? compile_bytes(code, (size_t)start, "exec") : NULL;
        if (head)
            return head;
        Py_CLEAR(*last);
        PyErr_Clear();
    }
    return compile_bytes(code, len, "exec");
}

/* WIRE_VALUE_FILE and WIRE_ERROR_FILE in the workspace, by absolute path:
 * the code may have changed directory. */
static char value_path[PATH_MAX];
static char error_path[PATH_MAX];

/* |path| created afresh (what the code left there goes first), with
 * |n| parts of bytes each. A file that cannot be written is lost. */
static void write_report(const char *path, PyObject *const *parts, int n)
{
    unlink(path);
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0)
        return;
    for (int i = 0; i < n; i++)
        if (write_full(fd, PyBytes_AS_STRING(parts[i]), (size_t)PyBytes_GET_SIZE(parts[i])) < 0)
            break;
    close(fd);
}

/* The value's repr() for the supervisor (WIRE_VALUE_FILE); None, as in a
 * notebook, shows nothing. What the code left under that name goes first,
 * so only our own write is taken. Returns -1 with a Python exception when
 * repr() raised; a value that cannot be written is lost, not an error. */
static int send_value(PyObject *v)
{
    PyObject *r, *b;

    if (v == Py_None)
        return 0;
    r = PyObject_Repr(v);
    b = r ? PyUnicode_AsEncodedString(r, "utf-8", "replace") : NULL;
    Py_XDECREF(r);
    if (!b)
        return -1;
    write_report(value_path, &b, 1);
    Py_DECREF(b);
    return 0;
}

/* |module| from sys.modules, without importing it (new reference), or NULL. */
static PyObject *loaded_module(const char *module)
{
    PyObject *name = PyUnicode_FromString(module);
    PyObject *m = name ? PyImport_GetModule(name) : NULL;

    Py_XDECREF(name);
    if (!m)
        PyErr_Clear();
    return m;
}

static bool module_loaded(const char *module)
{
    PyObject *m = loaded_module(module);

    Py_XDECREF(m);
    return m != NULL;
}

/* HOME and TMPDIR at the workspace, LANG, USER and LOGNAME (USER for
 * getpass.getuser(), the name of the worker's uid); nothing else. The template's environment is
 * empty (it was started by exec with none). Python's view and the C environment must agree:
 * os.environ when os is loaded (warm), else the C environment and posix.environ, from which os
 * builds os.environ when the code imports it (importing os here would cost a single run more than
 * its code). */
static int set_environment(const char *workspace, const char *user)
{
    const char *const vars[][2] = {{"HOME", workspace},
                                   {"TMPDIR", workspace},
                                   {"LANG", "C.UTF-8"},
                                   {"USER", user},
                                   {"LOGNAME", user}};
    PyObject *os = loaded_module("os");
    PyObject *mod = os ? os : PyImport_ImportModule("posix"); /* built in */
    PyObject *env = mod ? PyObject_GetAttrString(mod, "environ") : NULL;
    int rc = -1;

    if (!env)
        goto out;
    if (os) {
        PyObject *cleared = PyObject_CallMethod(env, "clear", NULL);
        if (!cleared)
            goto out;
        Py_DECREF(cleared);
    } else if (!PyDict_Check(env) || clearenv() != 0)
        goto out;
    else
        PyDict_Clear(env);
    for (size_t i = 0; i < sizeof(vars) / sizeof(vars[0]); i++) {
        PyObject *k = os ? PyUnicode_DecodeFSDefault(vars[i][0]) : PyBytes_FromString(vars[i][0]);
        PyObject *v = os ? PyUnicode_DecodeFSDefault(vars[i][1]) : PyBytes_FromString(vars[i][1]);
        int set = k && v ? PyObject_SetItem(env, k, v) : -1;
        Py_XDECREF(k);
        Py_XDECREF(v);
        if (set < 0 || (!os && setenv(vars[i][0], vars[i][1], 1) < 0))
            goto out;
    }
    rc = 0;
out:
    Py_XDECREF(env);
    Py_XDECREF(mod);
    return rc;
}

/* --- the code's stdout --------------------------------------------------------
 *
 * A pipe, where Python would buffer it in blocks: a run stopped at a limit
 * would lose what it printed last (all of it, for a short run). It is
 * line-buffered, as on a terminal: each line goes out as it is printed.
 * But a write per line costs more than most lines (a system call, on some
 * machines several microseconds), and the answer shows only the first
 * max_output_chars characters: once the code has written that many, the
 * stream goes to blocks of 8 KiB, and a run stopped after that loses at
 * most its last block, of which the answer would show nothing. The switch
 * cannot be made inside a write (the buffer's lock is held there): it is a
 * pending call, made at the interpreter's next chance. stderr is
 * line-buffered, as Python makes it. */

static PyObject *out_stream;   /* our sys.stdout, a TextIOWrapper */
static uint64_t out_left;      /* characters still to go out line by line */
static bool out_switch_queued; /* the pending call is queued */
static bool out_in_blocks;     /* out_to_blocks switched it (the code's own reconfigure stays) */

static int out_set_lines(bool lines)
{
    PyObject *kw = Py_BuildValue("{s:O}", "line_buffering", lines ? Py_True : Py_False);
    PyObject *args = PyTuple_New(0);
    PyObject *reconf = out_stream ? PyObject_GetAttrString(out_stream, "reconfigure") : NULL;
    PyObject *r = kw && args && reconf ? PyObject_Call(reconf, args, kw) : NULL;
    int rc = r ? 0 : -1;

    Py_XDECREF(kw);
    Py_XDECREF(args);
    Py_XDECREF(reconf);
    Py_XDECREF(r);
    return rc;
}

static int out_to_blocks(void *unused)
{
    (void)unused;
    out_switch_queued = false;
    /* The code may have closed or broken its stream: it stays as it is. */
    if (out_set_lines(false) < 0)
        PyErr_Clear();
    else
        out_in_blocks = true;
    return 0;
}

/* One write(2) of |buf| to descriptor 1 without the GIL; *n what it
 * returned, and errno as it left it. */
static int out_write_once(const void *buf, size_t len, ssize_t *n)
{
    int e = 0;

    Py_BEGIN_ALLOW_THREADS;
    *n = write(1, buf, len);
    e = *n < 0 ? errno : 0;
    Py_END_ALLOW_THREADS;
    return e;
}

/* The raw layer's write(b): to descriptor 1, counting characters (bytes
 * that do not continue a UTF-8 sequence: never more than the answer will
 * count). As FileIO.write: the bytes written, None when the pipe would
 * block, OSError otherwise. */
static PyObject *out_write(PyObject *self, PyObject *arg)
{
    Py_buffer b;
    ssize_t n;

    (void)self;
    if (PyObject_GetBuffer(arg, &b, PyBUF_SIMPLE) < 0)
        return NULL;
    int e = 0;
    do {
        e = out_write_once(b.buf, (size_t)b.len, &n);
    } while (e == EINTR && PyErr_CheckSignals() == 0);
    if (n < 0) {
        PyBuffer_Release(&b);
        if (e == EAGAIN)
            Py_RETURN_NONE;
        if (e == EINTR)
            return NULL; /* a signal handler raised */
        errno = e;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    uint64_t chars = 0;
    for (ssize_t i = 0; i < n; i++)
        chars += (((const unsigned char *)b.buf)[i] & 0xC0) != 0x80;
    PyBuffer_Release(&b);
    if (out_left && chars >= out_left) {
        out_left = 0;
        if (!out_switch_queued && Py_AddPendingCall(out_to_blocks, NULL) == 0)
            out_switch_queued = true;
    } else if (out_left)
        out_left -= chars;
    return PyLong_FromSsize_t(n);
}

static PyMethodDef out_write_def = {"write", out_write, METH_O,
                                    "Write the bytes to the standard output."};

/* A worker's stdout and stderr are pipes, whatever the template's
 * descriptors 1 and 2 were when the streams were made (a stream asks once,
 * and keeps the answer): seekable() says False, as python3's do on pipes,
 * so tell() and reconfigure() behave as there. */
static PyObject *pipe_seekable(PyObject *self, PyObject *unused)
{
    (void)self;
    (void)unused;
    Py_RETURN_FALSE;
}

static PyMethodDef pipe_seekable_def = {"seekable", pipe_seekable, METH_NOARGS, "A pipe: False."};

/* A class of io.FileIO with the methods |defs| (staticmethods). */
static PyObject *fileio_class(PyObject *io, const char *name, PyMethodDef *const *defs)
{
    PyObject *fileio = PyObject_GetAttrString(io, "FileIO");
    PyObject *dict = PyDict_New();
    PyObject *cls = NULL;
    int rc = fileio && dict ? 0 : -1;

    for (; rc == 0 && *defs; defs++) {
        PyObject *fn = PyCFunction_New(*defs, NULL);
        PyObject *sm = fn ? PyStaticMethod_New(fn) : NULL;
        rc = sm ? PyDict_SetItemString(dict, (*defs)->ml_name, sm) : -1;
        Py_XDECREF(fn);
        Py_XDECREF(sm);
    }
    if (rc == 0)
        cls = PyObject_CallFunction((PyObject *)&PyType_Type, "s(O)O", name, fileio, dict);
    Py_XDECREF(fileio);
    Py_XDECREF(dict);
    return cls;
}

/* sys.|attr| (and sys.__|attr|__) afresh: a TextIOWrapper as Python's own,
 * line-buffered with the encoding and errors of the one it replaces, over
 * a FileIO of descriptor |fd| of the class |cls|. Returns the stream. */
static PyObject *stream_install(PyObject *io, PyObject *cls, int fd, const char *attr)
{
    char name[16], dunder[16];
    PyObject *old = PySys_GetObject(attr); /* borrowed */
    PyObject *raw = NULL, *buf = NULL, *text = NULL;

    fmt(name, sizeof(name), "<%s>", attr);
    fmt(dunder, sizeof(dunder), "__%s__", attr);
    if (old)
        raw = PyObject_CallFunction(cls, "isO", fd, "wb", Py_False);
    PyObject *rawname = PyUnicode_FromString(name);
    if (raw && rawname && PyObject_SetAttrString(raw, "name", rawname) == 0)
        buf = PyObject_CallMethod(io, "BufferedWriter", "O", raw);
    Py_XDECREF(rawname);
    PyObject *enc = old ? PyObject_GetAttrString(old, "encoding") : NULL;
    PyObject *errs = old ? PyObject_GetAttrString(old, "errors") : NULL;
    if (buf && enc && errs) {
        PyObject *kw = Py_BuildValue("{s:O, s:O, s:O}", "encoding", enc, "errors", errs,
                                     "line_buffering", Py_True);
        PyObject *args = PyTuple_Pack(1, buf);
        PyObject *wrapper = PyObject_GetAttrString(io, "TextIOWrapper");
        text = kw && args && wrapper ? PyObject_Call(wrapper, args, kw) : NULL;
        Py_XDECREF(kw);
        Py_XDECREF(args);
        Py_XDECREF(wrapper);
    }
    PyObject *mode = PyUnicode_FromString("w");
    if (text && (!mode || PyObject_SetAttrString(text, "mode", mode) < 0 ||
                 PySys_SetObject(attr, text) < 0 || PySys_SetObject(dunder, text) < 0))
        Py_CLEAR(text);
    Py_XDECREF(mode);
    Py_XDECREF(enc);
    Py_XDECREF(errs);
    Py_XDECREF(raw);
    Py_XDECREF(buf);
    if (!text && !PyErr_Occurred())
        PyErr_Format(PyExc_RuntimeError, "no sys.%s", attr);
    return text;
}

/* sys.stdout: its raw layer's write is out_write; sys.stderr: Python's
 * own write. Both pipes. */
int pyrun_stdout_install(void)
{
    static PyMethodDef *const out_defs[] = {&out_write_def, &pipe_seekable_def, NULL};
    static PyMethodDef *const err_defs[] = {&pipe_seekable_def, NULL};
    PyObject *io = PyImport_ImportModule("io");
    PyObject *out_cls = io ? fileio_class(io, "StdoutFileIO", out_defs) : NULL;
    PyObject *err_cls = out_cls ? fileio_class(io, "StderrFileIO", err_defs) : NULL;
    PyObject *text = NULL, *err = NULL;
    int rc = -1;

    if (err_cls && (text = stream_install(io, out_cls, 1, "stdout")) &&
        (err = stream_install(io, err_cls, 2, "stderr"))) {
        out_stream = Py_NewRef(text);
        rc = 0;
    }
    Py_XDECREF(io);
    Py_XDECREF(out_cls);
    Py_XDECREF(err_cls);
    Py_XDECREF(text);
    Py_XDECREF(err);
    return rc;
}

/* Before a run's (or a cell's) code: line by line again, for |chars|
 * (nothing to do in a worker: the template's stream is line-buffered; a
 * cell after one that went to blocks switches back). */
static void out_reset(uint64_t chars)
{
    out_left = chars;
    if (!out_in_blocks)
        return;
    out_in_blocks = false;
    if (out_set_lines(true) < 0)
        PyErr_Clear(); /* a cell's code may have closed it: as it left it */
}

/* What a request will do, done once on a snippet of our own, so that the
 * pages it touches are copied now and not on the request path: seed
 * linecache, compile() bytes, run in a namespace like __main__'s, print,
 * flush. Output goes to |devnull|. */
static int rehearse(int devnull)
{
    static const char snippet[] = "print(1)\n";
    PyObject *main_mod = PyImport_AddModule("__main__"); /* borrowed */
    PyObject *ns = main_mod ? PyDict_Copy(PyModule_GetDict(main_mod)) : NULL;
    PyObject *co = NULL, *last = NULL, *res = NULL, *out = NULL, *lc = NULL, *cache = NULL;
    int saved = -1, rc = -1;

    saved = dup(1);
    if (!ns || saved < 0 || dup2(devnull, 1) < 0)
        goto out;
    seed_linecache(snippet, sizeof(snippet) - 1);
    co = compile_parts(snippet, sizeof(snippet) - 1, &last);
    res = co ? PyEval_EvalCode(co, ns, ns) : NULL;
    if (res && last) {
        Py_DECREF(res);
        res = PyEval_EvalCode(last, ns, ns);
    }
    out = PySys_GetObject("stdout"); /* borrowed */
    if (res && out) {
        PyObject *r = PyObject_CallMethod(out, "flush", NULL);
        Py_XDECREF(r);
        rc = r ? 0 : -1;
    }
    /* Leave no trace of ours for the code to find. */
    lc = PyImport_ImportModule("linecache");
    cache = lc ? PyObject_GetAttrString(lc, "cache") : NULL;
    if (cache && PyDict_Check(cache) && PyDict_DelItemString(cache, MAIN_FILENAME) < 0)
        PyErr_Clear();
out:
    if (saved >= 0) {
        if (dup2(saved, 1) < 0)
            rc = -1;
        close(saved);
    }
    Py_XDECREF(cache);
    Py_XDECREF(lc);
    Py_XDECREF(res);
    Py_XDECREF(last);
    Py_XDECREF(co);
    Py_XDECREF(ns);
    return rc;
}

/* Random state the template's modules made as they were imported would be
 * every worker's, the same draws in every run: each worker gets its own,
 * from the kernel's randomness, before its request. Which modules keep
 * such state was looked for, not guessed (test_packages.sh scans every
 * module of the warm set and the vetted packages for random-state
 * objects): numpy's global RandomState, behind np.random.random() and
 * pandas' sample(). random reseeds itself after a fork (os.register_at_fork);
 * SystemRandom, secrets, uuid4 and numpy's Generators read the kernel at
 * each draw. Returns 0, or -1 with a Python exception. */
static int reseed(void)
{
    PyObject *mtrand = loaded_module("numpy.random.mtrand");
    PyObject *rand = mtrand ? PyObject_GetAttrString(mtrand, "_rand") : NULL;
    PyObject *r = rand ? PyObject_CallMethod(rand, "seed", NULL) : NULL;
    int rc = !mtrand || r ? 0 : -1;

    Py_XDECREF(mtrand);
    Py_XDECREF(rand);
    Py_XDECREF(r);
    return rc;
}

/* Runs |code| of our own in a namespace of its own. 0, or -1 with a
 * Python exception. */
static int warm_up(const char *code)
{
    PyObject *ns = PyDict_New();
    PyObject *r = NULL;

    if (ns && PyDict_SetItemString(ns, "__builtins__", PyEval_GetBuiltins()) == 0)
        r = PyRun_String(code, Py_file_input, ns, ns);
    Py_XDECREF(ns);
    Py_XDECREF(r);
    return r ? 0 : -1;
}

int pyrun_prepare(const char *workspace, const char *user, bool rehearsal, const char *warm_code,
                  int devnull, char *err, size_t errlen)
{
    fmt(value_path, sizeof(value_path), "%s/" WIRE_VALUE_FILE, workspace);
    fmt(error_path, sizeof(error_path), "%s/" WIRE_ERROR_FILE, workspace);
    if (set_environment(workspace, user) < 0 || reseed() < 0 ||
        (rehearsal && rehearse(devnull) < 0) || (warm_code && warm_up(warm_code) < 0))
        return pyrun_error_text("preparing the worker", err, errlen);
    return 0;
}

/* As CPython's handle_system_exit: None is 0, an int is itself, anything
 * else is printed to stderr and is 1. The int as Python holds it: whole
 * when it fits in 64 bits (sys.exit(2 ** 32) is not 0: a cell of it rolls
 * back); else past them, either way (python3 exits 255). */
static struct pyrun_exit system_exit_status(void)
{
    PyObject *type = NULL, *value = NULL, *tb = NULL;
    PyObject *code = NULL;
    struct pyrun_exit status = {.value = 1};

    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    if (value && PyExceptionInstance_Check(value))
        code = PyObject_GetAttrString(value, "code");
    else if (value) {
        code = value;
        Py_INCREF(code);
    }
    if (!code || code == Py_None)
        status.value = code ? 0 : 1;
    else if (PyLong_Check(code)) {
        int over = 0;
        long long v = PyLong_AsLongLongAndOverflow(code, &over);
        if (over)
            status = (struct pyrun_exit){.value = over > 0 ? INT64_MAX : -1, .past = true};
        else
            status.value = v == -1 && PyErr_Occurred() ? -1 : v;
    } else {
        PyObject *err = PySys_GetObject("stderr");
        if (err && err != Py_None) {
            PyFile_WriteObject(code, err, Py_PRINT_RAW);
            PyFile_WriteString("\n", err);
        }
    }
    PyErr_Clear();
    Py_XDECREF(code);
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(tb);
    return status;
}

static void call_quietly(const char *module, const char *method)
{
    PyObject *m = loaded_module(module);
    if (!m)
        return;
    PyObject *r = PyObject_CallMethod(m, method, NULL);
    if (!r)
        PyErr_WriteUnraisable(m);
    Py_XDECREF(r);
    Py_DECREF(m);
}

static int flush_stream(const char *name)
{
    PyObject *f = PySys_GetObject(name);
    PyObject *r;

    if (!f || f == Py_None)
        return 0;
    r = PyObject_CallMethod(f, "flush", NULL);
    if (!r) {
        PyErr_Clear();
        return -1;
    }
    Py_DECREF(r);
    return 0;
}

/* |o| as UTF-8 bytes and a NUL (new reference), |fallback| when it cannot
 * be had (str() may be the code's own, and raise). */
static PyObject *report_part(PyObject *o, const char *fallback)
{
    PyObject *b = o ? PyUnicode_AsEncodedString(o, "utf-8", "replace") : NULL;
    PyObject *part = b ? PyBytes_FromFormat("%s%c", PyBytes_AS_STRING(b), 0) : NULL;

    Py_XDECREF(b);
    if (!part) {
        PyErr_Clear();
        part = PyBytes_FromFormat("%s%c", fallback, 0);
    }
    return part;
}

/* The exception |value| of |type|, for the supervisor (WIRE_ERROR_FILE):
 * its type's name (module.qualname, or the qualname alone of a builtin or
 * of the program's own, as Python's traceback names it), str()
 * of it, and the traceback as traceback.format_exception gives it. Leaves
 * no Python exception set. */
static void send_error(PyObject *type, PyObject *value)
{
    PyObject *mod = PyObject_GetAttrString(type, "__module__");
    PyObject *qual = PyObject_GetAttrString(type, "__qualname__");
    PyObject *name = NULL;

    if (mod && qual && PyUnicode_Check(mod) && PyUnicode_CompareWithASCIIString(mod, "builtins") &&
        PyUnicode_CompareWithASCIIString(mod, "__main__"))
        name = PyUnicode_FromFormat("%U.%U", mod, qual);
    else if (qual && PyUnicode_Check(qual))
        name = Py_NewRef(qual);
    PyErr_Clear();
    PyObject *msg = PyObject_Str(value);
    PyErr_Clear();
    PyObject *tbm = PyImport_ImportModule("traceback");
    PyObject *lines = tbm ? PyObject_CallMethod(tbm, "format_exception", "O", value) : NULL;
    PyObject *empty = PyUnicode_FromString("");
    PyObject *text = lines && empty ? PyUnicode_Join(empty, lines) : NULL;
    PyErr_Clear();
    PyObject *parts[3] = {report_part(name, "?"), report_part(msg, "<str() of it failed>"),
                          report_part(text, "")};
    if (parts[0] && parts[1] && parts[2])
        write_report(error_path, parts, 3);
    PyErr_Clear();
    for (int i = 0; i < 3; i++)
        Py_XDECREF(parts[i]);
    Py_XDECREF(mod);
    Py_XDECREF(qual);
    Py_XDECREF(name);
    Py_XDECREF(msg);
    Py_XDECREF(tbm);
    Py_XDECREF(lines);
    Py_XDECREF(empty);
    Py_XDECREF(text);
}

/* As PyErr_Print, but through the traceback module when sys.excepthook is
 * the default: the C printer reads source lines from files only, and the
 * code's lines live in linecache. */
static void print_exception(void)
{
    PyObject *type = NULL, *value = NULL, *tb = NULL;
    PyObject *hook = PySys_GetObject("excepthook");     /* borrowed */
    PyObject *dflt = PySys_GetObject("__excepthook__"); /* borrowed */
    PyObject *r = NULL;

    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    if (!value) {
        Py_XDECREF(type);
        Py_XDECREF(tb);
        return;
    }
    if (tb)
        PyException_SetTraceback(value, tb);
    send_error(type, value);
    if (hook && hook != dflt) {
        r = PyObject_CallFunctionObjArgs(hook, type, value, tb ? tb : Py_None, NULL);
    } else {
        PyObject *tbm = PyImport_ImportModule("traceback");
        r = tbm ? PyObject_CallMethod(tbm, "print_exception", "O", value) : NULL;
        Py_XDECREF(tbm);
    }
    if (!r) {
        /* Out of memory, or a broken hook: the plain C printer. */
        PyErr_Clear();
        PyErr_Display(type, value, tb);
    }
    Py_XDECREF(r);
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(tb);
}

_Noreturn static void die_of_memory_error(void)
{
    int sig = WIRE_NOMEM_SIGNAL;
    sigset_t set;

    signal(sig, SIG_DFL);
    sigemptyset(&set);
    sigaddset(&set, sig);
    sigprocmask(SIG_UNBLOCK, &set, NULL);
    /* To our process group, which is this process alone (a worker and a
     * session's cell each lead their own): raise() names our pid, which a
     * session's policy cannot know and refuses. */
    kill(0, sig);
    _exit(1);
}

/* Compiles and runs |code| (freed here) as __main__; returns how it
 * ended, or ends the process at once for an uncaught MemoryError
 * (die_of_memory_error). */
static struct pyrun_exit run_code(char *code, size_t len)
{
    PyObject *main_mod = PyImport_AddModule("__main__"); /* borrowed */
    PyObject *globals = main_mod ? PyModule_GetDict(main_mod) : NULL;
    PyObject *co = NULL, *last = NULL;
    PyObject *res = NULL;
    bool nomem = false;
    struct pyrun_exit status = {0};

    /* The source lines for tracebacks (and inspect) are a copy or two of
     * the program: up front only for a program of ordinary size, and only
     * when linecache is loaded already (warm in the template; importing it
     * costs a single run more than the run). Otherwise a traceback seeds
     * them when it needs them. */
    bool seeded = len <= LINECACHE_EAGER_MAX && module_loaded("linecache");
    if (seeded)
        seed_linecache(code, len);
    co = globals ? compile_parts(code, len, &last) : NULL;
    if (co)
        res = PyEval_EvalCode(co, globals, globals);
    Py_XDECREF(co);
    unlink(value_path);
    unlink(error_path);
    if (res && last) {
        Py_DECREF(res);
        res = PyEval_EvalCode(last, globals, globals);
        if (res && send_value(res) < 0)
            Py_CLEAR(res);
    }
    Py_XDECREF(last);

    if (res)
        Py_DECREF(res);
    else if (PyErr_ExceptionMatches(PyExc_SystemExit))
        status = system_exit_status();
    else {
        nomem = PyErr_ExceptionMatches(PyExc_MemoryError);
        if (!seeded && !nomem) {
            PyObject *type, *value, *tb;
            PyErr_Fetch(&type, &value, &tb);
            seed_linecache(code, len);
            PyErr_Restore(type, value, tb);
        }
        print_exception();
        status.value = 1;
    }
    free(code);
    if (nomem) {
        flush_stream("stderr");
        die_of_memory_error();
    }
    figures_flush();
    return status;
}

/* sys.argv = [argv0, *args]. Returns 0, or -1 with a Python exception. */
static int set_argv(const char *argv0, char *const *args, uint32_t n)
{
    PyObject *list = PyList_New((Py_ssize_t)n + 1);

    for (uint32_t i = 0; list && i <= n; i++) {
        const char *s = i ? args[i - 1] : argv0;
        PyObject *a = PyUnicode_DecodeUTF8(s, (Py_ssize_t)strlen(s), "surrogateescape");
        if (!a)
            Py_CLEAR(list);
        else
            PyList_SET_ITEM(list, i, a);
    }
    int rc = list ? PySys_SetObject("argv", list) : -1;
    Py_XDECREF(list);
    return rc;
}

/* Before a run's code: its name, arguments and stdout. sys.argv is the
 * template's [""] and __main__ has no __file__ until a request gives a
 * name or arguments (a cell after one that had some gets them undone). As
 * python3 has them: "report.py" is sys.argv[0], __file__ and the file a
 * traceback names; "-" is sys.argv[0] and the others are "<stdin>". */
static void before_code(uint64_t output_chars, char *const *args, uint32_t n_args,
                        const char *filename)
{
    static bool argv_given, file_given;
    /* Ours: the request's copy goes with the request (a cell's). */
    static char name[WIRE_FILE_NAME_MAX + 1];
    bool stdin_named = filename && strcmp(filename, "-") == 0;

    out_reset(output_chars);
    if (filename)
        fmt(name, sizeof(name), "%s", stdin_named ? "<stdin>" : filename);
    code_name = filename ? name : MAIN_FILENAME;
    if (!n_args && !filename && !argv_given && !file_given)
        return;
    argv_given = n_args > 0 || filename;
    if (set_argv(filename ? filename : "", args, n_args) < 0)
        PyErr_Clear(); /* out of memory: sys.argv as it was */
    /* __file__: set for a named program; taken away after one only (a
     * variable of that name a cell made itself stays). */
    PyObject *main_mod = PyImport_AddModule("__main__"); /* borrowed */
    PyObject *globals = main_mod ? PyModule_GetDict(main_mod) : NULL;
    PyObject *file = filename ? PyUnicode_FromString(name) : NULL;
    if (globals && (file || file_given) &&
        (file ? PyDict_SetItemString(globals, "__file__", file)
              : PyDict_DelItemString(globals, "__file__")) < 0)
        PyErr_Clear(); /* out of memory, or none to take away */
    file_given = filename != NULL;
    Py_XDECREF(file);
}

/* --- host tools --------------------------------------------------------------- */

/* The pysbx module of a run that declared tools. Its calls go out on the
 * request socket, framed as a little-endian uint32 length and a JSON object
 * {"name", "arguments"}; answers come back framed the same way,
 * {"call": N, "content"} or {"call": N, "error"}, N counting the calls sent.
 * The code may do anything with the descriptor itself: the supervisor
 * trusts nothing that comes on it (lib/tools.c). */
static const char tools_source[] =
    "\"\"\"The host tools this run may call: pysbx.tools.NAME(**arguments), or\n"
    "pysbx.call_tool(name, arguments). A call waits for the host's answer (the\n"
    "run's wall and CPU limits keep running) and returns its result, decoded\n"
    "from JSON; a call the host refused or failed raises ToolError.\"\"\"\n"
    "import json as _json, os as _os, struct as _struct, threading as _threading, types as _types\n"
    "\n"
    "\n"
    "class ToolError(Exception):\n"
    "    \"\"\"A tool call the host refused, or one whose tool failed.\"\"\"\n"
    "\n"
    "\n"
    "_send = _threading.Lock()\n"
    "_cond = _threading.Condition()\n"
    "_results = {}\n"
    "_state = {\"sent\": 0, \"reading\": False, \"closed\": None}\n"
    "\n"
    "\n"
    "def _read_exact(n):\n"
    "    b = bytearray()\n"
    "    while len(b) < n:\n"
    "        chunk = _os.read(_FD, n - len(b))\n"
    "        if not chunk:\n"
    "            raise EOFError\n"
    "        b += chunk\n"
    "    return bytes(b)\n"
    "\n"
    "\n"
    "def call_tool(name, arguments=None):\n"
    "    \"\"\"Calls host tool |name| with |arguments| (a dict that JSON encodes) and\n"
    "    returns its result.\"\"\"\n"
    "    if arguments is None:\n"
    "        arguments = {}\n"
    "    if not isinstance(name, str) or not isinstance(arguments, dict):\n"
    "        raise TypeError(\"call_tool(name: str, arguments: dict)\")\n"
    "    body = _json.dumps({\"name\": name, \"arguments\": arguments}, "
    "ensure_ascii=False).encode()\n"
    "    if len(body) > _SPEC[\"max_bytes\"]:\n"
    "        raise ToolError(\"a call of %d bytes, more than max_tool_bytes (%d)\" % (len(body), "
    "_SPEC[\"max_bytes\"]))\n"
    "    with _send:\n"
    "        if _state[\"closed\"]:\n"
    "            raise ToolError(_state[\"closed\"])\n"
    "        view = memoryview(_struct.pack(\"<I\", len(body)) + body)\n"
    "        try:\n"
    "            while view:\n"
    "                view = view[_os.write(_FD, view):]\n"
    "        except OSError as e:\n"
    "            _state[\"closed\"] = \"the tool channel is closed (%s)\" % e.strerror\n"
    "            raise ToolError(_state[\"closed\"]) from None\n"
    "        _state[\"sent\"] += 1\n"
    "        n = _state[\"sent\"]\n"
    "    with _cond:\n"
    "        while n not in _results:\n"
    "            if _state[\"closed\"]:\n"
    "                raise ToolError(_state[\"closed\"])\n"
    "            if _state[\"reading\"]:\n"
    "                _cond.wait()\n"
    "                continue\n"
    "            _state[\"reading\"] = True\n"
    "            _cond.release()\n"
    "            msg = None\n"
    "            try:\n"
    "                head = _read_exact(4)\n"
    "                msg = _json.loads(_read_exact(_struct.unpack(\"<I\", head)[0]))\n"
    "            except Exception:\n"
    "                pass\n"
    "            finally:\n"
    "                _cond.acquire()\n"
    "                _state[\"reading\"] = False\n"
    "            if isinstance(msg, dict) and type(msg.get(\"call\")) is int:\n"
    "                _results[msg[\"call\"]] = msg\n"
    "            else:\n"
    "                _state[\"closed\"] = \"the tool channel is closed\"\n"
    "            _cond.notify_all()\n"
    "        msg = _results.pop(n)\n"
    "    if \"error\" in msg:\n"
    "        raise ToolError(str(msg[\"error\"]))\n"
    "    return msg.get(\"content\")\n"
    "\n"
    "\n"
    "def _tool(name, doc):\n"
    "    def call(**arguments):\n"
    "        return call_tool(name, arguments)\n"
    "    call.__name__ = call.__qualname__ = name\n"
    "    call.__doc__ = doc\n"
    "    return call\n"
    "\n"
    "\n"
    "_SPEC = _json.loads(_TOOLS)\n"
    "tools = _types.SimpleNamespace(**{t[\"name\"]: _tool(t[\"name\"], t.get(\"description\") or "
    "None)\n"
    "                                  for t in _SPEC[\"tools\"]})\n"
    "del _tool\n";

int pyrun_tools(int fd, const char *tools_json, char *err, size_t cap)
{
    PyObject *mod = PyModule_New("pysbx");
    PyObject *d = mod ? PyModule_GetDict(mod) : NULL; /* borrowed */
    PyObject *fdo = PyLong_FromLong(fd), *tools = PyUnicode_FromString(tools_json), *r = NULL;
    /* Named, so that a traceback through it says where it was. */
    PyObject *compiled = Py_CompileString(tools_source, "<pysbx>", Py_file_input);
    int rc = -1;

    if (d && fdo && tools && PyDict_SetItemString(d, "__builtins__", PyEval_GetBuiltins()) == 0 &&
        PyDict_SetItemString(d, "_FD", fdo) == 0 && PyDict_SetItemString(d, "_TOOLS", tools) == 0 &&
        compiled && (r = PyEval_EvalCode(compiled, d, d)) &&
        PyDict_DelItemString(d, "_TOOLS") == 0 &&
        PyDict_SetItemString(PyImport_GetModuleDict(), "pysbx", mod) == 0)
        rc = 0;
    if (rc < 0) {
        PyErr_Clear();
        fmt(err, cap, "pysbx: the tools module could not be made\n");
    }
    Py_XDECREF(r);
    Py_XDECREF(compiled);
    Py_XDECREF(tools);
    Py_XDECREF(fdo);
    Py_XDECREF(mod);
    return rc;
}

_Noreturn void pyrun_main(char *code, size_t len, uint64_t output_chars, char *const *args,
                          uint32_t n_args, const char *filename)
{
    before_code(output_chars, args, n_args, filename);
    struct pyrun_exit status = run_code(code, len);

    /* What Py_FinalizeEx does that the code can observe, without the rest:
     * the process is about to vanish. */
    call_quietly("threading", "_shutdown");
    call_quietly("atexit", "_run_exitfuncs");
    if (flush_stream("stdout") < 0 && status.value == 0)
        status.value = 120;
    flush_stream("stderr");
    prof_mark(PROF_RAN);
    prof_report(2);
    _exit((int)(status.value & 0xff));
}

struct pyrun_exit pyrun_cell(char *code, size_t len, uint64_t output_chars, char *const *args,
                             uint32_t n_args, const char *filename)
{
    before_code(output_chars, args, n_args, filename);
    struct pyrun_exit status = run_code(code, len);

    /* The process lives on as the session's state: no thread is waited
     * for (one still running makes the cell roll back) and no exit hook
     * runs. What the cell printed goes out now, before its pipes close. */
    if (flush_stream("stdout") < 0 && status.value == 0)
        status.value = 120;
    flush_stream("stderr");
    return status;
}
