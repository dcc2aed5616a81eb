#ifndef COFFER_CFUSE_SHIM_H
#define COFFER_CFUSE_SHIM_H

/* 3.12 is the newest API level that changes anything in libfuse 3.14's
   headers: it brings the opaque loop configuration, the only way to bound
   the worker thread count. Rename flags, readdirplus and notifications are
   all older. */
#define FUSE_USE_VERSION 312

#include <fuse_lowlevel.h>
#include <errno.h>
#include <fcntl.h>
#include <malloc.h> /* mallopt, for the daemon's allocator setting (MountService) */
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/xattr.h>
#include <unistd.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <semaphore.h>
#include <stdlib.h>
#include <sys/uio.h>
#include <time.h>

/* Swift does not see function-like macros, and several libfuse entry points
   are macros or versioned symbols, so they are re-exported as inline
   functions. Bitfields of fuse_file_info get accessors for the same reason:
   importing them through Swift's synthesized accessors depends on the
   importer's bitfield support, and these few lines remove the doubt. */

static inline struct fuse_args coffer_fuse_args_init(int argc, char **argv) {
    struct fuse_args args = FUSE_ARGS_INIT(argc, argv);
    return args;
}

static inline int coffer_fuse_session_loop_mt(struct fuse_session *se,
                                              unsigned int max_threads,
                                              int max_idle_threads,
                                              unsigned int clone_fd) {
    struct fuse_loop_config *config = fuse_loop_cfg_create();
    if (config == NULL) {
        return -ENOMEM;
    }
    fuse_loop_cfg_set_clone_fd(config, clone_fd);
    fuse_loop_cfg_set_max_threads(config, max_threads);
    /* Negative keeps libfuse's default: idle threads are never reaped. */
    if (max_idle_threads >= 0) {
        fuse_loop_cfg_set_idle_threads(config, (unsigned int)max_idle_threads);
    }
    int result = fuse_session_loop_mt(se, config);
    fuse_loop_cfg_destroy(config);
    return result;
}

/* fuse_file_info accessors. */
static inline uint64_t coffer_fi_get_fh(const struct fuse_file_info *fi) { return fi->fh; }
static inline void coffer_fi_set_fh(struct fuse_file_info *fi, uint64_t fh) { fi->fh = fh; }
static inline int coffer_fi_get_flags(const struct fuse_file_info *fi) { return fi->flags; }
static inline uint64_t coffer_fi_get_lock_owner(const struct fuse_file_info *fi) { return fi->lock_owner; }
static inline int coffer_fi_get_writepage(const struct fuse_file_info *fi) { return fi->writepage; }
static inline int coffer_fi_get_flush(const struct fuse_file_info *fi) { return fi->flush; }
static inline void coffer_fi_set_direct_io(struct fuse_file_info *fi, int on) { fi->direct_io = on ? 1 : 0; }
static inline void coffer_fi_set_keep_cache(struct fuse_file_info *fi, int on) { fi->keep_cache = on ? 1 : 0; }
static inline void coffer_fi_set_nonseekable(struct fuse_file_info *fi, int on) { fi->nonseekable = on ? 1 : 0; }
static inline void coffer_fi_set_cache_readdir(struct fuse_file_info *fi, int on) { fi->cache_readdir = on ? 1 : 0; }
static inline void coffer_fi_set_noflush(struct fuse_file_info *fi, int on) { fi->noflush = on ? 1 : 0; }

/* Constants Swift cannot import (function-like or computed macros). */
static inline int coffer_utime_now(void) { return UTIME_NOW; }
static inline int coffer_utime_omit(void) { return UTIME_OMIT; }
static inline int coffer_sigrtmin(void) { return SIGRTMIN; }
static inline unsigned int coffer_rename_noreplace(void) { return 1u << 0; }
static inline unsigned int coffer_rename_exchange(void) { return 1u << 1; }

/* glibc only declares renameat2 under _GNU_SOURCE, which the Swift Glibc
   module does not guarantee; tests need it to exercise rename flags. */
#include <sys/syscall.h>
static inline int coffer_renameat2(int olddirfd, const char *oldpath,
                                   int newdirfd, const char *newpath,
                                   unsigned int flags) {
    return (int)syscall(SYS_renameat2, olddirfd, oldpath, newdirfd, newpath, flags);
}

/* Pins the calling thread to one CPU (tests that send requests from every CPU); the
   glibc wrapper needs _GNU_SOURCE. */
static inline int coffer_pin_thread_to_cpu(int cpu) {
    unsigned long mask[16] = { 0 };
    if (cpu < 0 || cpu >= 1024) { errno = EINVAL; return -1; }
    mask[cpu / 64] |= 1UL << (cpu % 64);
    return (int)syscall(SYS_sched_setaffinity, 0, sizeof(mask), mask);
}

/* One reader at a time, spinning before it sleeps.

   With libfuse's multi-threaded loop every idle worker blocks in
   read(/dev/fuse), and the kernel wakes one of them for each request: on a
   virtual machine that sleep and wake-up was most of the daemon's cost for
   small requests (untar sends about 13 per file, one at a time). Here a
   worker must hold the reader token to read. It keeps the token while it
   handles a short request, so when it comes back for the next one it polls
   the device without blocking for a spin time (catching the request the
   caller sends right after getting its reply) before it blocks in poll(2).
   Before a request that may take long (a read or write of more than 128 KiB,
   fsync, a truncate) it hands the token on, so another worker reads
   meanwhile. FLUSH, RELEASE and small reads and writes are usually short
   (closing, reading or writing a small file): the handler decides, and hands
   the token on itself with `coffer_fuse_reader_hand_on` when it may block.

   A short request can still block (a lock held by a sync or by the CLI):
   then every other request would wait behind it. Waiting workers therefore
   wake now and then, and one that finds the holder inside a single request
   for longer than the stall time takes the token over and reads. They wake
   every stall time while requests flow and once a second when the mount is
   idle, so a stall is broken within that.

   The threads of one session share its state. Who holds the token is
   recorded there as a thread id, not in a thread-local flag: this header's
   functions are emitted separately into each object file that calls them,
   each with its own copy of any static, so the hand-on (called from another
   Swift file than the reader) would see a different flag. Invariant: the
   semaphore is posted exactly when no worker holds the token. */
struct coffer_reader_state {
    sem_t token;
    pthread_mutex_t lock;
    long spin_ns;
    long stall_ns;
    unsigned long holder;  /* pthread_t of the worker holding the token, or 0 */
    long handling_since;   /* when the holder began its current request; 0 while it reads */
    unsigned long served;  /* requests read, the waiters' sign that the mount is busy */
    unsigned long takeovers;
    /* FUSE_HANDLE_KILLPRIV_V2 (see `coffer_note_request`). Written only while
       INIT is handled, before the kernel sends any other request. */
    int grant_killpriv_v2;    /* asked for by the session */
    int killpriv_v2_offered;  /* the kernel's INIT offered it */
    uint64_t init_unique;
    int killpriv_v2;          /* granted in the INIT reply */
    pthread_key_t kill_key;   /* per worker: the request it read asks to kill suid/sgid */
    /* FUSE over io_uring (CFuseURing), attached before the loop runs. */
    void *uring;              /* the transport, or NULL */
    int uring_offered;        /* the kernel's INIT offered it */
    int uring_granted;        /* granted in the INIT reply */
    /* Sends a reply into the ring entry its request came in; -2 if the
       request did not come through a ring. */
    ssize_t (*uring_reply)(void *uring, struct iovec *iov, int count);
    /* Called once the INIT reply is written (or failed): starts or ends the
       rings; `payload` is the largest request or reply body negotiated. */
    void (*uring_init_replied)(void *uring, int granted, size_t payload);
};

/* Each session's state, by its /dev/fuse descriptor (tests run several
   sessions in one process). Function-local statics: Swift's importer emits
   the functions of this header but not its file-scope variables. */
#define COFFER_MAX_READER_FD 4096
static inline struct coffer_reader_state **coffer_readers(void) {
    static struct coffer_reader_state *by_fd[COFFER_MAX_READER_FD];
    return by_fd;
}

static inline struct coffer_reader_state *coffer_reader(int fd) {
    return fd >= 0 && fd < COFFER_MAX_READER_FD ? coffer_readers()[fd] : NULL;
}

static inline long coffer_monotonic_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (long)t.tv_sec * 1000000000L + t.tv_nsec;
}

/* The kernel ABI's request header (linux/fuse.h, struct fuse_in_header),
   declared here because that header clashes with libfuse's. */
struct coffer_fuse_in_header {
    uint32_t len;
    uint32_t opcode;
    uint64_t unique;
    uint64_t nodeid;
    uint32_t uid;
    uint32_t gid;
    uint32_t pid;
    uint16_t total_extlen;
    uint16_t padding;
};

/* Writes up to this many bytes count as short requests; the handler hands
   the reading on itself if one may block (`FileSystemOperations.writeMayTakeLong`). */
#define COFFER_FUSE_SHORT_WRITE (128 * 1024)
/* The kernel's struct fuse_write_in, which follows the header of a WRITE. */
#define COFFER_FUSE_WRITE_IN_SIZE 40
/* Reads of up to this many bytes count as short requests too; the handler
   hands on if one may block (`FileSystemOperations.readMayTakeLong`). md5sum
   of a tree after dropping caches sends OPEN and one READ per small file and
   waits for each: 2.67-2.76 -> 2.24-2.35 s in three A/B pairs. The size is
   at byte 16 of struct fuse_read_in. */
#define COFFER_FUSE_SHORT_READ (128 * 1024)

/* Whether handling this request may take long enough that another worker
   should read meanwhile. Opcodes are the kernel's (stable ABI). WRITE of up
   to 128 KiB is short: tar extracting a tree writes each small file in one
   to four records, and handing the reading on before each (waking another
   worker, then waiting to read again) cost more than the write, once the
   group-commit thread yielded its CPU (untar 5.28-5.49 -> 4.82-4.92 s in four A/B
   pairs; before that it was slower, see docs/PERFORMANCE.md). GETXATTR was
   on this list while the kernel asked for security.capability before every
   write (the hand-on had the next reader polling when the write came); with
   FUSE_HANDLE_KILLPRIV_V2 it asks only before a file's first write and each
   chown, and as a short request untar was faster in 8 of 8 A/B pairs (about
   4%). */
static inline int coffer_fuse_request_may_take_long(const void *buf, ssize_t n) {
    if (n < (ssize_t)sizeof(struct coffer_fuse_in_header)) return 1;
    const struct coffer_fuse_in_header *h = (const struct coffer_fuse_in_header *)buf;
    switch (h->opcode) {
    case 4: { /* SETATTR: long only if it truncates (FATTR_SIZE in `valid`) */
        if (n < (ssize_t)(sizeof(*h) + sizeof(uint32_t))) return 1;
        uint32_t valid;
        memcpy(&valid, (const char *)buf + sizeof(*h), sizeof(valid));
        return (valid & (1u << 3)) != 0;
    }
    case 16: /* WRITE */
        return n > (ssize_t)(sizeof(*h) + COFFER_FUSE_WRITE_IN_SIZE + COFFER_FUSE_SHORT_WRITE);
    case 15: { /* READ */
        uint32_t size;
        if (n < (ssize_t)(sizeof(*h) + 16 + sizeof(size))) return 1;
        memcpy(&size, (const char *)buf + sizeof(*h) + 16, sizeof(size));
        return size > COFFER_FUSE_SHORT_READ;
    }
    case 20: /* FSYNC */
    case 30: /* FSYNCDIR */
    case 39: /* IOCTL */
    case 40: /* POLL */
    case 43: /* FALLOCATE */
    case 47: /* COPY_FILE_RANGE */
        return 1;
    default:
        return 0;
    }
}

/* FUSE_HANDLE_KILLPRIV_V2, which libfuse 3.14 cannot negotiate.

   Without it the kernel clears setuid and setgid itself, and to know whether
   it must, it asks the filesystem for `security.capability` before every
   write and chown and refreshes the attributes before every chown. With it,
   it asks only before a file's first write and each chown and refreshes
   nothing (untar sends about 1.7 requests fewer per file, of about 13); it
   marks the requests that must drop the bits and leaves the dropping to the
   filesystem: WRITE (`write_flags` bit 2) and a truncating SETATTR from a
   caller without CAP_FSETID, every chown of a non-folder (SETATTR `valid`
   bit 11), OPEN and CREATE with O_TRUNC from a caller without CAP_FSETID
   (`open_flags` bit 0; the daemon drops them only if the file existed).
   libfuse parses those bits away, so the reader notes them here, per worker
   (the worker that reads a request handles it), and the bridge asks
   `coffer_fuse_request_kills_suidgid`. The grant is set in
   the INIT reply on its way out, and only if the kernel offered it. */
#define COFFER_FUSE_HANDLE_KILLPRIV_V2 (1u << 28)
/* INIT flags for FUSE over io_uring: FUSE_INIT_EXT says flags2 is there,
   FUSE_OVER_IO_URING is bit 41, bit 9 of flags2. */
#define COFFER_FUSE_INIT_EXT (1u << 30)
#define COFFER_FUSE_OVER_IO_URING_2 (1u << 9)

static inline void coffer_note_request(struct coffer_reader_state *r, const void *buf, ssize_t n) {
    if (n < (ssize_t)sizeof(struct coffer_fuse_in_header)) return;
    const struct coffer_fuse_in_header *h = (const struct coffer_fuse_in_header *)buf;
    const char *body = (const char *)buf + sizeof(*h);
    ssize_t length = n - (ssize_t)sizeof(*h);
    uint32_t word = 0;
    int kill = 0;
    switch (h->opcode) {
    case 26: /* INIT: fuse_init_in.flags, then flags2 */
        if (length >= 16) {
            memcpy(&word, body + 12, sizeof(word));
            r->init_unique = h->unique;
            r->killpriv_v2_offered = r->grant_killpriv_v2 && (word & COFFER_FUSE_HANDLE_KILLPRIV_V2) != 0;
            uint32_t flags2 = 0;
            if (length >= 20) memcpy(&flags2, body + 16, sizeof(flags2));
            r->uring_offered = (word & COFFER_FUSE_INIT_EXT) != 0 && (flags2 & COFFER_FUSE_OVER_IO_URING_2) != 0;
        }
        return;
    case 16: /* WRITE: fuse_write_in.write_flags, FUSE_WRITE_KILL_SUIDGID */
        if (length >= 24) { memcpy(&word, body + 20, sizeof(word)); kill = (word & (1u << 2)) != 0; }
        break;
    case 4: /* SETATTR: fuse_setattr_in.valid, FATTR_KILL_SUIDGID */
        if (length >= 4) { memcpy(&word, body, sizeof(word)); kill = (word & (1u << 11)) != 0; }
        break;
    case 14: /* OPEN: fuse_open_in.open_flags, FUSE_OPEN_KILL_SUIDGID */
        if (length >= 8) { memcpy(&word, body + 4, sizeof(word)); kill = (word & 1u) != 0; }
        break;
    case 35: /* CREATE: fuse_create_in.open_flags */
        if (length >= 16) { memcpy(&word, body + 12, sizeof(word)); kill = (word & 1u) != 0; }
        break;
    default:
        return;
    }
    if (r->killpriv_v2) pthread_setspecific(r->kill_key, kill ? (void *)1 : NULL);
}

/* Whether this reply answers INIT: 1 for a successful one, -1 for a failed one. */
static inline int coffer_is_init_reply(struct coffer_reader_state *r, struct iovec *iov, int count) {
    if (r->init_unique == 0 || count < 1 || iov[0].iov_len < 16) return 0;
    uint64_t unique;
    int32_t error;
    memcpy(&error, (const char *)iov[0].iov_base + 4, sizeof(error));
    memcpy(&unique, (const char *)iov[0].iov_base + 8, sizeof(unique));
    if (unique != r->init_unique) return 0;
    return error == 0 && count >= 2 && iov[1].iov_len >= 36 ? 1 : -1;
}

/* Sets the grants in a successful INIT reply (fuse_init_out after the
   16-byte fuse_out_header in libfuse's first iovec: flags at 12, max_write
   at 20, max_pages at 28, flags2 at 32). Returns the largest request or
   reply body the kernel will use, which a ring entry's buffer must hold. */
static inline size_t coffer_grant_in_init_reply(struct coffer_reader_state *r, struct iovec *iov) {
    char *out = (char *)iov[1].iov_base;
    uint32_t flags, flags2, max_write;
    uint16_t max_pages;
    memcpy(&flags, out + 12, sizeof(flags));
    memcpy(&max_write, out + 20, sizeof(max_write));
    memcpy(&max_pages, out + 28, sizeof(max_pages));
    memcpy(&flags2, out + 32, sizeof(flags2));
    if (r->killpriv_v2_offered) {
        flags |= COFFER_FUSE_HANDLE_KILLPRIV_V2;
        r->killpriv_v2 = 1;
    }
    if (r->uring_offered && r->uring != NULL) {
        flags |= COFFER_FUSE_INIT_EXT;
        flags2 |= COFFER_FUSE_OVER_IO_URING_2;
        r->uring_granted = 1;
    }
    memcpy(out + 12, &flags, sizeof(flags));
    memcpy(out + 32, &flags2, sizeof(flags2));
    /* The kernel's ring payload: max(8 KiB, max_write, max_pages pages),
       max_pages being 32 unless negotiated (FUSE_MAX_PAGES, bit 22). */
    size_t pages = (flags & (1u << 22)) && max_pages > 0 ? max_pages : 32;
    size_t payload = pages * 4096;
    if (payload < max_write) payload = max_write;
    if (payload < 8192) payload = 8192;
    return payload;
}

/* Whether the request this worker is handling asks the filesystem to drop
   setuid and setgid (only ever true once FUSE_HANDLE_KILLPRIV_V2 is granted). */
static inline int coffer_fuse_request_kills_suidgid(struct coffer_reader_state *r) {
    return r != NULL && r->killpriv_v2 && pthread_getspecific(r->kill_key) != NULL;
}

/* Whether FUSE_HANDLE_KILLPRIV_V2 was granted. */
static inline int coffer_fuse_killpriv_v2_granted(struct coffer_reader_state *r) {
    return r != NULL && r->killpriv_v2;
}

/* Gives the token up if this worker holds it. Called with `r->lock` held. */
static inline void coffer_reader_give_up_locked(struct coffer_reader_state *r) {
    if (r->holder == (unsigned long)pthread_self()) {
        r->holder = 0;
        r->handling_since = 0;
        sem_post(&r->token);
    }
}

static inline void coffer_release_reader_token(struct coffer_reader_state *r) {
    pthread_mutex_lock(&r->lock);
    coffer_reader_give_up_locked(r);
    pthread_mutex_unlock(&r->lock);
}

/* Called by a request's handler on its worker thread, before work that may
   block (a large commit, a busy lock): another worker reads meanwhile. Does
   nothing if this worker does not hold the token (it handed it on, or it
   was taken over), or `r` is NULL (the session kept libfuse's reader). */
static inline void coffer_fuse_reader_hand_on(struct coffer_reader_state *r) {
    if (r != NULL) coffer_release_reader_token(r);
}

/* Makes this worker the token holder: at once if it kept the token, else
   when the holder hands it on, or by taking it over from a holder stuck in
   one request for the stall time. Returns 0, or -1 with errno (EINTR: the
   loop's wake signal at exit, which libfuse checks for). */
static inline int coffer_take_reader_token(struct coffer_reader_state *r) {
    unsigned long self = (unsigned long)pthread_self();
    pthread_mutex_lock(&r->lock);
    if (r->holder == self) {
        r->handling_since = 0;
        pthread_mutex_unlock(&r->lock);
        return 0;
    }
    unsigned long seen = r->served;
    pthread_mutex_unlock(&r->lock);
    long wait_ns = r->stall_ns;
    for (;;) {
        struct timespec until;
        clock_gettime(CLOCK_MONOTONIC, &until);
        long ns = until.tv_nsec + wait_ns;
        until.tv_sec += ns / 1000000000L;
        until.tv_nsec = ns % 1000000000L;
        if (sem_clockwait(&r->token, CLOCK_MONOTONIC, &until) == 0) {
            pthread_mutex_lock(&r->lock);
            r->holder = self;
            r->handling_since = 0;
            pthread_mutex_unlock(&r->lock);
            return 0;
        }
        if (errno != ETIMEDOUT) return -1;
        pthread_mutex_lock(&r->lock);
        long since = r->handling_since;
        if (r->holder != 0 && since != 0 && coffer_monotonic_ns() - since >= r->stall_ns) {
            /* The holder is stuck in one short request: read in its place.
               The semaphore stays taken; the old holder, back from its
               request, finds it no longer holds the token and waits. */
            r->holder = self;
            r->handling_since = 0;
            r->takeovers += 1;
            pthread_mutex_unlock(&r->lock);
            return 0;
        }
        /* Requests flowing since the last look: look again soon. */
        wait_ns = r->served != seen ? r->stall_ns : 1000000000L;
        seen = r->served;
        pthread_mutex_unlock(&r->lock);
    }
}

static ssize_t coffer_spinning_read(int fd, void *buf, size_t len, void *userdata) {
    (void)userdata;
    struct coffer_reader_state *r = coffer_reader(fd);
    if (r == NULL) return read(fd, buf, len); /* not installed: cannot happen */
    if (coffer_take_reader_token(r) != 0) return -1;
    long deadline = coffer_monotonic_ns() + r->spin_ns;
    for (;;) {
        ssize_t n = read(fd, buf, len);
        if (n >= 0) {
            coffer_note_request(r, buf, n);
            int may_take_long = coffer_fuse_request_may_take_long(buf, n);
            pthread_mutex_lock(&r->lock);
            r->served += 1;
            if (may_take_long) coffer_reader_give_up_locked(r);
            else if (r->holder == (unsigned long)pthread_self()) r->handling_since = coffer_monotonic_ns();
            pthread_mutex_unlock(&r->lock);
            return n;
        }
        if (errno != EAGAIN) {
            int saved = errno; /* ENODEV at unmount, EINTR, ENOENT: let others see it too */
            coffer_release_reader_token(r);
            errno = saved;
            return -1;
        }
        if (coffer_monotonic_ns() < deadline) {
            /* Give the core to whatever else is runnable (sealing chunks,
               the caller itself); returns at once when nothing is. */
            sched_yield();
            continue;
        }
        struct pollfd p = { .fd = fd, .events = POLLIN };
        if (poll(&p, 1, -1) < 0 && errno == EINTR) {
            coffer_release_reader_token(r);
            errno = EINTR;
            return -1;
        }
    }
}

/* Every reply and notification of the session. A reply to a request that
   came through an io_uring ring goes back into that ring's entry; the INIT
   reply carries the grants. */
static ssize_t coffer_plain_writev(int fd, struct iovec *iov, int count, void *userdata) {
    (void)userdata;
    struct coffer_reader_state *r = coffer_reader(fd);
    if (r == NULL) return writev(fd, iov, count);
    if (r->uring_granted) {
        ssize_t n = r->uring_reply(r->uring, iov, count);
        if (n != -2) return n;
    }
    int init = coffer_is_init_reply(r, iov, count);
    if (init == 0) return writev(fd, iov, count);
    size_t payload = init > 0 ? coffer_grant_in_init_reply(r, iov) : 0;
    ssize_t n = writev(fd, iov, count);
    int saved = errno;
    r->init_unique = 0;
    if (r->uring != NULL) r->uring_init_replied(r->uring, n >= 0 && r->uring_granted, payload);
    if (n < 0) r->uring_granted = 0;
    errno = saved;
    return n;
}

/* Installs the reader above on a mounted session, before its loop runs
   (so it also reads INIT). With `grant_killpriv_v2`, FUSE_HANDLE_KILLPRIV_V2
   is granted if the kernel offers it (see `coffer_note_request`). Returns 0
   and sets `*state` (for `coffer_fuse_reader_hand_on`; valid until the
   session's loop has returned), or a negative errno (the session then keeps
   libfuse's reader). */
static inline int coffer_fuse_use_spinning_reader(struct fuse_session *se, long spin_ns, long stall_ns,
                                                  int grant_killpriv_v2, struct coffer_reader_state **state) {
    *state = NULL;
    int fd = fuse_session_fd(se);
    if (fd < 0 || fd >= COFFER_MAX_READER_FD) return -EBADF;
    /* A previous session's state on this descriptor number is over: its
       loop has returned and joined every worker. */
    struct coffer_reader_state *old = coffer_readers()[fd];
    if (old != NULL) {
        sem_destroy(&old->token);
        pthread_mutex_destroy(&old->lock);
        pthread_key_delete(old->kill_key);
        free(old);
        coffer_readers()[fd] = NULL;
    }
    struct coffer_reader_state *r = (struct coffer_reader_state *)calloc(1, sizeof(*r));
    if (r == NULL) return -ENOMEM;
    if (sem_init(&r->token, 0, 1) != 0) { int e = errno; free(r); return -e; }
    if (pthread_mutex_init(&r->lock, NULL) != 0) { sem_destroy(&r->token); free(r); return -ENOMEM; }
    if (pthread_key_create(&r->kill_key, NULL) != 0) {
        pthread_mutex_destroy(&r->lock); sem_destroy(&r->token); free(r); return -ENOMEM;
    }
    r->grant_killpriv_v2 = grant_killpriv_v2;
    r->spin_ns = spin_ns;
    r->stall_ns = stall_ns > 0 ? stall_ns : 1;
    coffer_readers()[fd] = r;
    static const struct fuse_custom_io io = { .writev = coffer_plain_writev, .read = coffer_spinning_read };
    int flags = fcntl(fd, F_GETFL);
    if (flags < 0 || fcntl(fd, F_SETFL, flags | O_NONBLOCK) != 0) return -errno;
    int rc = fuse_session_custom_io(se, &io, fd);
    if (rc != 0) fcntl(fd, F_SETFL, flags);
    else *state = r;
    return rc;
}

/* How many times a waiting worker took the token over from a stuck holder. */
static inline unsigned long coffer_fuse_reader_takeovers(struct coffer_reader_state *r) {
    if (r == NULL) return 0;
    pthread_mutex_lock(&r->lock);
    unsigned long n = r->takeovers;
    pthread_mutex_unlock(&r->lock);
    return n;
}

#endif
