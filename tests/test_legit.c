/*
 * Legitimate code behaves as under plain python3: each snippet runs in the
 * sandbox and under `python3 -I -S` in an empty temporary directory, and the
 * two standard outputs must be identical.
 */
#define _GNU_SOURCE
#include "helpers.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define SBX(state) (((struct fixture *)*(state))->sbx)
#define PYTHON3    "/usr/bin/python3"

static char *plain_python(const char *code)
{
    char dir[256], script[512], cmd[1400];
    make_temp_dir(dir, sizeof(dir));
    snprintf(script, sizeof(script), "%s.py", dir);
    FILE *f = fopen(script, "w");
    assert_non_null(f);
    fputs(code, f);
    fclose(f);
    snprintf(cmd, sizeof(cmd), "cd '%s' && env -i HOME='%s' TMPDIR='%s' LANG=C.UTF-8 %s -I -S '%s'",
             dir, dir, dir, PYTHON3, script);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    size_t cap = 1 << 20, len = 0;
    char *out = calloc(1, cap);
    size_t n;
    while ((n = fread(out + len, 1, cap - 1 - len, p)) > 0)
        len += n;
    int status = pclose(p);
    if (status != 0)
        fail_msg("python3 itself failed (%d) on:\n%s", status, code);
    unlink(script);
    remove_dir(dir);
    return out;
}

static void same_as_python3(void **state, const char *code)
{
    char *want = plain_python(code);
    struct sbx_result *r = run_code(SBX(state), code);
    expect_completed(r, 0);
    if (strcmp(r->stdout_text, want) != 0)
        fail_msg("sandbox:\n%s\npython3:\n%s", r->stdout_text, want);
    assert_true(strlen(want) > 0);
    sbx_result_free(r);
    free(want);
}

static void threads(void **state)
{
    same_as_python3(state,
                    "from concurrent.futures import ThreadPoolExecutor\n"
                    "import threading\n"
                    "import time\n"
                    "with ThreadPoolExecutor(16) as ex:\n"
                    "    print(sum(ex.map(lambda x: time.sleep(0.01) or x * x, range(100))))\n"
                    "lock = threading.Lock()\n"
                    "n = [0]\n"
                    "def inc():\n"
                    "    for _ in range(10000):\n"
                    "        with lock:\n"
                    "            n[0] += 1\n"
                    "ts = [threading.Thread(target=inc) for _ in range(16)]\n"
                    "[t.start() for t in ts]\n[t.join() for t in ts]\n"
                    "print(n[0], threading.active_count())\n");
}

static void decimal_and_fractions(void **state)
{
    same_as_python3(state,
                    "from decimal import Decimal, getcontext\n"
                    "from fractions import Fraction\n"
                    "import statistics, math\n"
                    "getcontext().prec = 50\n"
                    "print(Decimal(1) / Decimal(7), Decimal(2).sqrt())\n"
                    "print(Fraction(3, 7) + Fraction(1, 3), math.comb(50, 25))\n"
                    "print(statistics.mean([1, 2, 3, 4.5]), statistics.median([5, 1, 3]))\n");
}

static void sqlite3_in_memory(void **state)
{
    same_as_python3(state,
                    "import sqlite3\n"
                    "c = sqlite3.connect(':memory:')\n"
                    "c.execute('create table t (k text, v integer)')\n"
                    "c.executemany('insert into t values (?, ?)',"
                    " [(str(i % 7), i) for i in range(1000)])\n"
                    "print(c.execute('select k, count(*), sum(v) from t group by k order by k')"
                    ".fetchall())\n"
                    "print(sqlite3.sqlite_version_info >= (3, 0, 0))\n");
}

static void sqlite3_on_a_workspace_file(void **state)
{
    same_as_python3(state, "import sqlite3, os\n"
                           "c = sqlite3.connect('db.sqlite')\n"
                           "c.execute('create table t (x)')\n"
                           "c.executemany('insert into t values (?)', [(i,) for i in range(100)])\n"
                           "c.commit()\nc.close()\n"
                           "print(sqlite3.connect('db.sqlite').execute('select sum(x) from t')"
                           ".fetchone(), os.path.getsize('db.sqlite') > 0)\n");
}

static void re_and_json(void **state)
{
    same_as_python3(state,
                    "import re, json\n"
                    "text = 'a1 b22 c333 d4444 caf\\u00e9'\n"
                    "print(re.findall(r'([a-z])(\\d+)', text))\n"
                    "print(re.sub(r'(\\d+)', lambda m: str(len(m.group(1))), text))\n"
                    "print(re.compile(r'CAF\\u00c9', re.I | re.U).search(text) is not None)\n"
                    "d = {'b': [1, 2.5, None, True], 'a': {'\\u00e9': 'x'}}\n"
                    "s = json.dumps(d, sort_keys=True, indent=1, ensure_ascii=False)\n"
                    "print(s)\nprint(json.loads(s) == d)\n");
}

static void datetime_strptime(void **state)
{
    same_as_python3(state,
                    "from datetime import datetime, timedelta, timezone\n"
                    "d = datetime.strptime('2024-02-28 23:30:00', '%Y-%m-%d %H:%M:%S')\n"
                    "print(d + timedelta(hours=1), (d + timedelta(days=1)).strftime('%A %d %B'))\n"
                    "print(datetime(2024, 1, 1, tzinfo=timezone.utc).isoformat())\n"
                    "print(datetime.strptime('03/Jul/2023', '%d/%b/%Y').date())\n");
}

static void tempfile_in_the_workspace(void **state)
{
    same_as_python3(state, "import tempfile, os\n"
                           "with tempfile.TemporaryDirectory() as d:\n"
                           "    p = os.path.join(d, 'x.txt')\n"
                           "    open(p, 'w').write('hello')\n"
                           "    print(open(p).read(), d.startswith(tempfile.gettempdir()))\n"
                           "with tempfile.NamedTemporaryFile('w+') as f:\n"
                           "    f.write('abc')\n    f.seek(0)\n    print(f.read())\n"
                           "print(os.listdir('.'))\n");
}

static void hashlib_digests(void **state)
{
    same_as_python3(state, "import hashlib, hmac\n"
                           "for name in ('md5', 'sha1', 'sha256', 'sha3_256', 'blake2b'):\n"
                           "    print(name, hashlib.new(name, b'pysbx').hexdigest())\n"
                           "print(hashlib.pbkdf2_hmac('sha256', b'pw', b'salt', 1000).hex())\n"
                           "print(hmac.new(b'k', b'm', 'sha256').hexdigest())\n");
}

static void random_with_a_seed(void **state)
{
    same_as_python3(state, "import random\n"
                           "r = random.Random(42)\n"
                           "print([r.randint(0, 100) for _ in range(5)], r.random())\n"
                           "random.seed(7)\n"
                           "print(random.sample(range(100), 5), random.gauss(0, 1))\n");
}

static void zipfile_lzma_and_friends_on_workspace_files(void **state)
{
    same_as_python3(state,
                    "import zipfile, lzma, bz2, gzip, os\n"
                    "data = ('line %d\\n' * 3) % (1, 2, 3)\n"
                    "for i in range(3):\n"
                    "    open(f'f{i}.txt', 'w').write(data * (i + 1))\n"
                    "for method in (zipfile.ZIP_DEFLATED, zipfile.ZIP_LZMA, zipfile.ZIP_BZIP2):\n"
                    "    with zipfile.ZipFile('a.zip', 'w', method) as z:\n"
                    "        for i in range(3):\n"
                    "            z.write(f'f{i}.txt')\n"
                    "    with zipfile.ZipFile('a.zip') as z:\n"
                    "        print(method, z.namelist(), [len(z.read(n)) for n in z.namelist()])\n"
                    "with lzma.open('x.xz', 'wt') as f:\n    f.write(data * 100)\n"
                    "print(len(lzma.open('x.xz', 'rt').read()), os.path.getsize('x.xz') < 1000)\n"
                    "print(bz2.decompress(bz2.compress(b'x' * 1000)) == b'x' * 1000)\n"
                    "print(gzip.decompress(gzip.compress(b'y' * 10)))\n");
}

static void asyncio_and_csv(void **state)
{
    same_as_python3(state, "import asyncio, csv, io\n"
                           "async def work(i):\n"
                           "    await asyncio.sleep(0.001 * (3 - i))\n"
                           "    return i * i\n"
                           "async def main():\n"
                           "    return await asyncio.gather(*(work(i) for i in range(3)))\n"
                           "print(asyncio.run(main()))\n"
                           "buf = io.StringIO()\n"
                           "csv.writer(buf).writerows([['a', 'b,c'], [1, 2]])\n"
                           "print(repr(buf.getvalue()))\n"
                           "print(list(csv.reader(io.StringIO(buf.getvalue()))))\n");
}

/* The locale LANG names is there: a program that asks for the user's
 * locale gets it, as under python3, instead of "unsupported locale". */
static void the_locale_lang_names(void **state)
{
    same_as_python3(state, "import locale, time\n"
                           "print(locale.setlocale(locale.LC_ALL, ''))\n"
                           "print(locale.getlocale(), locale.localeconv()['decimal_point'])\n"
                           "print(time.strftime('%A %B', time.gmtime(0)))\n"
                           "print('{:n}'.format(1234567.5))\n");
}

/* What CPython's own tests found: root has a name (tarfile asks), "/" can
 * be listed, terminal queries on a bad descriptor answer EBADF, the frozen
 * modules have their files and sys.executable names the interpreter. */
/* A symbolic link's own mode: Linux has none to change. glibc 2.39 and
 * later ask the kernel (fchmodat2), which says so; 2.36 found out itself. */
static void a_link_mode_change_fails_as_under_python3(void **state)
{
    same_as_python3(state, "import os, tempfile\n"
                           "d = tempfile.mkdtemp(dir='.')\n"
                           "os.symlink('missing', d + '/link')\n"
                           "try:\n"
                           "    os.chmod(d + '/link', 0o600, follow_symlinks=False)\n"
                           "    print('changed')\n"
                           "except Exception as e:\n"
                           "    print(type(e).__name__, e)\n");
}

static void owners_listings_and_terminal_queries(void **state)
{
    same_as_python3(state, "import errno, grp, os, pwd, tarfile, io, sys, codecs\n"
                           "print(os.__file__, codecs.__file__, sys._stdlib_dir, sys.executable)\n"
                           "print(pwd.getpwuid(0).pw_name, grp.getgrgid(0).gr_name)\n"
                           "print(type(os.listdir('/')).__name__, 'usr' in os.listdir('/'))\n"
                           "for f in (os.tcgetpgrp, lambda fd: os.tcsetpgrp(fd, 0)):\n"
                           "    try:\n"
                           "        f(99)\n"
                           "    except OSError as e:\n"
                           "        print(errno.errorcode[e.errno])\n"
                           "t = tarfile.open(fileobj=io.BytesIO(), mode='w')\n"
                           "t.add(os.__file__, arcname='os.py')\n"
                           "print(t.getmember('os.py').uname)\n");
}

int main(void)
{
    if (access(PYTHON3, X_OK) != 0) {
        fprintf(stderr, "test_legit needs %s to compare against\n", PYTHON3);
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(threads),
        cmocka_unit_test(decimal_and_fractions),
        cmocka_unit_test(sqlite3_in_memory),
        cmocka_unit_test(sqlite3_on_a_workspace_file),
        cmocka_unit_test(re_and_json),
        cmocka_unit_test(datetime_strptime),
        cmocka_unit_test(tempfile_in_the_workspace),
        cmocka_unit_test(hashlib_digests),
        cmocka_unit_test(random_with_a_seed),
        cmocka_unit_test(zipfile_lzma_and_friends_on_workspace_files),
        cmocka_unit_test(asyncio_and_csv),
        cmocka_unit_test(the_locale_lang_names),
        cmocka_unit_test(owners_listings_and_terminal_queries),
        cmocka_unit_test(a_link_mode_change_fails_as_under_python3),
    };
    return cmocka_run_group_tests(tests, fixture_open, fixture_close);
}
