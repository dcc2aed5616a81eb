import CofferModel
import Foundation
import Synchronization
import Testing

@testable import CofferVault

/// A server in memory: the newest record of each file with the version it was pushed at, and the
/// content devices sent. It does what the sync engine asks of a real server, in the same order
/// (content before the metadata naming it), without its checks: the merge is what is under test.
final class MemoryRelay: @unchecked Sendable {
    private var records: [FileID: RemoteFile] = [:]
    private var manifests: [[UInt8]: [UInt8]] = [:]
    private var chunks: [[UInt8]: [UInt8]] = [:]
    private var version: Int64 = 0

    func push(_ vault: Vault) throws {
        for upload in try vault.pendingContent() {
            manifests[upload.digest] = upload.sealedManifest
            for id in upload.chunkIDs { chunks[id] = try vault.sealedChunk(id) }
        }
        let pending = try vault.pendingRecords()
        guard !pending.isEmpty else { return }
        version += 1
        for p in pending {
            records[p.stored.metadata.id] = RemoteFile(
                signed: p.stored.signed, version: version, contentVersion: version, serverDeleted: false)
        }
        try vault.markPushed(pending, version: version)
    }

    func pull(_ vault: Vault) throws {
        let cursor = vault.syncStatus.cursor
        let files = records.values.filter { $0.version > cursor }
        try vault.verifyRemote(files)
        for need in try vault.contentNeeds(files) {
            let sealed = try #require(manifests[need.digest])
            let manifest = try vault.openRemoteManifest(need, sealed: sealed)
            var sent: [[UInt8]: [UInt8]] = [:]
            for id in try vault.missingChunks(manifest.chunks.map(\.id)) { sent[id] = chunks[id] }
            try vault.storeRemoteContents([
                FetchedContent(need: need, manifest: manifest, sealedManifest: sealed, chunks: sent)
            ])
        }
        try vault.applyPull(Array(files), cursor: version)
    }

    /// What the sync engine does: pull, push, pull.
    func sync(_ vault: Vault) throws {
        try pull(vault)
        try push(vault)
        try pull(vault)
    }
}

/// Two devices of one account and a relay between them. Both vaults read one clock that moves a
/// second at every reading, so "later" is decided by the order of the test's steps, not by luck.
final class TwoDevices: @unchecked Sendable {
    let dir = NSTemporaryDirectory() + "coffer-merge-test-" + UUID().uuidString
    let a: Vault
    let b: Vault
    let relay = MemoryRelay()

    init() throws {
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
        let ticks = Ticks()
        let now: @Sendable () -> Timespec = { Timespec(seconds: ticks.next()) }
        a = try Vault.create(dataDirectory: dir + "/a", username: "alice", now: now)
        b = try Vault.create(
            dataDirectory: dir + "/b", username: "alice", secret: a.exportedSecret, createRoot: false, now: now)
        try relay.sync(a)
        try relay.sync(b)
    }

    deinit { try? FileManager.default.removeItem(atPath: dir) }

    /// A syncs, then B, then A again: every change has reached both.
    func settle() throws {
        try relay.sync(a)
        try relay.sync(b)
        try relay.sync(a)
    }

    enum Entry: Equatable {
        case folder
        case document([UInt8])
    }

    /// Every live path under the root, as one device sees it.
    static func listing(_ vault: Vault) throws -> [String: Entry] {
        var out: [String: Entry] = [:]
        func walk(_ id: FileID, _ prefix: String) throws {
            for child in try vault.children(of: id) {
                let path = prefix + "/" + child.name
                if child.type == .folder {
                    out[path] = .folder
                    try walk(child.id, path)
                } else {
                    out[path] = .document(try vault.readAll(child.id))
                }
            }
        }
        try walk(vault.rootID, "")
        return out
    }

    /// Both devices hold the same tree; returns it.
    func converged(sourceLocation: SourceLocation = #_sourceLocation) throws -> [String: Entry] {
        let (la, lb) = (try Self.listing(a), try Self.listing(b))
        #expect(la == lb, "the devices disagree", sourceLocation: sourceLocation)
        return la
    }
}

final class Ticks: Sendable {
    private let seconds = Atomic<Int64>(1_700_000_000)
    func next() -> Int64 { seconds.add(1, ordering: .relaxed).newValue }
}

private func bytes(_ s: String) -> [UInt8] { Array(s.utf8) }
private func text(_ s: String) -> TwoDevices.Entry { .document(Array(s.utf8)) }

@Suite struct MergeTests {
    @Test func concurrentRenameAndMoveLandOnceWhereTheFirstPushPutIt() throws {
        let d = try TwoDevices()
        let folder = try d.a.create(in: d.a.rootID, name: "dir", type: .folder, mode: 0o755)
        let file = try d.a.create(in: d.a.rootID, name: "f.txt", type: .document, mode: 0o644)
        try d.a.writeAll(file.id, bytes("same"))
        try d.settle()

        try d.a.rename(file.id, to: d.a.rootID, name: "renamed.txt")
        try d.b.rename(file.id, to: folder.id, name: "f.txt")
        try d.settle()

        let tree = try d.converged()
        #expect(tree == ["/dir": .folder, "/renamed.txt": text("same")])
    }

    @Test func anEditToADocumentDeletedElsewhereSurvivesAsANewFile() throws {
        let d = try TwoDevices()
        let file = try d.a.create(in: d.a.rootID, name: "notes.txt", type: .document, mode: 0o644)
        try d.a.writeAll(file.id, bytes("draft"))
        try d.settle()

        try d.a.remove(file.id)
        try d.b.writeAll(file.id, bytes("draft, edited"))
        try d.settle()

        let tree = try d.converged()
        #expect(tree == ["/notes.txt": text("draft, edited")])
        #expect(try d.a.resolve("/notes.txt").id != file.id, "the edit lives on as a new file")
    }

    /// A folder the server never saw, holding a file it knows, deleted whole: the file stays as a
    /// deletion to push, so its folder must stay too (pruning it once left the file's record
    /// naming a parent that was gone, and every later sync failed: randomized trial 1417501).
    @Test func aDeletedNewFolderHoldingASyncedFileKeepsItsRecordForTheFile() throws {
        let d = try TwoDevices()
        let file = try d.a.create(in: d.a.rootID, name: "f.txt", type: .document, mode: 0o644)
        try d.a.writeAll(file.id, bytes("synced"))
        try d.settle()

        let folder = try d.a.create(in: d.a.rootID, name: "new", type: .folder, mode: 0o755)
        try d.a.rename(file.id, to: folder.id, name: "f.txt")
        try d.a.remove(folder.id, recursive: true)
        #expect(try d.a.check().isClean)
        try d.settle()

        #expect(try d.converged() == [:])
        #expect(try d.a.check().isClean)
        #expect(try d.b.check().isClean)
    }

    @Test func twoNewFilesWithOneNameKeepBothTheLaterPushedAsACopy() throws {
        let d = try TwoDevices()
        try d.a.writeAll(try d.a.create(in: d.a.rootID, name: "a.txt", type: .document, mode: 0o644).id, bytes("A"))
        try d.b.writeAll(try d.b.create(in: d.b.rootID, name: "a.txt", type: .document, mode: 0o644).id, bytes("B"))
        try d.settle()

        #expect(try d.converged() == ["/a.txt": text("A"), "/a-1.txt": text("B")])
    }

    /// Run with the later writer syncing second and first, so "last to push wins" or "first to
    /// push wins" would each fail one of the two.
    @Test(arguments: [false, true]) func attributesMergeOneByOneAndTheLaterChangeWins(laterSyncsFirst: Bool) throws {
        let d = try TwoDevices()
        let file = try d.a.create(in: d.a.rootID, name: "f", type: .document, mode: 0o644)
        try d.settle()

        // Different attributes on each side: both survive.
        try d.a.setAttributes(file.id, AttributeChanges(mode: 0o600))
        try d.b.setXattr(file.id, name: "user.tag", value: bytes("blue"))
        // The same attribute on both: the later change wins, whichever device pushes it first
        // (A syncs first in `settle`).
        let (earlier, later) = laterSyncsFirst ? (d.b, d.a) : (d.a, d.b)
        try earlier.setAttributes(file.id, AttributeChanges(uid: 1001))
        try later.setAttributes(file.id, AttributeChanges(uid: 2002))
        try d.settle()

        for vault in [d.a, d.b] {
            let attributes = try vault.node(file.id).attributes
            #expect(attributes.mode.value == 0o600)
            #expect(attributes.liveXattrs == ["user.tag": bytes("blue")])
            #expect(attributes.uid.value == 2002)
        }
    }

    @Test func concurrentTextEditsMergeLineByLine() throws {
        let d = try TwoDevices()
        let file = try d.a.create(in: d.a.rootID, name: "list.txt", type: .document, mode: 0o644)
        try d.a.writeAll(file.id, bytes("one\ntwo\nthree\n"))
        try d.settle()

        try d.a.writeAll(file.id, bytes("ONE\ntwo\nthree\n"))
        try d.b.writeAll(file.id, bytes("one\ntwo\nTHREE\n"))
        try d.settle()

        #expect(try d.converged() == ["/list.txt": text("ONE\ntwo\nTHREE\n")])
    }

    @Test func concurrentBinaryEditsKeepThePulledBytesAndALocalCopy() throws {
        let d = try TwoDevices()
        let file = try d.a.create(in: d.a.rootID, name: "blob.bin", type: .document, mode: 0o644)
        try d.a.writeAll(file.id, [0, 1, 2, 3])
        try d.settle()

        try d.a.writeAll(file.id, [0, 1, 2, 0xAA])
        try d.b.writeAll(file.id, [0, 1, 2, 0xBB])
        try d.settle()

        #expect(
            try d.converged() == ["/blob.bin": .document([0, 1, 2, 0xAA]), "/blob-1.bin": .document([0, 1, 2, 0xBB])])
    }

    @Test func movesThatWouldMakeACycleAreUndoneOnTheSecondDevice() throws {
        let d = try TwoDevices()
        let x = try d.a.create(in: d.a.rootID, name: "x", type: .folder, mode: 0o755)
        let y = try d.a.create(in: d.a.rootID, name: "y", type: .folder, mode: 0o755)
        try d.settle()

        try d.a.rename(x.id, to: y.id, name: "x")
        try d.b.rename(y.id, to: x.id, name: "y")
        try d.settle()

        #expect(try d.converged() == ["/y": .folder, "/y/x": .folder])
    }
}
