#include "places.h"

#include "util.h"

const struct place places[] = {
    {PYSBX_PY_STDLIB, PLACE_DIR, "the standard library, lib-dynload within"},
    {PYSBX_PY_LIBDIR, PLACE_DIR, "shared libraries that extension modules load"},
    {"/lib/" PYSBX_MULTIARCH, PLACE_DIR, "the same, where /lib is not merged into /usr"},
    {"/etc/ld.so.cache", PLACE_FILE, "finding those libraries"},
    /* Debian's stdlib links its sitecustomize.py here: without its target
     * the link dangles and code that reads the whole stdlib fails on it. */
    {"/etc/python" PYSBX_PY_VERSION "/sitecustomize.py", PLACE_FILE,
     "the target of the standard library's sitecustomize.py link"},
    {"/etc/localtime", PLACE_FILE, "time.localtime"},
    /* The locale the worker's LANG names: setlocale(LC_ALL, "") fails
     * without its files. */
    {"/usr/lib/locale/C.utf8", PLACE_DIR, "the C.UTF-8 locale, which LANG names"},
    {"/usr/share/zoneinfo", PLACE_DIR, "zoneinfo"},
    {"/sys/devices/system/cpu", PLACE_DIR, "os.cpu_count"},
    {"/dev/null", PLACE_DEVICE_RW, "stdin, and code that writes to it"},
    {"/dev/zero", PLACE_DEVICE, "mmap of zeroes"},
    {"/dev/urandom", PLACE_DEVICE, "os.urandom fallbacks"},
    {"/dev/random", PLACE_DEVICE, "the same"},
};

const size_t n_places = ARRAY_SIZE(places);
