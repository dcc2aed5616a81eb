import Foundation
import GRDB
import Synchronization

/// The state of group commit: whether it is on, since when the writer's transaction is open,
/// and the statements finished writes queued for it (`StoreWriter`). Shared by the writes, the
/// readers that run the queue first, and the thread that runs it and closes groups.
final class GroupCommit: Sendable {
    private struct State {
        var window: Double?
        var longest: Double = 0
        var openedAt: Double?
        var closedAt: Double?
        var lastWriteAt: Double = 0
        var lost = false
        var generation: UInt64 = 0
        /// The newest group whose commit finished: readers on other connections see its writes.
        var committed: UInt64 = 0
        /// Groups that failed to commit (their writes are gone), the most recent few.
        var lostGenerations: [UInt64] = []
        /// Statements queued since the queue was last empty, in order, those before `head`
        /// already taken; nil where taken, or where a later put took a put's place.
        var queued: [QueuedStatement?] = []
        var head = 0
        /// The last statement in `queued` that changes each file's tree row (its position),
        /// and whether it is a put of that table.
        var lastRowWrite: [Data: (position: Int, putTable: String?)] = [:]
        /// The commit thread waits on `wakeup` until a write opens a group (or queues work, or
        /// group commit is turned off); whoever clears this signals it.
        var sleeping = false

        /// Empties the queue. Every position in `lastRowWrite` is of a statement gone with it.
        mutating func clearQueue() {
            queued = []
            head = 0
            lastRowWrite = [:]
        }
    }
    private let state = Mutex(State())
    private let wakeup = DispatchSemaphore(value: 0)

    /// Clears `sleeping` and says whether the thread must be signalled (after the lock).
    private static func takeSleeper(_ s: inout State) -> Bool {
        defer { s.sleeping = false }
        return s.sleeping
    }

    /// Called by the commit thread: if nothing is left to do (no group open, nothing queued,
    /// and `done`, the time by which both the log's checkpoint and its trim last ran, is after
    /// the last group closed), waits for the next write, so an idle store costs no wakeups at
    /// all. Checked under the lock the writers take, so a group opened and closed meanwhile is
    /// seen. Returns whether it slept.
    @discardableResult
    func sleepIfIdle(done: Double) -> Bool {
        let sleep = state.withLock { s -> Bool in
            guard s.window != nil, s.openedAt == nil, s.head >= s.queued.count, (s.closedAt ?? -.infinity) < done
            else { return false }
            s.sleeping = true
            return true
        }
        if sleep { wakeup.wait() }
        return sleep
    }

    var window: Double? { state.withLock { $0.window } }
    var isOpen: Bool { state.withLock { $0.openedAt != nil } }
    /// Seconds since the open group began (0 if none).
    var age: Double { state.withLock { s in s.openedAt.map { Self.now() - $0 } ?? 0 } }

    func enable(window: Double, longest: Double) {
        state.withLock { s in
            s.window = window
            s.longest = max(longest, window)
        }
    }

    /// The longest a group stays open while writes keep coming (see `isDue`).
    var longest: Double { state.withLock { $0.longest } }

    /// Whether the open group should be committed now: once it is `window` old and writes have
    /// paused for half a window, or once it is `longest` old whatever they do. A lone change
    /// is committed (and visible to other processes) about a window after it was made; a burst
    /// (untar, a build) shares one commit per `longest`, which writes each B-tree page its keys
    /// touch once instead of once per window.
    var isDue: Bool {
        state.withLock { s in
            guard let window = s.window, let opened = s.openedAt else { return false }
            let now = Self.now()
            let age = now - opened
            return age >= window && (now - s.lastWriteAt >= window / 2 || age >= s.longest)
        }
    }

    /// Seconds since the last group closed, if none is open.
    var idleFor: Double? {
        state.withLock { s in
            guard s.openedAt == nil, let closed = s.closedAt else { return nil }
            return Self.now() - closed
        }
    }
    func disable() {
        let wake = state.withLock { s in
            s.window = nil
            return Self.takeSleeper(&s)
        }
        if wake { wakeup.signal() }
    }
    func opened() {
        let wake = state.withLock { s in
            s.openedAt = Self.now()
            s.generation &+= 1
            s.clearQueue()
            return Self.takeSleeper(&s)
        }
        if wake { wakeup.signal() }
    }
    /// Which group transaction is open (each one gets a new number), nil if none.
    var openGeneration: UInt64? { state.withLock { $0.openedAt == nil ? nil : $0.generation } }
    var committedGeneration: UInt64 { state.withLock { $0.committed } }
    /// The newest group committed, and the recent groups lost, read together.
    var fates: (committed: UInt64, lost: [UInt64]) { state.withLock { ($0.committed, $0.lostGenerations) } }
    func closed(lost: Bool = false) {
        state.withLock { s in
            if s.openedAt != nil {
                s.closedAt = Self.now()
                if lost {
                    s.lostGenerations.append(s.generation)
                    if s.lostGenerations.count > 64 { s.lostGenerations.removeFirst() }
                } else {
                    s.committed = s.generation
                }
            }
            s.openedAt = nil
            s.clearQueue()
            if lost { s.lost = true }
        }
    }
    func takeLost() -> Bool {
        state.withLock { s in
            defer { s.lost = false }
            return s.lost
        }
    }

    /// Queues a finished write's statements behind the earlier ones, if the group it wrote in
    /// is still open; a group that was lost meanwhile takes them with it.
    ///
    /// A put of a tree row whose last change in the queue is a put of the same row, not yet
    /// run, takes that put's place: the earlier one is dropped, and its manifest releases and
    /// its step of the garbage counter carried over (`RowPut.replace`). Every statement in
    /// between leaves that row alone (a delete or a read of it would have been the last
    /// change), and the group commits whole or not at all, so the store ends the same, with one
    /// row write fewer.
    func enqueue(_ statements: [QueuedStatement], generation: UInt64) {
        let wake = state.withLock { s in
            guard s.openedAt != nil, s.generation == generation else { return Self.takeSleeper(&s) }
            s.lastWriteAt = Self.now()
            for statement in statements {
                let position = s.queued.count
                switch statement {
                case .statement:
                    s.queued.append(statement)
                case .touch(let id, _):
                    s.lastRowWrite[id] = (position, nil)
                    s.queued.append(statement)
                case .put(var put):
                    if let last = s.lastRowWrite[put.id], last.putTable == put.table,
                        case .put(let earlier)? = s.queued[last.position]
                    {
                        s.queued[last.position] = nil
                        put.replace(earlier)
                    }
                    s.lastRowWrite[put.id] = (position, put.table)
                    s.queued.append(.put(put))
                }
            }
            return Self.takeSleeper(&s)
        }
        if wake { wakeup.signal() }
    }

    /// Hands the oldest queued statements (all of them, or at most `limit`) to the caller, which
    /// holds the connection and runs them.
    ///
    /// Taken statements leave nil behind, so positions stay put (no shifting of what is left,
    /// once per slice of a long queue); once all are taken the queue starts over, empty.
    func takeQueued(limit: Int = .max) -> [QueuedStatement] {
        state.withLock { s in
            let end = s.head + min(limit, s.queued.count - s.head)
            let taken = s.queued[s.head..<end].compactMap { $0 }
            if end == s.queued.count {
                s.clearQueue()
            } else {
                for i in s.head..<end { s.queued[i] = nil }
                s.head = end
            }
            return taken
        }
    }

    var hasQueued: Bool { state.withLock { $0.head < $0.queued.count } }

    /// How many row puts wait in the queue (for tests of merging).
    var queuedPuts: Int {
        state.withLock { s in
            s.queued[s.head...].count { if case .put? = $0 { true } else { false } }
        }
    }

    static func now() -> Double {
        var ts = timespec()
        clock_gettime(CLOCK_MONOTONIC, &ts)
        return Double(ts.tv_sec) + Double(ts.tv_nsec) / 1e9
    }
}

/// Change-log sequence numbers for writes whose inserts run later (group commit): what
/// SQLite's AUTOINCREMENT would assign, handed out in memory. Sound because the
/// open group holds SQLite's write lock, so no other process inserts until it commits; loaded
/// anew each time a group opens.
final class GroupCounters: Sendable {
    private struct State {
        var sequence: Int64 = 1
    }
    private let state = Mutex(State())

    /// Reads where the numbering stands: past the highest number ever used (AUTOINCREMENT's
    /// `sqlite_sequence`, which remembers deleted rows' numbers too) and past every row.
    func load(_ db: Database) throws {
        let sequence = try Self.next(db, table: "change_log", column: "seq")
        state.withLock { $0 = State(sequence: sequence) }
    }

    private static func next(_ db: Database, table: String, column: String) throws -> Int64 {
        let used =
            try Int64.fetchOne(
                db.cachedStatement(sql: "SELECT seq FROM sqlite_sequence WHERE name = ?"), arguments: [table]) ?? 0
        let highest =
            try Int64.fetchOne(db.cachedStatement(sql: "SELECT COALESCE(MAX(\(column)), 0) FROM \(table)")) ?? 0
        return max(used, highest) + 1
    }

    func nextSequence() -> Int64 {
        state.withLock { s in
            defer { s.sequence += 1 }
            return s.sequence
        }
    }
}

/// A lock held across a closure that may throw and return any value (the store's write gate;
/// `Mutex.withLock` wants a `sending` result, which a write's generic result need not be).
final class WriteGate: Sendable {
    private let lock = NSLock()

    func withLock<T>(_ body: () throws -> T) rethrows -> T {
        lock.lock()
        defer { lock.unlock() }
        return try body()
    }
}
