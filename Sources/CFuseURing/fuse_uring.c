/* FUSE over io_uring for a libfuse 3.14 session: see coffer_fuse_uring.h.

   The kernel side (fs/fuse/dev_uring.c) keeps one queue per possible CPU and
   sends a request to the queue of the CPU its caller runs on. Every thread
   here owns one io_uring ring and one ring entry (a header buffer and a
   payload buffer registered with the kernel), is pinned to its queue's CPU,
   and waits on its ring. A request arrives as a completion; the thread puts
   header, per-operation header and payload back into the contiguous layout
   /dev/fuse would have given and lets libfuse dispatch it. libfuse writes the
   reply through the session's writev hook (CFuse/shim.h), which calls
   `uring_reply` below: the reply is copied into the entry and committed with
   COMMIT_AND_FETCH, which also hands the entry its next request.

   One entry per thread keeps a slow request (an fsync) from holding others
   that reached the same thread; the kernel gives a queue's requests to any of
   its free entries, the most recently freed first, so a busy caller keeps
   meeting the same warm thread. */

#define _GNU_SOURCE
#include "shim.h"
#include "coffer_fuse_uring.h"

#include <liburing.h>
#include <stdatomic.h>
#include <stdio.h>

/* The kernel ABI (include/uapi/linux/fuse.h, 7.42+), which Debian 12's
   headers predate. */
#define COFFER_URING_HEADER_SZ 128
#define COFFER_URING_OP_IN_SZ 128
struct coffer_uring_ent_in_out {
    uint64_t flags;
    uint64_t commit_id;
    uint32_t payload_sz;
    uint32_t padding;
    uint64_t reserved;
};
struct coffer_uring_req_header {
    char in_out[COFFER_URING_HEADER_SZ];
    char op_in[COFFER_URING_OP_IN_SZ];
    struct coffer_uring_ent_in_out ent_in_out;
};
struct coffer_uring_cmd_req {
    uint64_t flags;
    uint64_t commit_id;
    uint16_t qid;
    uint8_t padding[6];
};
enum { COFFER_URING_CMD_REGISTER = 1, COFFER_URING_CMD_COMMIT_AND_FETCH = 2 };

/* Room in front of the payload for the request header and the
   per-operation header, so a request is made contiguous without moving its
   payload (a write's data). */
#define COFFER_URING_HEADROOM 256

enum { TAG_ENTRY = 1, TAG_QUIT = 2 };
enum { PHASE_WAITING = 0, PHASE_GO = 1, PHASE_QUIT = 2 };

struct coffer_uring_worker {
    struct coffer_fuse_uring *owner;
    int qid;
    pthread_t thread;
    int thread_started;
    struct io_uring ring;
    int ring_ready;
    pthread_mutex_t submit_lock; /* the ring's submission queue */
    struct coffer_uring_req_header *header;
    char *buffer;                /* headroom, then the payload */
    size_t buffer_size;
    struct iovec iov[2];
    _Atomic uint64_t unique;     /* the request being handled, 0 if none */
};

struct coffer_fuse_uring {
    struct fuse_session *se;
    struct coffer_reader_state *reader;
    int fd;
    int queues;
    int count;
    struct coffer_uring_worker *workers;
    pthread_mutex_t lock;
    pthread_cond_t changed;
    int phase;
    size_t payload;
    _Atomic unsigned long served;
};

static _Thread_local struct coffer_uring_worker *current_worker;

/* The kernel's queue count, num_possible_cpus(): the CPUs listed in
   /sys/devices/system/cpu/possible ("0-1", "0-3,8-11"). */
static int possible_cpus(void) {
    FILE *f = fopen("/sys/devices/system/cpu/possible", "r");
    if (f == NULL) return -1;
    char text[256];
    size_t n = fread(text, 1, sizeof(text) - 1, f);
    fclose(f);
    text[n] = 0;
    int total = 0;
    char *p = text;
    while (*p >= '0' && *p <= '9') {
        long a = strtol(p, &p, 10), b = a;
        if (*p == '-') b = strtol(p + 1, &p, 10);
        if (b < a) return -1;
        total += (int)(b - a + 1);
        if (*p == ',') p++;
    }
    return total;
}

static int submit_locked(struct coffer_uring_worker *w, int cmd, uint64_t commit_id, uint64_t tag) {
    struct io_uring_sqe *sqe = io_uring_get_sqe(&w->ring);
    if (sqe == NULL) {
        io_uring_submit(&w->ring);
        sqe = io_uring_get_sqe(&w->ring);
        if (sqe == NULL) return -EBUSY;
    }
    memset(sqe, 0, 128); /* an SQE128 slot */
    if (tag == TAG_QUIT) {
        sqe->opcode = IORING_OP_NOP;
    } else {
        sqe->opcode = IORING_OP_URING_CMD;
        sqe->fd = w->owner->fd;
        sqe->cmd_op = (uint32_t)cmd;
        if (cmd == COFFER_URING_CMD_REGISTER) {
            sqe->addr = (uint64_t)(uintptr_t)w->iov;
            sqe->len = 2;
        }
        struct coffer_uring_cmd_req *req = (struct coffer_uring_cmd_req *)sqe->cmd;
        req->qid = (uint16_t)w->qid;
        req->commit_id = commit_id;
    }
    sqe->user_data = tag;
    int rc;
    do { rc = io_uring_submit(&w->ring); } while (rc == -EINTR);
    return rc < 0 ? rc : 0;
}

static int submit(struct coffer_uring_worker *w, int cmd, uint64_t commit_id, uint64_t tag) {
    pthread_mutex_lock(&w->submit_lock);
    int rc = submit_locked(w, cmd, commit_id, tag);
    pthread_mutex_unlock(&w->submit_lock);
    return rc;
}

/* Answers the entry's request with an error without involving libfuse (a
   request that does not parse). */
static int commit_error(struct coffer_uring_worker *w, uint64_t unique, int error) {
    struct { uint32_t len; int32_t error; uint64_t unique; } out = { 16, -error, unique };
    memcpy(w->header->in_out, &out, sizeof(out));
    w->header->ent_in_out.payload_sz = 0;
    atomic_store(&w->unique, 0);
    return submit(w, COFFER_URING_CMD_COMMIT_AND_FETCH, unique, TAG_ENTRY);
}

/* The session's writev hook for replies (CFuse/shim.h). */
static ssize_t uring_reply(void *ctx, struct iovec *iov, int count) {
    struct coffer_fuse_uring *u = (struct coffer_fuse_uring *)ctx;
    if (count < 1 || iov[0].iov_len < 16) return -2;
    uint64_t unique;
    memcpy(&unique, (const char *)iov[0].iov_base + 8, sizeof(unique));
    if (unique == 0) return -2; /* a notification: /dev/fuse */
    struct coffer_uring_worker *w = current_worker;
    if (w == NULL || atomic_load(&w->unique) != unique) {
        /* Replied from another thread than the one that dispatched it. */
        w = NULL;
        for (int i = 0; i < u->count; i++) {
            if (atomic_load(&u->workers[i].unique) == unique) { w = &u->workers[i]; break; }
        }
        if (w == NULL) return -2; /* came through /dev/fuse */
    }
    size_t room = w->buffer_size - COFFER_URING_HEADROOM, total = 0;
    char *payload = w->buffer + COFFER_URING_HEADROOM;
    for (int i = 1; i < count; i++) {
        if (iov[i].iov_len > room - total) {
            /* Larger than anything the kernel asked for: a bug, not data. */
            int rc = commit_error(w, unique, EIO);
            if (rc < 0) { errno = -rc; return -1; }
            errno = EINVAL;
            return -1;
        }
        memcpy(payload + total, iov[i].iov_base, iov[i].iov_len);
        total += iov[i].iov_len;
    }
    memcpy(w->header->in_out, iov[0].iov_base, 16);
    w->header->ent_in_out.payload_sz = (uint32_t)total;
    atomic_store(&w->unique, 0);
    int rc = submit(w, COFFER_URING_CMD_COMMIT_AND_FETCH, unique, TAG_ENTRY);
    if (rc < 0) { errno = -rc; return -1; }
    return (ssize_t)(16 + total);
}

/* One request, as a completion on the worker's ring. */
static void handle_request(struct coffer_uring_worker *w) {
    struct coffer_fuse_uring *u = w->owner;
    struct coffer_fuse_in_header in;
    memcpy(&in, w->header->in_out, sizeof(in));
    uint32_t payload_size = w->header->ent_in_out.payload_sz;
    size_t room = w->buffer_size - COFFER_URING_HEADROOM;
    size_t header = sizeof(in);
    if (in.len < header || payload_size > room || in.len - header < payload_size ||
        in.len - header - payload_size > COFFER_URING_OP_IN_SZ) {
        commit_error(w, in.unique, EIO);
        return;
    }
    size_t op_size = in.len - header - payload_size;
    char *start = w->buffer + COFFER_URING_HEADROOM - op_size - header;
    memcpy(start, &in, header);
    memcpy(start + header, w->header->op_in, op_size);
    atomic_store(&w->unique, in.unique);
    if (u->reader != NULL) coffer_note_request(u->reader, start, (ssize_t)in.len);
    atomic_fetch_add_explicit(&u->served, 1, memory_order_relaxed);
    struct fuse_buf buf;
    memset(&buf, 0, sizeof(buf));
    buf.size = in.len;
    buf.mem = start;
    fuse_session_process_buf(u->se, &buf);
}

static void *worker_main(void *arg) {
    struct coffer_uring_worker *w = (struct coffer_uring_worker *)arg;
    struct coffer_fuse_uring *u = w->owner;
    /* Signals belong to the session's own threads. */
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, NULL);

    pthread_mutex_lock(&u->lock);
    while (u->phase == PHASE_WAITING) pthread_cond_wait(&u->changed, &u->lock);
    int phase = u->phase;
    size_t payload = u->payload;
    pthread_mutex_unlock(&u->lock);
    if (phase != PHASE_GO) return NULL;

    cpu_set_t cpus;
    CPU_ZERO(&cpus);
    CPU_SET(w->qid, &cpus);
    (void)pthread_setaffinity_np(pthread_self(), sizeof(cpus), &cpus); /* best effort */

    /* A failed allocation registers a too-small payload on purpose: the
       kernel then rejects the registration and falls back to /dev/fuse for
       the whole connection, where a missing queue would hang it. */
    static struct coffer_uring_req_header unused_header;
    static char unused_buffer[COFFER_URING_HEADROOM + 1];
    size_t size = COFFER_URING_HEADROOM + payload;
    w->header = (struct coffer_uring_req_header *)calloc(1, sizeof(*w->header));
    w->buffer = (char *)malloc(size);
    if (w->header != NULL && w->buffer != NULL) {
        w->buffer_size = size;
        w->iov[1].iov_len = payload;
    } else {
        free(w->header);
        free(w->buffer);
        w->header = &unused_header;
        w->buffer = unused_buffer;
        w->iov[1].iov_len = 1;
    }
    w->iov[0].iov_base = w->header;
    w->iov[0].iov_len = sizeof(*w->header);
    w->iov[1].iov_base = w->buffer + COFFER_URING_HEADROOM;
    current_worker = w;

    if (submit(w, COFFER_URING_CMD_REGISTER, 0, TAG_ENTRY) < 0) return NULL;
    int registered = 0, errors = 0;
    for (;;) {
        struct io_uring_cqe *cqe;
        int rc = io_uring_wait_cqe(&w->ring, &cqe);
        if (rc == -EINTR) continue;
        if (rc < 0) break;
        uint64_t tag = cqe->user_data;
        int res = cqe->res;
        io_uring_cqe_seen(&w->ring, cqe);
        if (tag == TAG_QUIT) break;
        if (res < 0) {
            /* ENOTCONN, ECONNABORTED: the connection is gone. Anything
               else loses this entry only: register a new one, a few times. */
            if (res == -ENOTCONN || res == -ECONNABORTED || res == -ECANCELED || res == -ENODEV ||
                res == -EOPNOTSUPP || ++errors > 3 || !registered) break;
            if (submit(w, COFFER_URING_CMD_REGISTER, 0, TAG_ENTRY) < 0) break;
            continue;
        }
        registered = 1;
        handle_request(w);
    }
    atomic_store(&w->unique, 0);
    return NULL;
}

static void uring_init_replied(void *ctx, int granted, size_t payload) {
    struct coffer_fuse_uring *u = (struct coffer_fuse_uring *)ctx;
    pthread_mutex_lock(&u->lock);
    u->payload = payload;
    u->phase = granted ? PHASE_GO : PHASE_QUIT;
    pthread_cond_broadcast(&u->changed);
    pthread_mutex_unlock(&u->lock);
}

static void release(struct coffer_fuse_uring *u) {
    for (int i = 0; i < u->count; i++) {
        struct coffer_uring_worker *w = &u->workers[i];
        if (w->ring_ready) io_uring_queue_exit(&w->ring);
        pthread_mutex_destroy(&w->submit_lock);
        if (w->buffer_size > 0) {
            free(w->header);
            free(w->buffer);
        }
    }
    pthread_mutex_destroy(&u->lock);
    pthread_cond_destroy(&u->changed);
    free(u->workers);
    free(u);
}

struct coffer_fuse_uring *coffer_fuse_uring_prepare(struct fuse_session *se,
                                                    void *reader_state,
                                                    int per_queue) {
    struct coffer_reader_state *reader = (struct coffer_reader_state *)reader_state;
    if (se == NULL || reader == NULL || per_queue <= 0) return NULL;
    int queues = possible_cpus();
    if (queues <= 0 || queues > 1024) return NULL;
    struct coffer_fuse_uring *u = (struct coffer_fuse_uring *)calloc(1, sizeof(*u));
    if (u == NULL) return NULL;
    u->se = se;
    u->reader = reader;
    u->fd = fuse_session_fd(se);
    u->queues = queues;
    u->count = queues * per_queue;
    pthread_mutex_init(&u->lock, NULL);
    pthread_cond_init(&u->changed, NULL);
    u->workers = (struct coffer_uring_worker *)calloc((size_t)u->count, sizeof(*u->workers));
    if (u->workers == NULL) { free(u); return NULL; }
    for (int i = 0; i < u->count; i++) {
        struct coffer_uring_worker *w = &u->workers[i];
        w->owner = u;
        w->qid = i % queues;
        pthread_mutex_init(&w->submit_lock, NULL);
        /* Four slots: the entry's command, a commit, the quit message. */
        int rc = io_uring_queue_init(4, &w->ring, IORING_SETUP_SQE128 | IORING_SETUP_COOP_TASKRUN);
        if (rc == -EINVAL) rc = io_uring_queue_init(4, &w->ring, IORING_SETUP_SQE128);
        if (rc < 0) { release(u); return NULL; }
        w->ring_ready = 1;
    }
    for (int i = 0; i < u->count; i++) {
        struct coffer_uring_worker *w = &u->workers[i];
        if (pthread_create(&w->thread, NULL, worker_main, w) != 0) {
            uring_init_replied(u, 0, 0);
            for (int j = 0; j < i; j++) pthread_join(u->workers[j].thread, NULL);
            release(u);
            return NULL;
        }
        w->thread_started = 1;
    }
    reader->uring_reply = uring_reply;
    reader->uring_init_replied = uring_init_replied;
    reader->uring = u;
    return u;
}

void coffer_fuse_uring_stop(struct coffer_fuse_uring *u) {
    if (u == NULL) return;
    pthread_mutex_lock(&u->lock);
    if (u->phase == PHASE_WAITING) u->phase = PHASE_QUIT;
    pthread_cond_broadcast(&u->changed);
    pthread_mutex_unlock(&u->lock);
    for (int i = 0; i < u->count; i++) {
        struct coffer_uring_worker *w = &u->workers[i];
        if (w->ring_ready) (void)submit(w, 0, 0, TAG_QUIT);
    }
    for (int i = 0; i < u->count; i++) {
        if (u->workers[i].thread_started) pthread_join(u->workers[i].thread, NULL);
    }
    if (u->reader != NULL && u->reader->uring == u) {
        u->reader->uring_granted = 0;
        u->reader->uring = NULL;
    }
    release(u);
}

int coffer_fuse_uring_granted(struct coffer_fuse_uring *u) {
    return u != NULL && u->reader != NULL && u->reader->uring_granted;
}

unsigned long coffer_fuse_uring_served(struct coffer_fuse_uring *u) {
    return u == NULL ? 0 : atomic_load_explicit(&u->served, memory_order_relaxed);
}
