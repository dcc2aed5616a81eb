import Foundation
import Synchronization

/// Wakes the watches (`POST /v1/watch`, docs/SYNC.md, "Live") of accounts whose view changed.
///
/// A watch registers before it reads where the account stands, so a change committed between
/// that read and the wait still wakes it. In memory, for the watches this process holds: with
/// several server processes over one storage, a change wakes the watches of the process that
/// wrote it; the others answer when their watch times out and the device asks again (a shared
/// channel, such as PostgreSQL's LISTEN/NOTIFY, would feed `notify` from every process).
public final class ChangeNotifier: Sendable {
    /// One registered watch.
    public struct Ticket: Sendable, Hashable {
        let account: Data
        let id: UInt64
    }

    private enum Slot {
        /// Registered; the continuation once its watch waits.
        case waiting(CheckedContinuation<Void, Never>?)
        /// Woken (by a change, its timeout, cancellation or shutdown) before or while it waited.
        case woken
    }

    private struct State {
        var next: UInt64 = 0
        var slots: [Data: [UInt64: Slot]] = [:]
        var count = 0
        var closed = false
    }

    private let state = Mutex(State())
    /// Watches one account may hold at once (its devices, a few each while they reconnect).
    public let maxPerAccount: Int
    /// Watches held at once over all accounts (each holds a connection, capped anyway).
    public let maxTotal: Int

    public init(maxPerAccount: Int = 64, maxTotal: Int = 100_000) {
        self.maxPerAccount = maxPerAccount
        self.maxTotal = maxTotal
    }

    /// Registers a watch of `account`; nil when it holds too many, or the server is shutting down.
    public func register(_ account: Data) -> Ticket? {
        state.withLock { s in
            guard !s.closed, s.count < maxTotal, (s.slots[account]?.count ?? 0) < maxPerAccount else { return nil }
            s.next &+= 1
            s.slots[account, default: [:]][s.next] = .waiting(nil)
            s.count += 1
            return Ticket(account: account, id: s.next)
        }
    }

    /// Wakes every watch of these accounts.
    public func notify(_ accounts: some Sequence<Data>) {
        var resume: [CheckedContinuation<Void, Never>] = []
        state.withLock { s in
            for account in Set(accounts) {
                guard let slots = s.slots[account] else { continue }
                for (id, slot) in slots {
                    if case .waiting(let c) = slot {
                        if let c { resume.append(c) }
                        s.slots[account]?[id] = .woken
                    }
                }
            }
        }
        for c in resume { c.resume() }
    }

    /// Wakes one watch (its timeout, its client gone, shutdown).
    public func wake(_ ticket: Ticket) {
        let c = state.withLock { s -> CheckedContinuation<Void, Never>? in
            guard case .waiting(let c)? = s.slots[ticket.account]?[ticket.id] else { return nil }
            s.slots[ticket.account]?[ticket.id] = .woken
            return c
        }
        c?.resume()
    }

    /// Waits until the watch is woken: by a change to its account, after `timeout`, when its task
    /// is cancelled or at shutdown; then forgets it. A ticket woken before this returns at once.
    public func wait(_ ticket: Ticket, timeout: Duration) async {
        let timer = Task { [self] in
            try? await Task.sleep(for: timeout)
            wake(ticket)
        }
        await withTaskCancellationHandler {
            await withCheckedContinuation { (c: CheckedContinuation<Void, Never>) in
                let now = state.withLock { s -> Bool in
                    guard case .waiting? = s.slots[ticket.account]?[ticket.id] else { return true }
                    s.slots[ticket.account]?[ticket.id] = .waiting(c)
                    return false
                }
                if now { c.resume() }
            }
        } onCancel: {
            wake(ticket)
        }
        timer.cancel()
        forget(ticket)
    }

    /// Drops a registered watch that will not wait (answered at once).
    public func forget(_ ticket: Ticket) {
        let c = state.withLock { s -> CheckedContinuation<Void, Never>? in
            guard let slot = s.slots[ticket.account]?.removeValue(forKey: ticket.id) else { return nil }
            s.count -= 1
            if s.slots[ticket.account]?.isEmpty == true { s.slots[ticket.account] = nil }
            if case .waiting(let c) = slot { return c }
            return nil
        }
        c?.resume()
    }

    /// Wakes every watch and refuses new ones: a server shutting down answers its long polls
    /// instead of waiting them out.
    public func shutdown() {
        let all = state.withLock { s -> [CheckedContinuation<Void, Never>] in
            s.closed = true
            var out: [CheckedContinuation<Void, Never>] = []
            for (account, slots) in s.slots {
                for (id, slot) in slots {
                    if case .waiting(let c) = slot, let c { out.append(c) }
                    s.slots[account]?[id] = .woken
                }
            }
            return out
        }
        for c in all { c.resume() }
    }

    /// Watches registered now (tests).
    public var registered: Int { state.withLock { $0.count } }
}
