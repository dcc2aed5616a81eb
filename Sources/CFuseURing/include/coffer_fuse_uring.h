#ifndef COFFER_FUSE_URING_H
#define COFFER_FUSE_URING_H

/* FUSE over io_uring (Linux 6.14+), which libfuse 3.14 does not speak.

   With /dev/fuse, a request from a process on one CPU wakes a daemon thread
   that usually sleeps on the other, and its reply wakes the caller back
   across CPUs; on a virtual machine each of those wake-ups goes through the
   host. Over io_uring the kernel keeps one queue per CPU and hands a request
   to a daemon thread registered on the caller's own CPU, so the caller, the
   handler and the reply stay on one core.

   This transport sits beside libfuse: libfuse still reads INIT, FORGET and
   INTERRUPT from /dev/fuse and still parses and dispatches every request
   (`fuse_session_process_buf`); here are only the rings, the threads that
   wait on them, and the routing of replies back into the ring entry their
   request came in. It is used only if the kernel offers it in INIT (the
   fuse module's `enable_uring` parameter) and the session runs Coffer's
   spinning reader, whose INIT reply carries the grant (CFuse/shim.h);
   `reader` below is that reader's `struct coffer_reader_state`. */

#include <stddef.h>
#include <stdint.h>

struct fuse_session;
struct coffer_fuse_uring;

/* Prepares the rings and their threads (`per_queue` per possible CPU, each
   with one ring entry) and attaches them to the session's reader state, so
   the INIT reply can grant FUSE over io_uring. Call after
   `coffer_fuse_use_spinning_reader` and before the session loop runs.
   Returns NULL (the session then stays on /dev/fuse) if io_uring cannot be
   set up here. */
struct coffer_fuse_uring *coffer_fuse_uring_prepare(struct fuse_session *se,
                                                    void *reader,
                                                    int per_queue);

/* Stops and joins the threads and frees everything. Call after the session
   loop has returned and the filesystem is unmounted, before the session is
   destroyed. NULL is allowed. */
void coffer_fuse_uring_stop(struct coffer_fuse_uring *uring);

/* Whether the INIT reply granted FUSE over io_uring (the kernel offered it). */
int coffer_fuse_uring_granted(struct coffer_fuse_uring *uring);

/* Requests served through the rings so far. */
unsigned long coffer_fuse_uring_served(struct coffer_fuse_uring *uring);

#endif
