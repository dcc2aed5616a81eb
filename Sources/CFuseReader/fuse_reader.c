/* One reader of /dev/fuse at a time, spinning before it sleeps.

   With libfuse's multi-threaded loop every idle worker blocks in read(/dev/fuse), and the
   kernel wakes one of them for each request: on a virtual machine that sleep and wake-up was
   most of the daemon's cost for small requests (untar sends about 13 per file, one at a time,
   each waiting for the previous reply). Here a worker must hold the reader token to read. It
   keeps the token while it handles a short request, so when it comes back for the next one it
   polls the device without blocking for the spin time (catching the request the caller sends
   right after getting its reply) before it blocks in poll(2). Before a request that may take
   long (`coffer_fuse_request_may_take_long`) it hands the token on as it reads it, so another
   worker reads meanwhile. FLUSH, RELEASE and reads and writes of up to 128 KiB are usually
   short (closing, reading or writing a small file): their handler asks the filesystem and hands
   the token on itself (`coffer_fuse_reader_hand_on`) when this one may block.

   A short request can still block (a lock held by a sync or by the CLI): then every other
   request would wait behind it. Waiting workers therefore wake every stall time while requests
   flow, and one that finds the holder inside a single request for longer than the stall time
   takes the token over and reads. Once a look finds no request served and the holder waiting
   for the next one, they sleep until the holder starts handling one or hands the token on
   (`kicks`), so an idle mount wakes no thread at all.

   Invariant: the semaphore is posted exactly when no worker holds the token. */

#define _GNU_SOURCE /* sem_clockwait */
#define FUSE_USE_VERSION 312
#include "coffer_fuse_reader.h"

#include <errno.h>
#include <fcntl.h>
#include <fuse_lowlevel.h>
#include <linux/fuse.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <semaphore.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

struct coffer_fuse_reader {
    int fd;
    sem_t token;
    pthread_mutex_t lock;
    long spin_ns;
    long stall_ns;
    pthread_t holder;     /* the worker holding the token, valid while `held` */
    int held;
    long handling_since;  /* when the holder began its current request; 0 while it reads */
    unsigned long served; /* requests read, the waiters' sign that the mount is busy */
    unsigned long takeovers;
    pthread_cond_t busy;  /* broadcast when `kicks` moves */
    unsigned long kicks;  /* the holder began handling a request, or handed the token on */
    int idle_waiters;     /* workers asleep on `busy` */
};

/* libfuse's custom I/O callbacks receive the descriptor and the session's userdata (the
   filesystem's), not ours, so each session's reader is found by its descriptor (tests run
   several sessions in one process). */
#define MAX_READER_FD 4096
static _Atomic(struct coffer_fuse_reader *) readers[MAX_READER_FD];

static struct coffer_fuse_reader *reader_for(int fd) {
    return fd >= 0 && fd < MAX_READER_FD ? atomic_load_explicit(&readers[fd], memory_order_acquire) : NULL;
}

static long monotonic_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (long)t.tv_sec * 1000000000L + t.tv_nsec;
}

static int holds_token(const struct coffer_fuse_reader *r) {
    return r->held && pthread_equal(r->holder, pthread_self());
}

int coffer_fuse_request_may_take_long(const void *buf, size_t n) {
    const struct fuse_in_header *h = buf;
    if (n < sizeof(*h)) return 1;
    const char *body = (const char *)buf + sizeof(*h);
    size_t length = n - sizeof(*h);
    switch (h->opcode) {
    case FUSE_SETATTR: { /* long only if it truncates */
        struct fuse_setattr_in in;
        if (length < sizeof(in.valid)) return 1;
        memcpy(&in.valid, body + offsetof(struct fuse_setattr_in, valid), sizeof(in.valid));
        return (in.valid & FATTR_SIZE) != 0;
    }
    case FUSE_WRITE:
        /* The data follows the header; tar writes each small file in one to four records, and
           handing the reading on before each (waking another worker, then waiting to read
           again) cost more than the write. */
        return length > sizeof(struct fuse_write_in) + COFFER_FUSE_SHORT_IO;
    case FUSE_READ: { /* md5sum of a tree sends one small READ per file and waits for it */
        struct fuse_read_in in;
        if (length < offsetof(struct fuse_read_in, size) + sizeof(in.size)) return 1;
        memcpy(&in.size, body + offsetof(struct fuse_read_in, size), sizeof(in.size));
        return in.size > COFFER_FUSE_SHORT_IO;
    }
    case FUSE_FSYNC:
    case FUSE_FSYNCDIR:
    case FUSE_IOCTL:
    case FUSE_POLL:
    case FUSE_FALLOCATE:
    case FUSE_COPY_FILE_RANGE:
        return 1;
    default:
        return 0;
    }
}

/* Wakes the workers asleep while the mount was idle. Called with `r->lock` held. */
static void kick_locked(struct coffer_fuse_reader *r) {
    if (r->idle_waiters > 0) {
        r->kicks += 1;
        pthread_cond_broadcast(&r->busy);
    }
}

/* Gives the token up if this worker holds it. Called with `r->lock` held. */
static void give_up_locked(struct coffer_fuse_reader *r) {
    if (holds_token(r)) {
        r->held = 0;
        r->handling_since = 0;
        sem_post(&r->token);
        kick_locked(r);
    }
}

/* libfuse cancels its workers at exit, possibly while one sleeps on `busy`, which it leaves
   holding the lock. */
static void unlock_on_cancel(void *lock) { pthread_mutex_unlock(lock); }

void coffer_fuse_reader_hand_on(struct coffer_fuse_reader *r) {
    if (r == NULL) return;
    pthread_mutex_lock(&r->lock);
    give_up_locked(r);
    pthread_mutex_unlock(&r->lock);
}

static void become_holder_locked(struct coffer_fuse_reader *r) {
    r->holder = pthread_self();
    r->held = 1;
    r->handling_since = 0;
}

/* Makes this worker the token holder: at once if it kept the token, else when the holder
   hands it on, or by taking it over from a holder stuck in one request for the stall time.
   Returns 0, or -1 with errno (EINTR: the loop's wake signal at exit, which libfuse checks). */
static int take_token(struct coffer_fuse_reader *r) {
    pthread_mutex_lock(&r->lock);
    if (holds_token(r)) {
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
            become_holder_locked(r);
            pthread_mutex_unlock(&r->lock);
            return 0;
        }
        if (errno != ETIMEDOUT) return -1;
        pthread_mutex_lock(&r->lock);
        long since = r->handling_since;
        if (r->held && since != 0 && monotonic_ns() - since >= r->stall_ns) {
            /* The holder is stuck in one short request: read in its place. The semaphore stays
               taken; the old holder, back from its request, finds it no longer holds the token
               and waits. */
            become_holder_locked(r);
            r->takeovers += 1;
            pthread_mutex_unlock(&r->lock);
            return 0;
        }
        if (r->served == seen && r->held && since == 0) {
            /* Idle: nothing served since the last look and the holder waits for a request.
               Sleep until it starts one (then watch it for a stall) or hands the token on. */
            unsigned long kicks = r->kicks;
            r->idle_waiters += 1;
            pthread_cleanup_push(unlock_on_cancel, &r->lock);
            while (r->kicks == kicks) pthread_cond_wait(&r->busy, &r->lock);
            pthread_cleanup_pop(0);
            r->idle_waiters -= 1;
        }
        /* Requests flowing (or one just begun): look again soon. */
        wait_ns = r->stall_ns;
        seen = r->served;
        pthread_mutex_unlock(&r->lock);
    }
}

/* Gives the token up after a failed read, keeping the read's errno for libfuse. */
static ssize_t fail(struct coffer_fuse_reader *r, int error) {
    coffer_fuse_reader_hand_on(r);
    errno = error;
    return -1;
}

static ssize_t read_request(int fd, void *buf, size_t len, void *userdata) {
    (void)userdata;
    struct coffer_fuse_reader *r = reader_for(fd);
    if (r == NULL) return read(fd, buf, len); /* not installed: cannot happen */
    if (take_token(r) != 0) return -1;
    long deadline = monotonic_ns() + r->spin_ns;
    for (;;) {
        ssize_t n = read(fd, buf, len);
        if (n >= 0) {
            int may_take_long = coffer_fuse_request_may_take_long(buf, (size_t)n);
            pthread_mutex_lock(&r->lock);
            r->served += 1;
            if (may_take_long) {
                give_up_locked(r);
            } else if (holds_token(r)) {
                r->handling_since = monotonic_ns();
                kick_locked(r);
            }
            pthread_mutex_unlock(&r->lock);
            return n;
        }
        /* ENODEV at unmount, EINTR, ENOENT (an interrupted request): let others see it too. */
        if (errno != EAGAIN) return fail(r, errno);
        if (monotonic_ns() < deadline) {
            /* Give the core to whatever else is runnable (sealing chunks, the caller itself);
               returns at once when nothing is. */
            sched_yield();
            continue;
        }
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, -1) < 0 && errno == EINTR) return fail(r, EINTR);
    }
}

/* libfuse takes custom reading only together with custom writing. */
static ssize_t write_reply(int fd, struct iovec *iov, int count, void *userdata) {
    (void)userdata;
    return writev(fd, iov, count);
}

static const struct fuse_custom_io reader_io = {.writev = write_reply, .read = read_request};

int coffer_fuse_reader_install(struct fuse_session *se, long spin_ns, long stall_ns,
                               struct coffer_fuse_reader **reader) {
    *reader = NULL;
    int fd = fuse_session_fd(se);
    if (fd < 0 || fd >= MAX_READER_FD) return -EBADF;
    struct coffer_fuse_reader *r = calloc(1, sizeof(*r));
    if (r == NULL) return -ENOMEM;
    if (sem_init(&r->token, 0, 1) != 0) {
        int e = errno;
        free(r);
        return -e;
    }
    if (pthread_mutex_init(&r->lock, NULL) != 0) {
        sem_destroy(&r->token);
        free(r);
        return -ENOMEM;
    }
    if (pthread_cond_init(&r->busy, NULL) != 0) {
        pthread_mutex_destroy(&r->lock);
        sem_destroy(&r->token);
        free(r);
        return -ENOMEM;
    }
    r->fd = fd;
    r->spin_ns = spin_ns;
    r->stall_ns = stall_ns > 0 ? stall_ns : 1;
    int flags = fcntl(fd, F_GETFL);
    int rc = flags < 0 || fcntl(fd, F_SETFL, flags | O_NONBLOCK) != 0 ? -errno : 0;
    if (rc == 0) {
        atomic_store_explicit(&readers[fd], r, memory_order_release);
        rc = fuse_session_custom_io(se, &reader_io, fd);
        if (rc != 0) fcntl(fd, F_SETFL, flags);
    }
    if (rc != 0) {
        coffer_fuse_reader_free(r);
        return rc;
    }
    *reader = r;
    return 0;
}

void coffer_fuse_reader_free(struct coffer_fuse_reader *r) {
    if (r == NULL) return;
    struct coffer_fuse_reader *expected = r;
    atomic_compare_exchange_strong(&readers[r->fd], &expected, NULL);
    sem_destroy(&r->token);
    pthread_cond_destroy(&r->busy);
    pthread_mutex_destroy(&r->lock);
    free(r);
}

unsigned long coffer_fuse_reader_takeovers(struct coffer_fuse_reader *r) {
    if (r == NULL) return 0;
    pthread_mutex_lock(&r->lock);
    unsigned long n = r->takeovers;
    pthread_mutex_unlock(&r->lock);
    return n;
}
