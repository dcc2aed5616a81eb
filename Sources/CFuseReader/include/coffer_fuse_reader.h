#ifndef COFFER_FUSE_READER_H
#define COFFER_FUSE_READER_H

#include <stddef.h>

/* One reader of /dev/fuse at a time, spinning before it sleeps (fuse_reader.c says how and
   why). Opaque: Swift sees only these calls. */
struct fuse_session;
struct coffer_fuse_reader;

/* Reads and writes of up to this many bytes are short requests: the reader keeps reading
   after them unless the handler hands reading on (`coffer_fuse_reader_hand_on`). */
enum { COFFER_FUSE_SHORT_IO = 128 * 1024 };

/* Installs the reader on a mounted session before its loop runs. `spin_ns`: how long a worker
   back from a short request polls the device before it sleeps; `stall_ns`: how long one short
   request may keep the reader before a waiting worker takes over. Returns 0 and sets `*reader`,
   or a negative errno (the session then keeps libfuse's own reader). */
int coffer_fuse_reader_install(struct fuse_session *se, long spin_ns, long stall_ns,
                               struct coffer_fuse_reader **reader);

/* Frees the reader once the session's loop has returned (every worker joined). */
void coffer_fuse_reader_free(struct coffer_fuse_reader *reader);

/* Called by a request's handler on its worker thread before work that may block: another
   worker reads meanwhile. Does nothing if this worker no longer holds the right to read, or
   `reader` is NULL. */
void coffer_fuse_reader_hand_on(struct coffer_fuse_reader *reader);

/* How many times a waiting worker took reading over from one stuck in a short request. */
unsigned long coffer_fuse_reader_takeovers(struct coffer_fuse_reader *reader);

/* Whether the raw request `buf` of `n` bytes may take long enough that another worker should
   read meanwhile (exposed for tests). */
int coffer_fuse_request_may_take_long(const void *buf, size_t n);

#endif
