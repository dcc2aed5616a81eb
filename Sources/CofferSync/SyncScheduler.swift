import CofferModel
import CofferVault
import Foundation
import Synchronization

/// Syncs a mounted store by itself: shortly after local writes go quiet, and every `interval`
/// seconds regardless (to pull). Offline, it backs off (2 s, 4 s, … up to `interval`) and
/// catches up when the server returns. Pulled changes go to `onChange` so the kernel is told.
public final class SyncScheduler: Sendable {
    let engine: SyncEngine
    let quietPeriod: Double
    let interval: Double
    let onChange: @Sendable (Set<FileID>) -> Void
    let log: @Sendable (String) -> Void
    let stopped = Atomic<Bool>(false)
    let finished = Mutex<Bool>(false)
    let nudges = Atomic<Int>(0)

    public init(
        engine: SyncEngine, quietPeriod: Double = 2, interval: Double = 30,
        onChange: @escaping @Sendable (Set<FileID>) -> Void, log: @escaping @Sendable (String) -> Void
    ) {
        self.engine = engine
        self.quietPeriod = quietPeriod
        self.interval = interval
        self.onChange = onChange
        self.log = log
    }

    public func start() {
        let t = Thread { [self] in self.loop() }
        t.name = "coffer-sync"
        t.start()
    }

    /// Asks for a sync soon (e.g. after an unmount request), without waiting.
    public func nudge() { nudges.add(1, ordering: .relaxed) }

    public func stop() {
        stopped.store(true, ordering: .relaxed)
        let deadline = Date().addingTimeInterval(30)
        while !finished.withLock({ $0 }) && Date() < deadline { usleep(20_000) }
    }

    private func loop() {
        defer { finished.withLock { $0 = true } }
        var lastSeq = (try? engine.vault.lastChange()) ?? 0
        var lastLocalChange = Date.distantPast
        var lastSync = Date.distantPast
        var failures = 0
        var nextAttempt = Date()
        var seenNudges = 0
        while !stopped.load(ordering: .relaxed) {
            usleep(100_000)
            let seq = (try? engine.vault.lastChange()) ?? lastSeq
            if seq != lastSeq {
                lastSeq = seq
                lastLocalChange = Date()
            }
            let pending = (try? engine.vault.hasPendingLocalChanges()) ?? false
            let now = Date()
            let n = nudges.load(ordering: .relaxed)
            let quiet = now.timeIntervalSince(lastLocalChange) >= quietPeriod
            let due = (pending && quiet) || now.timeIntervalSince(lastSync) >= interval || n != seenNudges
            guard due, now >= nextAttempt else { continue }
            seenNudges = n
            do {
                let report = try runBlocking { [engine] in try await engine.sync() }
                lastSync = Date()
                lastSeq = (try? engine.vault.lastChange()) ?? lastSeq
                failures = 0
                nextAttempt = Date()
                if !report.changed.isEmpty { onChange(report.changed) }
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
                nextAttempt = Date().addingTimeInterval(delay)
                lastSync = Date()
                log("sync failed (retry in \(Int(delay)) s): \(ServerText.sanitized("\(error)"))")
            }
        }
    }
}
