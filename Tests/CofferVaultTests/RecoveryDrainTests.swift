import CofferCrypto
import CofferModel
import Foundation
import Testing

@testable import CofferStore
@testable import CofferVault

/// Saved work from shares is drained by one process at a time (`drainRecovery`'s lease in the
/// store), so a daemon and a command draining together never save an item twice.
struct RecoveryDrainTests {
    @Test func aSecondProcessWaitsForTheDrainLease() throws {
        let f = try VaultFixture()
        let other = try Vault.open(dataDirectory: f.dataDir)
        let now = UInt64(Date().timeIntervalSince1970 * 1000)
        let saved = RecoveredFile(
            share: "team", path: ["notes.txt"], type: .document,
            attributes: PosixAttributes(
                mode: 0o644, uid: 0, gid: 0, mtime: Timespec(seconds: Int64(now / 1000)),
                stamp: HybridTimestamp(wallMillis: now, counter: 0, device: 1)),
            fileID: try FileID(random: randomBytes(16)), key: .random(), contentDigest: nil)
        let key = try f.vault.recoveryKey()
        try f.vault.store.write { w in try f.vault.enqueueRecovered([saved], under: key, w) }
        // The first vault holds the lease (as if draining): the other leaves the queue alone.
        var lease = ByteWriter()
        lease.u64(now + 60_000)
        lease.raw(f.vault.drainToken)
        try f.vault.store.write { w in try w.setSetting(Vault.drainLeaseSetting, lease.bytes) }
        try other.drainRecovery()
        #expect(other.recoveryWaiting == 1)
        #expect(try other.lookup(other.rootID, "Recovered from team") == nil)
        // Its holder drains, once, and lets the lease go; the other then finds nothing to do.
        try f.vault.drainRecovery()
        #expect(f.vault.recoveryWaiting == 0)
        try other.drainRecovery()
        let folder = try #require(try other.lookup(other.rootID, "Recovered from team"))
        #expect(try other.children(of: folder.id).map(\.name) == ["notes.txt"])
        #expect(try f.vault.store.read { try $0.setting(Vault.drainLeaseSetting) } == nil)
    }
}

/// Two processes on one store (a daemon and a command) each keep a clock: their stamps must
/// never be equal, or two different changes at one stamp would merge differently on each device.
struct ProcessStampTests {
    @Test func twoVaultsOnOneStoreNeverIssueEqualStamps() throws {
        let f = try VaultFixture()
        let frozen: @Sendable () -> Timespec = { Timespec(seconds: 1_000_000, nanoseconds: 0) }
        let a = try Vault.open(dataDirectory: f.dataDir, now: frozen)
        let b = try Vault.open(dataDirectory: f.dataDir, now: frozen)
        let sa = a.state.withLock { a.nextStamp(&$0) }
        let sb = b.state.withLock { b.nextStamp(&$0) }
        #expect(sa.wallMillis == sb.wallMillis && sa.counter == sb.counter)
        #expect(sa != sb)
    }
}
