import CFuse
import Synchronization

#if canImport(Glibc)
    import Glibc
#endif

// Why not fuse_set_signal_handlers: its handler only sets the session's
// "exited" flag. The multi-threaded loop's main thread sleeps in sem_wait and
// the workers (which block SIGTERM/SIGINT/SIGHUP) sleep in read(/dev/fuse),
// so the flag is only noticed when the kernel happens to send another
// request, unless the signal lands on the loop thread itself. In a Swift
// process other threads (Dispatch, the concurrency pool, GRDB's queues) are
// just as likely to receive a process-directed signal, so a SIGTERM could
// leave the daemon mounted indefinitely. Instead the handler writes a byte
// to a pipe (async-signal-safe), a watcher thread turns that into
// `FuseSession.exit()`, and exit wakes the loop thread with a dedicated
// signal aimed at it alone (pthread_kill).

/// Write end of the pipe of the session that owns process signals, or -1.
/// Only one session at a time can own SIGTERM/SIGINT/SIGHUP.
let signalPipeWriteFD = Atomic<Int32>(-1)

/// Signals that end the session when `handleSignals` is on.
let terminationSignals: [Int32] = [SIGTERM, SIGINT, SIGHUP]

/// The signal used to interrupt the loop thread's sem_wait. A real-time
/// signal nobody else in the process uses; glibc reserves the first two.
var loopWakeSignal: Int32 { coffer_sigrtmin() + 6 }

/// Bytes sent through the watcher pipe.
enum WatcherMessage: UInt8 {
    case exit = 0x78  // "x": exit() was called
    case signal = 0x73  // "s": a termination signal arrived
    case quit = 0x71  // "q": the loop is over, stop watching
}

private let wakeHandlerInstalled = Mutex(false)

/// Installs (once per process) the no-op handler for the wake signal. No
/// SA_RESTART: interrupting sem_wait is the whole point.
func installLoopWakeHandler() {
    wakeHandlerInstalled.withLock { installed in
        guard !installed else { return }
        var action = sigaction()
        action.__sigaction_handler.sa_handler = { _ in }
        sigemptyset(&action.sa_mask)
        action.sa_flags = 0
        sigaction(loopWakeSignal, &action, nil)
        installed = true
    }
}

/// The calling thread must be able to receive the wake signal even if it
/// inherited a mask that blocks real-time signals.
func unblockLoopWakeSignal() {
    var set = sigset_t()
    sigemptyset(&set)
    sigaddset(&set, loopWakeSignal)
    pthread_sigmask(SIG_UNBLOCK, &set, nil)
}

/// Saved dispositions, restored when the session ends.
struct SavedSignalActions: @unchecked Sendable {
    var actions: [(Int32, sigaction)] = []
}

/// Routes termination signals into `writeFD` if no other session owns them.
/// Returns nil when another session already does.
func installTerminationHandlers(writeFD: Int32) -> SavedSignalActions? {
    guard signalPipeWriteFD.compareExchange(expected: -1, desired: writeFD, ordering: .sequentiallyConsistent).exchanged
    else { return nil }
    var saved = SavedSignalActions()
    for signo in terminationSignals {
        var action = sigaction()
        action.__sigaction_handler.sa_handler = { _ in
            let savedErrno = errno
            let fd = signalPipeWriteFD.load(ordering: .relaxed)
            if fd >= 0 {
                var byte = WatcherMessage.signal.rawValue
                _ = write(fd, &byte, 1)
            }
            errno = savedErrno
        }
        sigemptyset(&action.sa_mask)
        action.sa_flags = SA_RESTART
        var old = sigaction()
        if sigaction(signo, &action, &old) == 0 {
            saved.actions.append((signo, old))
        }
    }
    return saved
}

func restoreTerminationHandlers(_ saved: SavedSignalActions) {
    for (signo, old) in saved.actions {
        var old = old
        sigaction(signo, &old, nil)
    }
    signalPipeWriteFD.store(-1, ordering: .sequentiallyConsistent)
}
