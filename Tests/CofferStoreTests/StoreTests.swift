import CofferModel
import Foundation
import Testing

@testable import CofferStore

/// A fresh directory under the system temp dir, removed by `cleanup`.
func makeTempDir() -> String {
    let path = NSTemporaryDirectory() + "coffer-store-test-" + UUID().uuidString
    try! FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true)
    return path
}

func cleanup(_ path: String) { try? FileManager.default.removeItem(atPath: path) }

func fid(_ n: Int) -> FileID {
    try! FileID(bytes: [UInt8](repeating: 0, count: 14) + [UInt8(n >> 8), UInt8(n & 0xff)])
}
let owner = try! AccountID(bytes: [UInt8](repeating: 3, count: 32))

func record(
    _ id: Int, parent: Int, name: String = "n", digest: [UInt8]? = nil, deleted: Bool = false,
    version: Int64 = 0, contentVersion: Int64 = 0
) -> StoredFile {
    let m = FileMetadata(
        id: fid(id), type: digest == nil ? .folder : .document, parent: fid(parent),
        name: SealedName(ciphertext: Array(name.utf8), mac: Array(name.utf8)), owner: owner,
        isDeleted: deleted, wrappedKey: [1], sealedAttributes: [2], contentDigest: digest, lastModifiedBy: owner)
    return StoredFile(
        signed: SignedMetadata(metadata: m, signature: [UInt8](repeating: UInt8(id & 0xff), count: 64)),
        version: version, contentVersion: contentVersion)
}

func chunkID(_ n: UInt8) -> [UInt8] { [UInt8](repeating: n, count: 32) }
func digest(_ n: UInt8) -> [UInt8] { [UInt8](repeating: 0xD0 | n, count: 32) }

/// Runs `body` with a store in a temp dir.
func withStore<T>(_ body: (Store, String) throws -> T) throws -> T {
    let dir = makeTempDir()
    defer { cleanup(dir) }
    let store = try Store(directory: dir + "/data")
    return try body(store, dir + "/data")
}

@Suite("Store")
struct StoreTests {
    @Test func opensWithPrivatePermissions() throws {
        try withStore { store, dir throws in
            var st = stat()
            #expect(stat(dir, &st) == 0)
            #expect(st.st_mode & 0o777 == 0o700)
            #expect(stat(store.databasePath, &st) == 0)
            #expect(st.st_mode & 0o777 == 0o600)
            #expect(store.databasePath == dir + "/coffer.sqlite")
            // The log and shared memory hold the same pages: private too, from the first open.
            try store.write { w in try w.put(record(1, parent: 1), .local) }
            for suffix in ["-wal", "-shm"] {
                #expect(stat(store.databasePath + suffix, &st) == 0)
                #expect(st.st_mode & 0o777 == 0o600, "\(suffix)")
            }
        }
    }

    @Test func putAndGetOnBothSides() throws {
        try withStore { store, _ throws in
            let base = record(1, parent: 1, name: "base", version: 5, contentVersion: 6)
            let local = record(1, parent: 1, name: "local")
            try store.write { w throws in
                try w.put(base, .base)
                try w.put(record(2, parent: 1, name: "only-base"), .base)
            }
            try store.read { r throws in
                #expect(try r.file(fid(1), .base) == base)
                #expect(try r.file(fid(1), .local) == nil)
                #expect(try r.current(fid(1)) == base)
                #expect(try r.files(.base).count == 2)
                #expect(try r.files(.local).isEmpty)
                #expect(try r.file(fid(1), .base)?.version == 5)
                #expect(try r.file(fid(1), .base)?.contentVersion == 6)
            }
            try store.write { w in try w.put(local, .local) }
            try store.read { r throws in
                #expect(try r.current(fid(1)) == local, "local over base")
                #expect(try r.current(fid(2))?.metadata.name.mac == Array("only-base".utf8))
                #expect(try r.current(fid(3)) == nil)
                #expect(try r.file(fid(1), .base) == base, "base untouched")
            }
            // Overwrite in place.
            let newer = record(1, parent: 1, name: "local2", version: 9)
            try store.write { w in try w.put(newer, .local) }
            #expect(try store.read { try $0.file(fid(1), .local) } == newer)
            #expect(try store.read { try $0.files(.local).count } == 1)
            // Remove.
            try store.write { w in try w.remove(fid(1), .local) }
            #expect(try store.read { try $0.current(fid(1)) } == base)
        }
    }

    @Test func failedWriteTransactionLeavesNothing() throws {
        try withStore { store, _ throws in
            struct Boom: Error {}
            #expect(throws: Boom.self) {
                try store.write { w throws in
                    try w.put(record(1, parent: 1), .local)
                    try w.putChunk(id: chunkID(1), sealed: [1])
                    throw Boom()
                }
            }
            try store.read { r throws in
                #expect(try r.files(.local).isEmpty)
                #expect(try r.hasChunk(chunkID(1)) == false)
                #expect(try r.lastChange() == 0)
            }
        }
    }

    @Test func changeLog() throws {
        try withStore { store, _ throws in
            #expect(try store.read { try $0.lastChange() } == 0)
            try store.write { w in
                try w.put(record(1, parent: 1), .local)
                try w.put(record(2, parent: 1), .base)
            }
            let (ids1, last1) = try store.read { try $0.changes(after: 0) }
            #expect(ids1 == [fid(1), fid(2)])
            #expect(last1 == 2)
            #expect(try store.read { try $0.lastChange() } == 2)
            let logged = try store.write { w -> [Int64?] in
                let before = w.lastLogged
                try w.put(record(3, parent: 1), .local)
                try w.remove(fid(1), .local)
                return [before, w.lastLogged]
            }
            #expect(logged == [nil, 4], "a writer knows the sequence number of what it logged")
            let (ids2, last2) = try store.read { try $0.changes(after: last1) }
            #expect(ids2 == [fid(3), fid(1)])
            #expect(last2 == 4)
            let (ids3, last3) = try store.read { try $0.changes(after: last2) }
            #expect(ids3.isEmpty)
            #expect(last3 == last2)
            try store.write { w in try w.logChange(fid(7)) }
            #expect(try store.read { try $0.changes(after: last2) }.ids == [fid(7)])
            // Trimming keeps the newest entries.
            try store.write { w in try w.trimChangeLog(keeping: 2) }
            #expect(try store.read { try $0.count("SELECT COUNT(*) FROM change_log") } == 2)
            #expect(try store.read { try $0.lastChange() } == 5)
            #expect(try store.read { try $0.changes(after: 0) }.ids == [fid(1), fid(7)])
        }
    }

    @Test func twoStoresOnOneDirectorySeeEachOther() throws {
        try withStore { a, dir throws in
            let b = try Store(directory: dir)
            try a.write { try $0.put(record(1, parent: 1, name: "x"), .local) }
            #expect(try b.read { try $0.current(fid(1)) }?.metadata.name.mac == Array("x".utf8))
            try b.write { try $0.put(record(2, parent: 1), .local) }
            #expect(try a.read { try $0.changes(after: 1) }.ids == [fid(2)])
        }
    }

    /// The files numbered other than by their hash: each keeps its number, a second one for the
    /// same file replaces the first, no two files share one, and forgetting drops the row; all
    /// of it survives reopening.
    @Test func inodeExceptionsAreKeptReplacedAndForgotten() throws {
        try withStore { store, dir throws in
            let base: UInt64 = 1 << 62
            try store.write { w in
                for i in 2..<20 { try w.addInodeException(fid(i), base + UInt64(i)) }
                try w.addInodeException(fid(5), base + 100)
            }
            var expected = Dictionary(uniqueKeysWithValues: (2..<20).map { (fid($0), base + UInt64($0)) })
            expected[fid(5)] = base + 100
            func held(_ s: Store) throws -> [FileID: UInt64] {
                Dictionary(uniqueKeysWithValues: try s.read { try $0.inodeExceptions() }.map { ($0.id, $0.inode) })
            }
            #expect(try held(store) == expected)
            #expect(throws: (any Error).self, "one number, one file") {
                try store.write { try $0.addInodeException(fid(30), base + 3) }
            }
            #expect(throws: (any Error).self, "numbers stay below 2^63") {
                try store.write { try $0.addInodeException(fid(31), UInt64(Int64.max) + 1) }
            }
            try store.write { try $0.forgetInode(of: fid(9)) }
            expected[fid(9)] = nil
            #expect(try held(store) == expected)
            #expect(try held(try Store(directory: dir)) == expected)
        }
    }

    @Test func putChunkIsIdempotent() throws {
        try withStore { store, _ throws in
            try store.write { w throws in
                try w.putChunk(id: chunkID(1), sealed: [1, 2, 3])
                try w.putChunk(id: chunkID(1), sealed: [1, 2, 3])
            }
            try store.write { w in try w.putChunk(id: chunkID(1), sealed: [9, 9]) }
            try store.read { r throws in
                #expect(try r.count("SELECT COUNT(*) FROM chunks") == 1)
                #expect(try r.chunk(chunkID(1)) == [1, 2, 3], "the first stored copy stays")
                #expect(try r.hasChunk(chunkID(1)))
                #expect(try !r.hasChunk(chunkID(2)))
                #expect(try r.chunk(chunkID(2)) == nil)
                #expect(try r.allChunkIDs() == [chunkID(1)])
            }
            // putManifest is idempotent too, and dedups its chunk list.
            try store.write { w throws in
                try w.putManifest(digest: digest(1), sealed: [7], chunkIDs: [chunkID(1), chunkID(1), chunkID(2)])
                try w.putManifest(digest: digest(1), sealed: [7], chunkIDs: [chunkID(1)])
            }
            try store.read { r throws in
                #expect(try r.manifest(digest(1)) == [7])
                #expect(try r.count("SELECT COUNT(*) FROM manifests") == 1)
                #expect(Set(try r.chunkIDs(ofManifest: digest(1))) == [chunkID(1), chunkID(2)])
                #expect(try r.allManifestDigests() == [digest(1)])
            }
        }
    }

    @Test func garbageCollectionRemovesOnlyUnreferencedContent() throws {
        try withStore { store, _ throws in
            try store.write { w throws in
                // M1 named by a local record, M2 by a base record, M3 by nothing.
                try w.putManifest(digest: digest(1), sealed: [1], chunkIDs: [chunkID(1), chunkID(9)])
                try w.putManifest(digest: digest(2), sealed: [2], chunkIDs: [chunkID(2), chunkID(9)])
                try w.putManifest(digest: digest(3), sealed: [3], chunkIDs: [chunkID(3)])
                // Chunk 4 is in no manifest.
                for c: UInt8 in [1, 2, 3, 4, 9] { try w.putChunk(id: chunkID(c), sealed: [c]) }
                try w.put(record(1, parent: 1), .local)
                try w.put(record(10, parent: 1, digest: digest(1)), .local)
                try w.put(record(11, parent: 1, digest: digest(2)), .base)
            }
            let result = try store.collectGarbage()
            #expect(result.manifests == 1)
            #expect(result.chunks == 2)
            try store.read { r throws in
                #expect(Set(try r.allManifestDigests()) == [digest(1), digest(2)])
                #expect(Set(try r.allChunkIDs()) == [chunkID(1), chunkID(2), chunkID(9)])
                #expect(try r.chunkIDs(ofManifest: digest(3)).isEmpty)
            }
            // Nothing more to collect.
            let again = try store.collectGarbage()
            #expect(again.manifests == 0 && again.chunks == 0)
        }
    }

    @Test func changingAContentDigestReleasesTheOldManifest() throws {
        try withStore { store, _ throws in
            try store.write { w throws in
                try w.putManifest(digest: digest(1), sealed: [1], chunkIDs: [chunkID(1)])
                try w.putManifest(digest: digest(2), sealed: [2], chunkIDs: [chunkID(2)])
                try w.putChunk(id: chunkID(1), sealed: [1])
                try w.putChunk(id: chunkID(2), sealed: [2])
                try w.put(record(10, parent: 1, digest: digest(1)), .local)
            }
            // New content version: the old manifest is no longer named by anything.
            try store.write { w in try w.put(record(10, parent: 1, digest: digest(2)), .local) }
            try store.read { r throws in
                #expect(try r.manifest(digest(1)) == nil)
                #expect(try r.chunkIDs(ofManifest: digest(1)).isEmpty)
                #expect(try r.manifest(digest(2)) == [2])
                #expect(try r.hasChunk(chunkID(1)), "chunks wait for garbage collection")
            }
            #expect(try store.collectGarbage().chunks == 1)
            #expect(try store.read { try $0.hasChunk(chunkID(1)) } == false)
            #expect(try store.read { try $0.hasChunk(chunkID(2)) })
        }
    }

    @Test func aManifestStillNamedElsewhereIsKept() throws {
        try withStore { store, _ throws in
            try store.write { w throws in
                try w.putManifest(digest: digest(1), sealed: [1], chunkIDs: [chunkID(1)])
                try w.putManifest(digest: digest(2), sealed: [2], chunkIDs: [])
                try w.put(record(10, parent: 1, digest: digest(1)), .base)
                try w.put(record(10, parent: 1, digest: digest(1)), .local)
            }
            // The local edit moves on; base still names digest 1.
            try store.write { w in try w.put(record(10, parent: 1, digest: digest(2)), .local) }
            #expect(try store.read { try $0.manifest(digest(1)) } == [1])
            #expect(try store.read { try $0.chunkIDs(ofManifest: digest(1)) } == [chunkID(1)])
            // Re-putting the same digest releases nothing.
            try store.write { w in try w.put(record(10, parent: 1, name: "renamed", digest: digest(2)), .local) }
            #expect(try store.read { try $0.manifest(digest(2)) } == [2])
            // Removing records leaves their manifests, like chunks, to garbage collection,
            // which keeps what a remaining record names.
            try store.write { w in try w.remove(fid(10), .base) }
            #expect(try store.read { try $0.manifest(digest(1)) } == [1])
            #expect(try store.collectGarbage().manifests == 1)
            #expect(try store.read { try $0.manifest(digest(1)) } == nil)
            #expect(try store.read { try $0.manifest(digest(2)) } == [2], "the local record still names it")
            try store.write { w in try w.remove(fid(10), .local) }
            #expect(try store.collectGarbage().manifests == 1)
            #expect(try store.read { try $0.manifest(digest(2)) } == nil)
            #expect(try store.read { try $0.chunkIDs(ofManifest: digest(1)) } == [], "its chunk list goes with it")
        }
    }

    @Test func twoFilesSharingADigest() throws {
        try withStore { store, _ throws in
            try store.write { w throws in
                try w.putManifest(digest: digest(1), sealed: [1], chunkIDs: [])
                try w.put(record(10, parent: 1, digest: digest(1)), .local)
                try w.put(record(11, parent: 1, digest: digest(1)), .local)
                try w.put(record(10, parent: 1, digest: nil), .local)
            }
            #expect(try store.read { try $0.manifest(digest(1)) } == [1], "file 11 still names it")
        }
    }

    @Test func settings() throws {
        try withStore { store, dir throws in
            #expect(try store.read { try $0.setting("k") } == nil)
            try store.write { try $0.setSetting("k", [1, 2]) }
            try store.write { try $0.setSetting("k", [3]) }
            #expect(try store.read { try $0.setting("k") } == [3])
            try store.makeDurable()
            try store.vacuum()
            #expect(try Store(directory: dir).read { try $0.setting("k") } == [3])
        }
    }

    @Test func reopeningKeepsEverything() throws {
        let dir = makeTempDir()
        defer { cleanup(dir) }
        do {
            let s = try Store(directory: dir)
            try s.write { w throws in
                try w.put(record(1, parent: 1, name: "r", version: 3), .base)
                try w.putChunk(id: chunkID(5), sealed: [5])
            }
        }
        let s = try Store(directory: dir)
        #expect(try s.read { try $0.file(fid(1), .base) } == record(1, parent: 1, name: "r", version: 3))
        #expect(try s.read { try $0.chunk(chunkID(5)) } == [5])
        #expect(try s.read { try $0.lastChange() } == 1)
    }

    /// A store with an applied migration this build has not registered (a newer build's, or a
    /// pre-release one's) is refused with a reason, not opened as if it had the current format.
    @Test func aStoreOfAnUnknownFormatIsRefused() throws {
        let dir = makeTempDir()
        defer { cleanup(dir) }
        do {
            let s = try Store(directory: dir)
            try s.write { w throws in
                try w.withDatabase { db in try db.execute(sql: "INSERT INTO grdb_migrations VALUES ('v999')") }
            }
        }
        let error = #expect(throws: StoreError.self) { _ = try Store(directory: dir) }
        #expect(error?.message.contains("a format this build does not know") == true)
    }

    /// What the sync scheduler polls (unpushed changes) and what account creation checks
    /// (an empty store), each as one named query.
    @Test func localChangesAndRecordsAreReported() throws {
        try withStore { store, _ throws in
            #expect(try !store.hasLocalChanges())
            #expect(try !store.read { try $0.hasFiles() })
            try store.write { w throws in try w.put(record(1, parent: 1), .base) }
            #expect(try !store.hasLocalChanges())
            #expect(try store.read { try $0.hasFiles() })
            try store.write { w throws in try w.put(record(2, parent: 1), .local) }
            #expect(try store.hasLocalChanges())
            #expect(try store.read { try $0.hasLocalChanges() })
        }
    }
}
