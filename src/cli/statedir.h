/*
 * The state directory of `pysbx serve --state-dir DIR`: the images of
 * hibernated sessions, signed with a key only the server holds, kept
 * between their cells and across restarts of the server, within a cap.
 *
 *   DIR/            0700, the server's own
 *     lock          held (flock) by the one server that uses DIR
 *     key           32 random bytes, 0600: the HMAC-SHA256 key, made at first use
 *     images/       0700
 *       HEX.img     a session's image: a head, the library's image, a tail
 *       HEX.lost    a tombstone: why a session's image is gone (its next cell is told)
 *       HEX.new     an image being written; one left by a crash is removed at start
 *
 * HEX is a MAC of the tenant and the session's name: a file's name says
 * whose it is to no one without the key. The head holds the build the
 * image is bound to, the tenant (a MAC of its token, never the token), the
 * name and what a listing shows; the tail the image's length and the MAC,
 * under the key, of the head, the library's image and that length. An
 * image is checked whole, streaming, before anything of it is restored:
 * one changed, cut short, of another tenant, of another session, made with
 * another key or by another build is refused, and its file removed.
 *
 * What the server keeps of an image in memory is one index entry. The
 * images' bytes together never pass the cap: writing one drops the oldest
 * (each leaves a tombstone), and an image that alone would pass it is not
 * kept.
 */
#ifndef PYSBX_STATEDIR_H
#define PYSBX_STATEDIR_H

#include "pysbx.h"
#include "reqjson.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define STATE_TENANT_BYTES 32
/* The least --state-max-bytes: a small state's image is about 9 MB. */
#define STATE_MIN_BYTES (16ULL << 20)
/* Tombstones kept at most (a few hundred bytes each); the oldest go. */
#define STATE_MAX_TOMBSTONES 4096u

struct state_dir;

struct state_dir_config {
    const char *path;
    uint64_t max_bytes; /* the images' bytes together */
    /* What, beside PYSBX_VERSION and this program's own files, makes the
     * template: an image is bound to all of it. NULL: none (the template:
     * the library's default). */
    const char *template_path;
    const char *const *packages;
    const char *const *module_dirs;
};

/* Opens (or makes) the directory, takes its lock, reads (or makes) its
 * key, and indexes the images there. Returns 0 with *out, or -errno with
 * why in |why|. */
int state_dir_open(const struct state_dir_config *c, struct state_dir **out, char *why, size_t cap);
/* NULL is accepted. The images stay. */
void state_dir_close(struct state_dir *d);

/* A tenant's id: a MAC under the key of |kind| ("http-token", ...) and
 * |secret| (a token; may be empty). Returns 0 or -ENOMEM. */
int state_dir_tenant(struct state_dir *d, const char *kind, const char *secret, size_t len,
                     uint8_t out[STATE_TENANT_BYTES]);

/* What the server knows of a hibernated session (its image's head). */
struct state_session {
    char name[SESSION_NAME_MAX + 1];
    uint64_t cells;        /* answered before it was hibernated */
    uint64_t memory_bytes; /* its memory limit */
    int64_t max_rss_kb;    /* its last cell's peak */
    double idle_since;     /* when its last cell ended, seconds since the epoch */
    uint64_t bytes;        /* its image's file */
};

enum state_kind { STATE_NONE, STATE_IMAGE, STATE_LOST };

/* What DIR holds for |tenant|'s session |name|: nothing, an image (*info
 * from its head, not yet checked) or a tombstone (its reason in |why|). */
enum state_kind state_dir_find(struct state_dir *d, const uint8_t *tenant, const char *name,
                               struct state_session *info, char *why, size_t cap);

/* Writes |s|'s image with |save| (the backend's session_save), as |info|
 * says of it, and indexes it, replacing a tombstone of the name; the
 * oldest images are dropped to keep within the cap. |s| goes on either
 * way. Returns 0 with *bytes and *ticket (for state_dir_release, should
 * the session turn out to be closed meanwhile), or a negative errno with
 * |err| (sandbox_unavailable: not written, past the cap alone, or another
 * image of the name is being written). */
int state_dir_save(struct state_dir *d, const uint8_t *tenant, const struct state_session *info,
                   int (*save)(struct sbx_session *s, int fd, struct sbx_error *err),
                   struct sbx_session *s, uint64_t *bytes, uint64_t *ticket, struct sbx_error *err);

/* Opens |tenant|'s image of |name| and checks all of it. Returns a
 * descriptor at the library's image (*info from the checked head, *ticket
 * for state_dir_release; the image is not dropped meanwhile), or a
 * negative errno with |err|: -ENOENT when there is none; session_lost,
 * saying why, when it is refused (its file is then removed). */
int state_dir_take(struct state_dir *d, const uint8_t *tenant, const char *name,
                   struct state_session *info, uint64_t *ticket, struct sbx_error *err);
/* After state_dir_take: |keep| the image (it could not be restored now:
 * the sandbox was busy), or forget it (restored, or refused: its file
 * goes); after state_dir_save, forget it. Nothing happens when it was
 * dropped meanwhile. */
void state_dir_release(struct state_dir *d, uint64_t ticket, bool keep);

/* Removes |tenant|'s image or tombstone of |name| (the session is closed,
 * or its tombstone was said). Returns whether there was one. */
bool state_dir_drop(struct state_dir *d, const uint8_t *tenant, const char *name);
/* Leaves a tombstone for |tenant|'s session |name| saying |why| (in place
 * of whatever DIR held for it): its next cell is answered session_lost,
 * with |why|, instead of starting afresh. */
void state_dir_bury(struct state_dir *d, const uint8_t *tenant, const char *name, const char *why);

/* |tenant|'s hibernated sessions, at most |cap| into |out|; returns how
 * many there are. */
size_t state_dir_list(struct state_dir *d, const uint8_t *tenant, struct state_session *out,
                      size_t cap);
/* Every tenant's: images and their bytes. */
void state_dir_totals(struct state_dir *d, uint64_t *images, uint64_t *bytes);

#endif
