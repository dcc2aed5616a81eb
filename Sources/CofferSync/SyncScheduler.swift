import CofferModel
import CofferVault
import Foundation
import Synchronization

/// Syncs a mounted store by itself, when there is something to do and never on a timer that
/// ticks while idle (docs/SYNC.md, "Live"):
///
/// - **local changes** (`storeChanged`, from the mount's watcher whenever any process commits to
///   the store) are pushed `quietPeriod` after the last one (so a burst shares one sync), and at
///   least every `longestHold` while changes keep coming. Writes to an open file reach the store
///   when it is closed or fsynced, so that is when they go up;
/// - **remote changes** arrive through the `LiveChannel` (the server's long poll) and are pulled
///   at once;
/// - **a slow poll** covers what the channel cannot: every `interval` seconds while it is down
///   (or the server has none), every `liveInterval` seconds while it is up (which also keeps the
///   check that the server was not restored from a backup running).
///
/// Offline, attempts back off (2 s, 4 s, … up to `interval`). Pulled changes go to `onChange` so
/// the kernel is told.
public final class SyncScheduler: Sendable {
    let engine: SyncEngine
    let quietPeriod: Double
    let longestHold: Double
    let interval: Double
    let liveInterval: Double
    let onChange: @Sendable (Set<FileID>) -> Void
    let log: @Sendable (String) -> Void
    let live: LiveChannel?
    /// Runs after each successful sync (the mount trims a store on demand to its cache size).
    let afterSync: @Sendable () -> Void

    private struct Signals {
        var stopped = false
        /// The store changed since the scheduler last looked for pending changes.
        var storeChanged = true
        /// When local changes were last seen pending, and when the first of them was, since the
        /// last sync began.
        var localAt: Double?
        var firstLocalAt: Double?
        /// Where the server said the account's view moved to, not pulled yet.
        var remote: LiveChannel.Seen?
        var nudged = false
        /// The live channel came back after being down: the server is reachable again, so a
        /// sync waiting out a backoff runs now.
        var reconnected = false
        /// The loop waits on `wake`; whoever clears this signals it (at most once per wait).
        var sleeping = false
    }
    /// The signals and the semaphore the loop waits on, in a box of their own so the live
    /// channel's callbacks can hold them.
    private final class Mailbox: Sendable {
        let state = Mutex(Signals())
        let wake = DispatchSemaphore(value: 0)

        func signal(_ change: (inout Signals) -> Void) {
            let wasSleeping = state.withLock { s -> Bool in
                change(&s)
                defer { s.sleeping = false }
                return s.sleeping
            }
            if wasSleeping { wake.signal() }
        }
    }
    private let mailbox = Mailbox()
    private let finished = Mutex<Bool>(false)

    /// `live`: whether to hold a live channel to the server (off in tests of the poll).
    public init(
        engine: SyncEngine, quietPeriod: Double = 0.1, longestHold: Double = 1, interval: Double = 30,
        liveInterval: Double = 300, live: Bool = true,
        onChange: @escaping @Sendable (Set<FileID>) -> Void, log: @escaping @Sendable (String) -> Void,
        afterSync: @escaping @Sendable () -> Void = {}
    ) {
        self.engine = engine
        self.afterSync = afterSync
        self.quietPeriod = max(0, quietPeriod)
        self.longestHold = max(longestHold, quietPeriod)
        self.interval = max(interval, 0.1)
        self.liveInterval = max(liveInterval, interval)
        self.onChange = onChange
        self.log = log
        if live {
            let mailbox = self.mailbox
            let vault = engine.vault
            self.live = LiveChannel(
                engine: engine,
                onChange: { seen in mailbox.signal { $0.remote = seen } },
                onState: { state, why in
                    vault.recordLiveChannel(state: state.rawValue, detail: why)
                    if state == .down, let why { log("live channel down: \(why)") }
                    if state == .live || state == .unsupported { log("live channel \(state.rawValue)") }
                    // The poll's pace follows the channel's state.
                    mailbox.signal { if state == .live { $0.reconnected = true } }
                })
        } else {
            self.live = nil
        }
    }

    public func start() {
        live?.start()
        let t = Thread { [self] in self.loop() }
        t.name = "coffer-sync"
        t.start()
    }

    /// The store changed (any process committed): local changes may wait to be pushed.
    public func storeChanged() { mailbox.signal { $0.storeChanged = true } }

    /// Asks for a sync now (e.g. after an unmount request), without waiting.
    public func nudge() { mailbox.signal { $0.nudged = true } }

    public func stop() {
        live?.stop()
        mailbox.signal { $0.stopped = true }
        let deadline = Date().addingTimeInterval(30)
        while !finished.withLock({ $0 }) && Date() < deadline { usleep(20_000) }
        engine.vault.recordLiveChannel(state: nil, detail: nil)
    }

    /// Monotonic seconds.
    static func now() -> Double { ProcessInfo.processInfo.systemUptime }

    /// What the loop does next: sync now (and why), wait until a time (or a signal), look at the
    /// store again, or stop.
    enum Decision {
        case sync(remoteOnly: Bool, target: LiveChannel.Seen?)
        case wait(until: Double)
        /// The store changed since the last look: look again before deciding.
        case look
        case stop
    }

    private func decide(lastSync: Double, nextAttempt: inout Double) -> Decision {
        let t = Self.now()
        let liveUp = live?.state == .live
        return mailbox.state.withLock { s -> Decision in
            if s.stopped { return .stop }
            if s.reconnected {
                s.reconnected = false
                if nextAttempt > t {
                    nextAttempt = -Double.infinity
                    s.nudged = true
                }
            }
            var at = lastSync + (liveUp ? liveInterval : interval)
            if s.nudged || s.remote != nil { at = min(at, t) }
            if let last = s.localAt, let first = s.firstLocalAt {
                at = min(at, last + quietPeriod, first + longestHold)
            }
            at = max(at, nextAttempt)
            guard at <= t else {
                // A change that arrived while the last look ran must not wait for the timer.
                if s.storeChanged { return .look }
                s.sleeping = true
                return .wait(until: at)
            }
            let remoteOnly = s.localAt == nil && !s.nudged && s.remote != nil
            let target = s.remote
            s.nudged = false
            s.remote = nil
            s.localAt = nil
            s.firstLocalAt = nil
            return .sync(remoteOnly: remoteOnly, target: target)
        }
    }

    /// Looks for pending local changes if the store changed since the last look. Changes a sync
    /// left pending (a push the server refused, say) wait for the poll, not for every look: only
    /// a commit after that sync (`stuckAt`, the change log's end then) makes them due again.
    private func noticeLocalChanges(stuckAt: Int64?) {
        guard
            mailbox.state.withLock({ s in
                defer { s.storeChanged = false }
                return s.storeChanged
            })
        else { return }
        guard (try? engine.vault.hasPendingLocalChanges()) == true else { return }
        if let stuckAt, (try? engine.vault.lastChange()) == stuckAt { return }
        let t = Self.now()
        mailbox.state.withLock { s in
            s.localAt = t
            if s.firstLocalAt == nil { s.firstLocalAt = t }
        }
    }

    /// Whether this device already holds what the server announced (its own push, pulled by the
    /// sync that made it).
    private func holds(_ target: LiveChannel.Seen) -> Bool {
        let v = engine.vault
        return v.syncStatus.cursor >= target.latest && v.feedCursor >= target.feedLatest
            && v.contactBookRevision >= target.contactsRevision
    }

    private func loop() {
        defer { finished.withLock { $0 = true } }
        // The first sync runs at once.
        var lastSync = -Double.infinity
        var failures = 0
        var nextAttempt = -Double.infinity
        var stuckAt: Int64?
        while true {
            noticeLocalChanges(stuckAt: stuckAt)
            switch decide(lastSync: lastSync, nextAttempt: &nextAttempt) {
            case .stop:
                return
            case .look:
                continue
            case .wait(let until):
                let seconds = until - Self.now()
                if seconds.isFinite, seconds < 86_400 {
                    _ = mailbox.wake.wait(timeout: .now() + .milliseconds(Int(max(1, seconds * 1000))))
                } else {
                    mailbox.wake.wait()
                }
                mailbox.state.withLock { $0.sleeping = false }
            case .sync(let remoteOnly, let target):
                if remoteOnly, let target, holds(target) { continue }
                do {
                    let report = try runBlocking { [engine] in try await engine.sync() }
                    lastSync = Self.now()
                    failures = 0
                    nextAttempt = -Double.infinity
                    // Changes left pending by a sync that pushed something (committed while it
                    // ran, after it read what to push) get another sync; left by one that pushed
                    // nothing (the server refused them, say), they wait for the poll.
                    let pushed = report.pushedRecords + report.pushedChunks > 0
                    stuckAt =
                        !pushed && (try? engine.vault.hasPendingLocalChanges()) == true
                        ? try? engine.vault.lastChange() : nil
                    if !report.changed.isEmpty { onChange(report.changed) }
                    afterSync()
                    if let n = report.resentToServer {
                        log(
                            "sync: the server was behind this device (restored from a backup?); re-sent \(n) "
                                + "file\(n == 1 ? "" : "s")"
                        )
                    }
                    if report.pulled + report.pushedRecords > 0 {
                        log(
                            "sync: pulled \(report.pulled), pushed \(report.pushedRecords) records and "
                                + "\(report.pushedChunks) chunks"
                        )
                    }
                } catch {
                    failures += 1
                    let delay = min(interval, pow(2, Double(min(failures, 10))))
                    lastSync = Self.now()
                    nextAttempt = lastSync + delay
                    stuckAt = nil
                    log("sync failed (retry in \(Int(delay)) s): \(ServerText.sanitized("\(error)"))")
                }
                // What was committed while it ran is looked at afresh.
                mailbox.state.withLock { $0.storeChanged = true }
            }
        }
    }
}
