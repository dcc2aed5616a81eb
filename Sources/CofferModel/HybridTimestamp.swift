/// A hybrid logical clock reading (wall milliseconds, counter, device), as in Muse's atomic
/// attributes: it orders concurrent writes across devices consistently even when their wall
/// clocks disagree, and ties break on the device id so every device picks the same winner.
public struct HybridTimestamp: Comparable, Hashable, Sendable, CustomStringConvertible {
    public var wallMillis: UInt64
    public var counter: UInt32
    public var device: UInt32

    public init(wallMillis: UInt64, counter: UInt32, device: UInt32) {
        self.wallMillis = wallMillis
        self.counter = counter
        self.device = device
    }

    public static let zero = HybridTimestamp(wallMillis: 0, counter: 0, device: 0)

    public static func < (a: Self, b: Self) -> Bool {
        (a.wallMillis, a.counter, a.device) < (b.wallMillis, b.counter, b.device)
    }

    /// The next reading on `device` after `last`, given the wall clock `now`. Pure: the caller
    /// reads the clock.
    public static func next(after last: Self, now: UInt64, device: UInt32) -> Self {
        if now > last.wallMillis { return Self(wallMillis: now, counter: 0, device: device) }
        return Self(wallMillis: last.wallMillis, counter: last.counter &+ 1, device: device)
    }

    /// Advances a local clock past a remote reading (on receive), so later local writes win
    /// over anything already seen.
    public static func receive(local: Self, remote: Self, now: UInt64, device: UInt32) -> Self {
        let wall = max(now, local.wallMillis, remote.wallMillis)
        var counter: UInt32 = 0
        if wall == local.wallMillis && wall == remote.wallMillis {
            counter = max(local.counter, remote.counter) &+ 1
        } else if wall == local.wallMillis {
            counter = local.counter &+ 1
        } else if wall == remote.wallMillis {
            counter = remote.counter &+ 1
        }
        return Self(wallMillis: wall, counter: counter, device: device)
    }

    public var description: String { "\(wallMillis).\(counter)@\(device)" }

    func encode(into w: inout ByteWriter) {
        w.u64(wallMillis)
        w.u32(counter)
        w.u32(device)
    }
    static func decode(from r: inout ByteReader) throws -> Self {
        Self(wallMillis: try r.u64(), counter: try r.u32(), device: try r.u32())
    }
}

/// A value with the clock reading of its last write; merges keep the later one.
public struct Stamped<Value: Hashable & Sendable>: Hashable, Sendable {
    public var value: Value
    public var stamp: HybridTimestamp
    public init(_ value: Value, at stamp: HybridTimestamp) {
        self.value = value
        self.stamp = stamp
    }

    public static func lastWriterWins(_ a: Self, _ b: Self) -> Self { a.stamp >= b.stamp ? a : b }
}
