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

#endif
