#define _GNU_SOURCE
#include "mac.h"

#include "util.h"

#include <dlfcn.h>
#include <errno.h>
#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/params.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

/* libcrypto's functions, loaded on first use: linked into the command, it
 * would cost every `pysbx run` its start-up. */
static struct {
    __typeof__(EVP_MAC_fetch) *fetch;
    __typeof__(EVP_MAC_free) *free;
    __typeof__(EVP_MAC_CTX_new) *ctx_new;
    __typeof__(EVP_MAC_CTX_free) *ctx_free;
    __typeof__(EVP_MAC_CTX_dup) *ctx_dup;
    __typeof__(EVP_MAC_init) *init;
    __typeof__(EVP_MAC_update) *update;
    __typeof__(EVP_MAC_final) *final;
    __typeof__(CRYPTO_memcmp) *memcmp;
} crypto;

static pthread_once_t loaded = PTHREAD_ONCE_INIT;
static char load_error[160];

static void load(void)
{
    /* The handle stays open: the MACs use it until the process ends. */
    void *h = dlopen(PYSBX_CRYPTO_SONAME, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        fmt(load_error, sizeof(load_error), "--state-dir needs %s: %s", PYSBX_CRYPTO_SONAME,
            dlerror());
        return;
    }
#define CRYPTO_LOAD(field, symbol)                                                                 \
    if (!(*(void **)&crypto.field = dlsym(h, symbol))) {                                           \
        fmt(load_error, sizeof(load_error), "%s has no %s", PYSBX_CRYPTO_SONAME, symbol);          \
        return;                                                                                    \
    }
    CRYPTO_LOAD(fetch, "EVP_MAC_fetch")
    CRYPTO_LOAD(free, "EVP_MAC_free")
    CRYPTO_LOAD(ctx_new, "EVP_MAC_CTX_new")
    CRYPTO_LOAD(ctx_free, "EVP_MAC_CTX_free")
    CRYPTO_LOAD(ctx_dup, "EVP_MAC_CTX_dup")
    CRYPTO_LOAD(init, "EVP_MAC_init")
    CRYPTO_LOAD(update, "EVP_MAC_update")
    CRYPTO_LOAD(final, "EVP_MAC_final")
    CRYPTO_LOAD(memcmp, "CRYPTO_memcmp")
#undef CRYPTO_LOAD
}

/* The key's HMAC-SHA256 as keyed (no data yet): each MAC starts from a
 * copy of it, so that the key schedule is made once. */
struct mac_key {
    EVP_MAC *alg;
    EVP_MAC_CTX *keyed;
};

struct mac {
    EVP_MAC_CTX *ctx;
};

int mac_key_new(const uint8_t key[MAC_KEY_BYTES], struct mac_key **out, char *why, size_t cap)
{
    char digest[] = "SHA256";
    OSSL_PARAM params[] = {OSSL_PARAM_utf8_string(OSSL_MAC_PARAM_DIGEST, digest, 0),
                           OSSL_PARAM_END};
    struct mac_key *k = NULL;

    *out = NULL;
    pthread_once(&loaded, load);
    if (load_error[0])
        return errmsg(why, cap, -ENOENT, "%s", load_error);
    if (!(k = calloc(1, sizeof(*k))))
        return errmsg(why, cap, -ENOMEM, "out of memory");
    if (!(k->alg = crypto.fetch(NULL, "HMAC", NULL)) || !(k->keyed = crypto.ctx_new(k->alg)) ||
        !crypto.init(k->keyed, key, MAC_KEY_BYTES, params)) {
        mac_key_free(k);
        return errmsg(why, cap, -EIO, "%s has no HMAC-SHA256", PYSBX_CRYPTO_SONAME);
    }
    *out = k;
    return 0;
}

void mac_key_free(struct mac_key *k)
{
    if (!k)
        return;
    if (k->keyed)
        crypto.ctx_free(k->keyed);
    if (k->alg)
        crypto.free(k->alg);
    free(k);
}

struct mac *mac_begin(const struct mac_key *k, const char *domain)
{
    struct mac *m = calloc(1, sizeof(*m));

    if (m && !(m->ctx = crypto.ctx_dup(k->keyed))) {
        free(m);
        m = NULL;
    }
    /* With its NUL: no domain is the start of another's data. */
    if (m)
        mac_update(m, domain, strlen(domain) + 1);
    return m;
}

void mac_update(struct mac *m, const void *data, size_t len)
{
    /* It fails only for a context that is not initialised, which a copy of
     * the keyed one always is. */
    (void)crypto.update(m->ctx, data, len);
}

int mac_end(struct mac *m, uint8_t out[MAC_BYTES])
{
    size_t n = 0;
    int ok = crypto.final(m->ctx, out, &n, MAC_BYTES) && n == MAC_BYTES;

    mac_abandon(m);
    return ok ? 0 : -EIO;
}

void mac_abandon(struct mac *m)
{
    if (!m)
        return;
    crypto.ctx_free(m->ctx);
    free(m);
}

bool mac_equal(const uint8_t a[MAC_BYTES], const uint8_t b[MAC_BYTES])
{
    return crypto.memcmp(a, b, MAC_BYTES) == 0;
}
