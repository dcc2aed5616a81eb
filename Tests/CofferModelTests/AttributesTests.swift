import Testing

@testable import CofferModel

func ts(_ wall: UInt64, _ counter: UInt32 = 0, _ device: UInt32 = 1) -> HybridTimestamp {
    HybridTimestamp(wallMillis: wall, counter: counter, device: device)
}

@Suite("Hybrid logical clock")
struct HybridTimestampTests {
    @Test func orderIsWallThenCounterThenDevice() {
        #expect(ts(1, 9, 9) < ts(2, 0, 0))
        #expect(ts(2, 0, 9) < ts(2, 1, 0))
        #expect(ts(2, 1, 1) < ts(2, 1, 2))
        #expect(!(ts(2, 1, 1) < ts(2, 1, 1)))
        #expect(HybridTimestamp.zero < ts(0, 0, 1))
    }

    @Test func nextUsesTheWallClockWhenItAdvances() {
        let t = HybridTimestamp.next(after: ts(100, 5, 3), now: 200, device: 7)
        #expect(t == ts(200, 0, 7))
    }

    @Test func nextCountsWhenTheWallClockStallsOrGoesBack() {
        let a = HybridTimestamp.next(after: ts(100, 5, 3), now: 100, device: 7)
        #expect(a == ts(100, 6, 7))
        let b = HybridTimestamp.next(after: a, now: 50, device: 7)
        #expect(b == ts(100, 7, 7))
    }

    @Test func nextIsStrictlyMonotonicWhateverTheClockDoes() {
        var rng = SplitMix64(seed: 42)
        var clock = HybridTimestamp.zero
        var wall: UInt64 = 1_000
        for _ in 0..<5_000 {
            // The wall clock jitters: mostly forward, sometimes stalls or jumps back.
            wall = UInt64(max(0, Int64(wall) + Int64.random(in: -30...40, using: &rng)))
            let n = HybridTimestamp.next(after: clock, now: wall, device: 3)
            #expect(n > clock)
            #expect(n.wallMillis >= wall)
            clock = n
        }
    }

    @Test func receiveMovesPastBothReadings() {
        var rng = SplitMix64(seed: 7)
        for _ in 0..<2_000 {
            let local = ts(UInt64.random(in: 0...20, using: &rng), UInt32.random(in: 0...5, using: &rng), 1)
            let remote = ts(UInt64.random(in: 0...20, using: &rng), UInt32.random(in: 0...5, using: &rng), 2)
            let now = UInt64.random(in: 0...20, using: &rng)
            let r = HybridTimestamp.receive(local: local, remote: remote, now: now, device: 1)
            #expect(r > local)
            #expect(r > remote)
            #expect(r.wallMillis >= now)
            #expect(r.device == 1)
            // A local write after receiving also wins.
            #expect(HybridTimestamp.next(after: r, now: now, device: 1) > remote)
        }
    }

    @Test func receiveCases() {
        // Remote ahead of both clocks: adopt its wall time, bump its counter.
        #expect(HybridTimestamp.receive(local: ts(10, 3), remote: ts(20, 4, 2), now: 15, device: 1) == ts(20, 5, 1))
        // Local ahead.
        #expect(HybridTimestamp.receive(local: ts(30, 3), remote: ts(20, 4, 2), now: 15, device: 1) == ts(30, 4, 1))
        // Equal walls: max counter + 1.
        #expect(HybridTimestamp.receive(local: ts(30, 3), remote: ts(30, 8, 2), now: 15, device: 1) == ts(30, 9, 1))
        // Wall clock ahead of both: counter resets.
        #expect(HybridTimestamp.receive(local: ts(30, 3), remote: ts(30, 8, 2), now: 99, device: 1) == ts(99, 0, 1))
    }

    @Test func lastWriterWins() {
        let a = Stamped("a", at: ts(5))
        let b = Stamped("b", at: ts(6))
        #expect(Stamped.lastWriterWins(a, b) == b)
        #expect(Stamped.lastWriterWins(b, a) == b)
        #expect(Stamped.lastWriterWins(a, a) == a)
        // Same wall and counter: the device id breaks the tie, the same way on every device.
        let c = Stamped("c", at: ts(5, 0, 2))
        #expect(Stamped.lastWriterWins(a, c) == c)
        #expect(Stamped.lastWriterWins(c, a) == c)
    }

    @Test func description() {
        #expect(ts(12, 3, 4).description == "12.3@4")
    }
}

@Suite("POSIX attributes")
struct PosixAttributesTests {
    static func sample() -> PosixAttributes {
        var a = PosixAttributes(
            mode: 0o100644, uid: 1000, gid: 100,
            mtime: Timespec(seconds: 1_700_000_000, nanoseconds: 5),
            stamp: ts(0x0102, 3, 4), size: 10, symlinkTarget: "t")
        a.xattrs["user.a"] = Stamped([0x42], at: ts(9, 0, 1))
        return a
    }

    /// `sample()` after a `touch -a` past 2^31 seconds, with nanoseconds.
    static func touchedSample() -> PosixAttributes {
        var a = sample()
        a.atime = Stamped(Timespec(seconds: 2_147_483_648, nanoseconds: 100_000_000), at: ts(0x0103, 0, 4))
        return a
    }

    @Test func initMasksTypeBitsAndStampsEverything() {
        let a = Self.sample()
        #expect(a.mode.value == 0o644)
        #expect(
            a.mode.stamp == ts(0x0102, 3, 4) && a.uid.stamp == a.mode.stamp && a.gid.stamp == a.mode.stamp
                && a.mtime.stamp == a.mode.stamp)
        #expect(a.ctime == a.mtime.value)
        #expect(a.atime == a.mtime, "a new file's atime is its creation time, with the same stamp")
        #expect(PosixAttributes(mode: 0o177777, uid: 0, gid: 0, mtime: .zero, stamp: .zero).mode.value == 0o7777)
    }

    static let stampHex = "0000000000000102" + "00000003" + "00000004"

    /// Everything after mtime, in both versions.
    static let tailHex =
        "000000006553f100" + "0000000000000005"  // ctime
        + "000000000000000a"  // size 10
        + "01" + "00000001" + "74"  // symlink target "t"
        + "00000001"  // one xattr
        + "00000006" + "757365722e61" + "01" + "00000001" + "42"  // "user.a" = [0x42]
        + "0000000000000009" + "00000000" + "00000001"  // its stamp

    static let headHex =
        "000001a4" + stampHex  // mode 0644
        + "000003e8" + stampHex  // uid 1000
        + "00000064" + stampHex  // gid 100
        + "000000006553f100" + "0000000000000005" + stampHex  // mtime

    /// The sealed attribute format, field by field.
    @Test func fixedByteVector() throws {
        let expected =
            "43465041" + "02" + Self.headHex  // "CFPA", version 2
            + "0000000080000000" + "0000000005f5e100"  // atime 2^31 s, 100000000 ns
            + "0000000000000103" + "00000000" + "00000004"  // its stamp
            + Self.tailHex
        let a = Self.touchedSample()
        #expect(hex(a.encoded()) == expected)
        #expect(try PosixAttributes(decoding: unhex(expected)) == a)
    }

    /// Only the current version is read: a record of another version byte (1 had no atime) is
    /// refused, not misread.
    @Test func refusesOtherVersions() throws {
        let current = Self.touchedSample().encoded()
        for v: UInt8 in [0, 1, 3, 255] {
            #expect(throws: DecodingError.self) {
                try PosixAttributes(decoding: [0x43, 0x46, 0x50, 0x41, v] + current.dropFirst(5))
            }
        }
        #expect(throws: DecodingError.self) {
            try PosixAttributes(decoding: unhex("43465041" + "01" + Self.headHex + Self.tailHex))
        }
    }

    @Test func roundTripWithRemovedXattrsAndNoTarget() throws {
        var a = PosixAttributes(
            mode: 0o755, uid: 0, gid: 0, mtime: Timespec(seconds: -5, nanoseconds: 999_999_999), stamp: ts(1))
        a.xattrs["user.z"] = Stamped(nil, at: ts(3))
        a.xattrs["user.b"] = Stamped([], at: ts(2))
        a.xattrs["user.é"] = Stamped(Array(repeating: 7, count: 1000), at: ts(4))
        a.size = .max
        a.atime = Stamped(Timespec(seconds: .max, nanoseconds: 999_999_999), at: ts(5))
        let back = try PosixAttributes(decoding: a.encoded())
        #expect(back == a)
        #expect(back.liveXattrs == ["user.b": [], "user.é": Array(repeating: 7, count: 1000)])
    }

    @Test func xattrOrderDoesNotAffectEncoding() {
        var a = Self.sample()
        var b = Self.sample()
        for k in ["user.q", "user.c", "user.x", "user.b"] { a.xattrs[k] = Stamped([1], at: ts(1)) }
        for k in ["user.b", "user.x", "user.c", "user.q"] { b.xattrs[k] = Stamped([1], at: ts(1)) }
        #expect(a.encoded() == b.encoded())
    }

    @Test func malformedAttributesAreRefused() {
        let good = Self.touchedSample().encoded()
        for n in 0..<good.count {
            #expect(throws: DecodingError.self) { try PosixAttributes(decoding: Array(good.prefix(n))) }
        }
        #expect(throws: DecodingError.self) { try PosixAttributes(decoding: good + [0]) }
        var b = good
        b[0] = 0
        #expect(throws: DecodingError("not an attribute record")) { try PosixAttributes(decoding: b) }
        for version: UInt8 in [0, 3, 255] {
            b = good
            b[4] = version
            #expect(throws: DecodingError("unsupported attribute version \(version)")) {
                try PosixAttributes(decoding: b)
            }
        }
    }

    /// A record has one encoding: xattr names in byte order, each once, as `encoded()` writes them.
    /// Before, names out of order or repeated decoded (a repeat silently replacing the first),
    /// and re-encoding gave other bytes (found by `CofferFuzz`, target `posix-attributes`).
    @Test func xattrNamesOutOfOrderOrRepeatedAreRefused() throws {
        func record(_ names: [String]) -> [UInt8] {
            var a = Self.sample()
            a.xattrs = [:]
            var bytes = a.encoded().dropLast(4) + [0, 0, 0, UInt8(names.count)]
            for name in names {
                bytes += [0, 0, 0, UInt8(name.utf8.count)] + Array(name.utf8) + [0] + [UInt8](repeating: 0, count: 16)
            }
            return Array(bytes)
        }
        let ordered = try PosixAttributes(decoding: record(["use", "user.a"]))
        #expect(ordered.encoded() == record(["use", "user.a"]))
        #expect(throws: DecodingError("xattr names out of order")) {
            try PosixAttributes(decoding: record(["user.a", "use"]))
        }
        #expect(throws: DecodingError("xattr names out of order")) {
            try PosixAttributes(decoding: record(["user.a", "user.a"]))
        }
        // "é" precomposed and decomposed: different bytes (in order), one String key.
        #expect(throws: DecodingError("xattr name repeated")) {
            try PosixAttributes(decoding: record(["user.e\u{301}", "user.\u{e9}"]))
        }
    }

    // MARK: Merge

    @Test func mergeIsPerAttributeLastWriterWins() {
        var a = PosixAttributes(mode: 0o600, uid: 1, gid: 1, mtime: Timespec(seconds: 10), stamp: ts(10, 0, 1))
        var b = a
        // Device 1 chmods at t=20; device 2 touches at t=30 and chowns at t=5 (older).
        a.mode = Stamped(0o644, at: ts(20, 0, 1))
        b.mtime = Stamped(Timespec(seconds: 30), at: ts(30, 0, 2))
        b.uid = Stamped(99, at: ts(5, 0, 2))
        // Device 1 also sets atime (touch -a) at t=25: it survives device 2's later touch -m.
        a.atime = Stamped(Timespec(seconds: 1_900_000_000, nanoseconds: 100_000_000), at: ts(25, 0, 1))
        a.ctime = Timespec(seconds: 20)
        b.ctime = Timespec(seconds: 30)
        let m = PosixAttributes.merge(a, b)
        #expect(m.mode.value == 0o644, "the chmod survives the other device's touch")
        #expect(m.mtime.value == Timespec(seconds: 30), "the touch survives the chmod")
        #expect(
            m.atime.value == Timespec(seconds: 1_900_000_000, nanoseconds: 100_000_000),
            "touch -a and touch -m merge apart")
        #expect(m.uid.value == 1, "an older write loses")
        #expect(m.ctime == Timespec(seconds: 30))
        #expect(PosixAttributes.merge(b, a) == m)
    }

    @Test func mergeXattrsIncludingRemovals() {
        var a = PosixAttributes(mode: 0o600, uid: 1, gid: 1, mtime: .zero, stamp: ts(1))
        var b = a
        a.xattrs["user.only-a"] = Stamped([1], at: ts(2))
        b.xattrs["user.only-b"] = Stamped([2], at: ts(2))
        a.xattrs["user.both"] = Stamped([3], at: ts(3))
        b.xattrs["user.both"] = Stamped(nil, at: ts(4))  // removed later: the removal wins
        a.xattrs["user.keep"] = Stamped([5], at: ts(9))
        b.xattrs["user.keep"] = Stamped(nil, at: ts(8))  // removed earlier: the value wins
        let m = PosixAttributes.merge(a, b)
        #expect(m.liveXattrs == ["user.only-a": [1], "user.only-b": [2], "user.keep": [5]])
        #expect(PosixAttributes.merge(b, a) == m)
    }

    @Test func mergeOfAtimeIsLastWriterWinsWhateverTheValues() {
        let a = PosixAttributes(mode: 0o600, uid: 1, gid: 1, mtime: Timespec(seconds: 10), stamp: ts(10, 0, 1))
        var b = a
        var c = a
        // An atime set back in time still wins when set later: the stamp decides, not the value.
        b.atime = Stamped(Timespec(seconds: 1), at: ts(40, 0, 2))
        c.atime = Stamped(Timespec(seconds: 9_999_999_999), at: ts(30, 0, 3))
        #expect(PosixAttributes.merge(b, c).atime == b.atime)
        #expect(PosixAttributes.merge(c, b).atime == b.atime)
        #expect(PosixAttributes.merge(a, c).atime == c.atime)
        // Same wall time and counter: the device id breaks the tie, on every device alike.
        var d = a
        d.atime = Stamped(Timespec(seconds: 2), at: ts(40, 0, 1))
        #expect(PosixAttributes.merge(b, d).atime == b.atime && PosixAttributes.merge(d, b).atime == b.atime)
        // The size follows mtime, not atime.
        var e = a
        e.size = 7
        e.mtime = Stamped(Timespec(seconds: 20), at: ts(20, 0, 3))
        #expect(PosixAttributes.merge(b, e).size == 7 && PosixAttributes.merge(b, e).atime == b.atime)
    }

    @Test func mergeOfTwoContentWritesKeepsTheLaterSize() {
        // Two devices wrote the document; the later write (by mtime) carries the later size.
        var a = PosixAttributes(mode: 0o600, uid: 1, gid: 1, mtime: .zero, stamp: ts(1))
        var b = a
        a.size = 100
        a.mtime = Stamped(Timespec(seconds: 5), at: ts(5, 0, 1))
        b.size = 200
        b.mtime = Stamped(Timespec(seconds: 6), at: ts(6, 0, 2))
        #expect(PosixAttributes.merge(a, b).size == 200)
        #expect(PosixAttributes.merge(b, a).size == 200)
    }

    /// Random attribute versions of one file, as devices would produce them: a stamp identifies
    /// one write, so values are a function of the stamp (equal stamps, equal values).
    static func randomAttributes(_ rng: inout SplitMix64) -> PosixAttributes {
        func stamp() -> HybridTimestamp {
            ts(
                UInt64.random(in: 0...3, using: &rng), UInt32.random(in: 0...2, using: &rng),
                UInt32.random(in: 1...3, using: &rng))
        }
        func v(_ s: HybridTimestamp, _ salt: UInt32) -> UInt32 {
            UInt32(s.wallMillis) * 100 + s.counter * 10 + s.device + salt * 1000
        }
        var a = PosixAttributes(mode: 0, uid: 0, gid: 0, mtime: .zero, stamp: .zero, symlinkTarget: nil)
        let sm = stamp()
        let su = stamp()
        let sg = stamp()
        let st = stamp()
        let sa = stamp()
        a.mode = Stamped(v(sm, 0) & 0o7777, at: sm)
        a.uid = Stamped(v(su, 1), at: su)
        a.gid = Stamped(v(sg, 2), at: sg)
        a.mtime = Stamped(Timespec(seconds: Int64(v(st, 3))), at: st)
        a.atime = Stamped(Timespec(seconds: Int64(v(sa, 6)), nanoseconds: Int64(v(sa, 7))), at: sa)
        a.size = UInt64(v(st, 4))  // content size is written together with mtime
        a.ctime = Timespec(seconds: Int64.random(in: 0...50, using: &rng))
        for k in ["user.a", "user.b", "user.c"] where Bool.random(using: &rng) {
            let s = stamp()
            a.xattrs[k] = Stamped(s.counter == 0 ? nil : [UInt8(v(s, 5) & 0xff)], at: s)
        }
        return a
    }

    @Test func mergeIsCommutativeAssociativeAndIdempotent() {
        var rng = SplitMix64(seed: 2024)
        for _ in 0..<2_000 {
            let a = Self.randomAttributes(&rng)
            let b = Self.randomAttributes(&rng)
            let c = Self.randomAttributes(&rng)
            let merge = PosixAttributes.merge
            #expect(merge(a, b) == merge(b, a), "commutative")
            #expect(merge(merge(a, b), c) == merge(a, merge(b, c)), "associative")
            #expect(merge(a, a) == a, "idempotent")
            #expect(merge(merge(a, b), b) == merge(a, b), "absorbing")
            let m = merge(a, b)
            #expect(m.mode.stamp == max(a.mode.stamp, b.mode.stamp))
            #expect(m.mtime.stamp == max(a.mtime.stamp, b.mtime.stamp))
            #expect(m.atime.stamp == max(a.atime.stamp, b.atime.stamp))
            #expect(m.ctime == max(a.ctime, b.ctime))
        }
    }

    @Test func timespecOrder() {
        #expect(Timespec(seconds: 1, nanoseconds: 5) < Timespec(seconds: 2))
        #expect(Timespec(seconds: 1, nanoseconds: 5) < Timespec(seconds: 1, nanoseconds: 6))
        #expect(Timespec(seconds: -1) < .zero)
    }
}
