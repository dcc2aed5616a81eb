import CofferProtocol
import CofferVault
import Foundation
import Synchronization

/// The server's word that the account's view changed, as soon as it does (docs/SYNC.md,
/// "Live"): a long poll (`POST /v1/watch`) held open again and again over the same signed HTTP
/// requests as every other call.
///
/// A long poll rather than a WebSocket: it needs nothing the protocol does not have already
/// (request signing, the server's id check, deadlines, HTTPS with a pinned certificate, any
/// proxy), the server holds one parked request per device and no thread, and an answer costs
/// one round trip, which on any link is far below the one second a change may take to arrive.
/// Each watch names what the device has seen (its cursors, or the last answer's, whichever is
/// newer), so the server answers at once when something newer is there and an answer never
/// wakes the device twice for one change.
public final class LiveChannel: Sendable {
    /// The channel's state, as `coffer status` shows it.
    public enum State: String, Sendable {
        /// Not connected yet.
        case connecting
        /// A watch is held open: changes arrive as they happen.
        case live
        /// The last watch failed; it is tried again after a backoff, and the daemon polls
        /// meanwhile.
        case down
        /// The server has no watch endpoint (an older server): the daemon polls.
        case unsupported
    }

    /// Where the account's view stood at the server's last answer.
    public struct Seen: Sendable, Equatable {
        public var latest: Int64
        public var feedLatest: Int64
        public var contactsRevision: Int64
    }

    let engine: SyncEngine
    let onChange: @Sendable (Seen) -> Void
    let onState: @Sendable (State, String?) -> Void
    let current = Mutex<State>(.connecting)
    let task = Mutex<Task<Void, Never>?>(nil)
    /// Longest pause between attempts while the server cannot be reached.
    let maxBackoff: Double
    /// The pause before asking an older server again whether it learned to watch.
    let unsupportedRetry: Double

    /// `onChange` gets each answer that says the view moved (where it stands now); `onState`
    /// each change of state, with the error that caused it.
    public init(
        engine: SyncEngine, maxBackoff: Double = 30, unsupportedRetry: Double = 600,
        onChange: @escaping @Sendable (Seen) -> Void,
        onState: @escaping @Sendable (State, String?) -> Void = { _, _ in }
    ) {
        self.engine = engine
        self.maxBackoff = maxBackoff
        self.unsupportedRetry = unsupportedRetry
        self.onChange = onChange
        self.onState = onState
    }

    public var state: State { current.withLock { $0 } }

    public func start() {
        task.withLock { t in
            guard t == nil else { return }
            t = Task.detached { [self] in await run() }
        }
    }

    public func stop() {
        task.withLock { t in
            t?.cancel()
            t = nil
        }
    }

    func set(_ state: State, _ why: String? = nil) {
        let changed = current.withLock { s -> Bool in
            defer { s = state }
            return s != state
        }
        if changed { onState(state, why) }
    }

    func run() async {
        var seen: Seen?
        var failures = 0
        // Answers that said "changed" while this device's own cursors stood still since the
        // last such answer: a server that says so for ever (or a burst faster than the syncs
        // it starts) gets the next watch later, up to `maxStall` s, so it cannot keep the
        // device syncing without a pause.
        var stalled = 0
        var heldAtLastChange: [Int64]?
        let vault = engine.vault
        while !Task.isCancelled {
            // The first watch of a connection is answered within a second, so the channel is
            // known to be up (`coffer status`) without waiting for a change.
            let request = WatchRequest(
                since: max(vault.syncStatus.cursor, seen?.latest ?? 0),
                feedSince: max(vault.feedCursor, seen?.feedLatest ?? 0),
                contactsRevision: max(vault.contactBookRevision, seen?.contactsRevision ?? 0),
                wait: state == .live ? nil : 1)
            do {
                let answer = try await engine.client.watch(request)
                failures = 0
                set(.live)
                let now = Seen(
                    latest: answer.latest, feedLatest: answer.feedLatest, contactsRevision: answer.contactsRevision)
                seen = now
                guard answer.changed else { continue }
                onChange(now)
                let held = [vault.syncStatus.cursor, vault.feedCursor, vault.contactBookRevision]
                stalled = held == heldAtLastChange ? stalled + 1 : 0
                heldAtLastChange = held
                if stalled > 0 { await pause(Double(min(stalled, Self.maxStall))) }
            } catch {
                if Task.isCancelled { return }
                if (error as? SyncError)?.isUnknownEndpoint == true {
                    set(.unsupported, "the server does not offer live changes")
                    await pause(unsupportedRetry)
                    continue
                }
                failures += 1
                set(.down, ServerText.sanitized("\(error)"))
                await pause(backoff(failures))
            }
        }
    }

    /// Longest pause, in seconds, after answers that said "changed" without this device's
    /// cursors moving.
    static let maxStall = 5

    /// 1, 2, 4, … seconds up to `maxBackoff`, a quarter of it random, so devices that lost one
    /// server together do not all come back in the same instant.
    func backoff(_ failures: Int) -> Double {
        let base = min(maxBackoff, pow(2, Double(min(failures - 1, 16))))
        return base * Double.random(in: 0.75...1.0)
    }

    func pause(_ seconds: Double) async {
        try? await Task.sleep(for: .milliseconds(Int64(seconds * 1000)))
    }
}
