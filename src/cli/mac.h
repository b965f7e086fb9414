/*
 * HMAC-SHA256 for the images `pysbx serve --state-dir` keeps: OpenSSL's
 * libcrypto, loaded when a state directory is first opened (dlopen), so
 * that no other command pays for its start-up.
 */
#ifndef PYSBX_MAC_H
#define PYSBX_MAC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define MAC_KEY_BYTES 32
#define MAC_BYTES     32

struct mac_key;
struct mac;

/* A key's HMAC-SHA256, ready to start MACs from. Returns 0 with *out (free
 * with mac_key_free), or -errno with why in |why|: libcrypto could not be
 * loaded, or has no HMAC-SHA256. */
int mac_key_new(const uint8_t key[MAC_KEY_BYTES], struct mac_key **out, char *why, size_t cap);
void mac_key_free(struct mac_key *k);

/* A MAC under |k|, begun with |domain| (what the MAC is of, so that a MAC
 * of one kind is never taken for another's). NULL when out of memory. */
struct mac *mac_begin(const struct mac_key *k, const char *domain);
void mac_update(struct mac *m, const void *data, size_t len);
/* The tag into |out|; frees |m|. Returns 0 or -EIO. */
int mac_end(struct mac *m, uint8_t out[MAC_BYTES]);
/* Frees |m| without a tag. NULL is accepted. */
void mac_abandon(struct mac *m);

/* Whether two tags are equal, in time that does not depend on where they
 * differ. */
bool mac_equal(const uint8_t a[MAC_BYTES], const uint8_t b[MAC_BYTES]);

#endif
