import CofferContent
import CofferCrypto
import CofferModel
import Foundation
import Testing

@testable import CofferStore
@testable import CofferVault

@Suite("Vault content")
struct VaultContentTests {
    @Test func writeAllReadAllRoundTrip() throws {
        let f = try VaultFixture()
        let doc = try f.document("doc")
        #expect(try f.vault.readAll(doc.id) == [], "a new document is empty")
        for size in [1, 100, 256 * 1024 - 1, 256 * 1024, 256 * 1024 + 1, 700_000] {
            let data = noise((size + 7) / 8 * 8, seed: UInt64(size)).prefix(size).map { $0 }
            try f.vault.writeAll(doc.id, data)
            #expect(try f.vault.readAll(doc.id) == data, "size \(size)")
            #expect(try f.vault.node(doc.id).size == UInt64(size))
        }
        // Back to empty.
        try f.vault.writeAll(doc.id, [])
        #expect(try f.vault.readAll(doc.id) == [])
        #expect(try f.vault.node(doc.id).size == 0)
        // Survives reopening.
        try f.vault.writeAll(doc.id, Array("persisted".utf8))
        let reopened = try Vault.open(dataDirectory: f.dataDir)
        #expect(try reopened.readAll(doc.id) == Array("persisted".utf8))
        #expect(try f.vault.check().isClean)
    }

    @Test func writeContentsStreamsPieces() throws {
        let f = try VaultFixture()
        let doc = try f.document("doc")
        var pieces: [[UInt8]] = [Array("ab".utf8), [], Array("cd".utf8), noise(300_000, seed: 3)]
        let expected = pieces.flatMap { $0 }
        try f.vault.writeContents(doc.id, mtime: Timespec(seconds: 42)) { pieces.isEmpty ? nil : pieces.removeFirst() }
        #expect(try f.vault.readAll(doc.id) == expected)
        #expect(try f.vault.node(doc.id).attributes.mtime.value == Timespec(seconds: 42))
        var streamed: [UInt8] = []
        var calls = 0
        try f.vault.readContents(doc.id) {
            streamed += $0
            calls += 1
        }
        #expect(streamed == expected)
        #expect(calls >= 2, "read in chunk-sized pieces")
    }

    /// An imported file keeps any mtime: the epoch (reproducible tarballs), and times past what
    /// an open document holds until its commit (before 1677, after 2262). The epoch came back
    /// as the time of the write, and a far time trapped.
    @Test func writeContentsKeepsAnyModificationTime() throws {
        let f = try VaultFixture()
        let doc = try f.document("doc")
        for t in [
            Timespec(seconds: 0), Timespec(seconds: -1, nanoseconds: 999_999_999), Timespec(seconds: 40_000_000_000),
            Timespec(seconds: -40_000_000_000, nanoseconds: 3), Timespec(seconds: 1_700_000_000, nanoseconds: 5),
        ] {
            try f.vault.writeAll(doc.id, Array("x".utf8), mtime: t)
            #expect(try f.vault.node(doc.id).attributes.mtime.value == t)
            #expect(try f.vault.readAll(doc.id) == Array("x".utf8))
        }
    }

    @Test func openDocumentsAreNotFolders() throws {
        let f = try VaultFixture()
        let dir = try f.folder("dir")
        expectErrno(21) { _ = try f.vault.openDocument(dir.id) }
        let link = try f.vault.create(in: f.root, name: "l", type: .symlink, mode: 0o777, symlinkTarget: "x")
        expectErrno(22) { _ = try f.vault.openDocument(link.id) }
        expectErrno(2) { _ = try f.vault.openDocument(try FileID(random: randomBytes(16))) }
    }

    @Test func writesPastTheEndLeaveAZeroGap() throws {
        let f = try VaultFixture()
        let doc = try f.document("sparse", contents: Array("head".utf8))
        let h = try f.vault.openDocument(doc.id)
        try h.write(offset: 10, bytes: Array("tail".utf8))
        #expect(h.currentSize == 14)
        let expected = Array("head".utf8) + [0, 0, 0, 0, 0, 0] + Array("tail".utf8)
        #expect(try h.read(offset: 0, count: 100) == expected)
        #expect(try f.vault.node(doc.id).size == 14, "stat sees the open size")
        // A gap spanning several chunks.
        let far: UInt64 = 3 * 256 * 1024 + 5
        try h.write(offset: far, bytes: [7, 7])
        #expect(try h.read(offset: 14, count: 256 * 1024).allSatisfy { $0 == 0 })
        #expect(try h.read(offset: far - 2, count: 10) == [0, 0, 7, 7])
        try f.vault.release(h)
        let all = try f.vault.readAll(doc.id)
        #expect(all.count == Int(far) + 2)
        #expect(Array(all.prefix(14)) == expected)
        #expect(all[14..<Int(far)].allSatisfy { $0 == 0 })
        #expect(Array(all.suffix(2)) == [7, 7])
        #expect(try f.vault.check().isClean)
    }

    @Test func readsAtAndPastTheEnd() throws {
        let f = try VaultFixture()
        let doc = try f.document("d", contents: [1, 2, 3])
        let h = try f.vault.openDocument(doc.id)
        defer { try? f.vault.release(h) }
        #expect(try h.read(offset: 3, count: 10) == [])
        #expect(try h.read(offset: 100, count: 10) == [])
        #expect(try h.read(offset: 1, count: 0) == [])
        #expect(try h.read(offset: 1, count: 1) == [2])
    }

    @Test func truncateDownAndUp() throws {
        let f = try VaultFixture()
        let size = 600_000
        let data = noise(size, seed: 11)
        let doc = try f.document("t", contents: data)
        let h = try f.vault.openDocument(doc.id)
        // Down inside the first chunk, then up past where the data was: the tail reads as zeros.
        try h.truncate(to: 10)
        #expect(h.currentSize == 10)
        #expect(try h.read(offset: 0, count: 100) == Array(data.prefix(10)))
        try h.truncate(to: 300_000)
        let grown = try h.read(offset: 0, count: 300_000)
        #expect(grown.count == 300_000)
        #expect(Array(grown.prefix(10)) == Array(data.prefix(10)))
        #expect(grown[10...].allSatisfy { $0 == 0 }, "no old bytes resurface after truncate down + up")
        try h.flush()
        #expect(try f.vault.readAll(doc.id) == grown)
        // Down to a chunk boundary, then up again, after a flush.
        try h.write(offset: 0, bytes: data)
        try h.flush()
        try h.truncate(to: 256 * 1024)
        try h.flush()
        try h.truncate(to: 256 * 1024 + 100)
        try h.flush()
        let back = try f.vault.readAll(doc.id)
        #expect(back.count == 256 * 1024 + 100)
        #expect(Array(back.prefix(256 * 1024)) == Array(data.prefix(256 * 1024)))
        #expect(back[(256 * 1024)...].allSatisfy { $0 == 0 })
        // To zero.
        try h.truncate(to: 0)
        try f.vault.release(h)
        #expect(try f.vault.readAll(doc.id) == [])
        #expect(try f.vault.node(doc.id).size == 0)
        #expect(try f.vault.check().isClean)
    }

    @Test func truncateUpOfAFlushedShortFileReadsZeros() throws {
        let f = try VaultFixture()
        let doc = try f.document("t", contents: Array(repeating: 0xAB, count: 100))
        let h = try f.vault.openDocument(doc.id)
        _ = try h.read(offset: 0, count: 1)  // warm the chunk cache
        try h.truncate(to: 50)
        try h.truncate(to: 200)
        #expect(
            try h.read(offset: 0, count: 200) == Array(repeating: 0xAB, count: 50) + Array(repeating: 0, count: 150))
        try f.vault.release(h)
        #expect(try f.vault.readAll(doc.id) == Array(repeating: 0xAB, count: 50) + Array(repeating: 0, count: 150))
    }

    @Test func twoHandlesShareState() throws {
        let f = try VaultFixture()
        let doc = try f.document("shared", contents: Array("0123456789".utf8))
        let h1 = try f.vault.openDocument(doc.id)
        let h2 = try f.vault.openDocument(doc.id)
        #expect(h1 === h2)
        try h1.write(offset: 2, bytes: Array("AB".utf8))
        #expect(
            try h2.read(offset: 0, count: 10) == Array("01AB456789".utf8),
            "unflushed writes are visible to the other handle")
        try h2.truncate(to: 4)
        #expect(h1.currentSize == 4)
        // Releasing one keeps the other usable; the last release flushes.
        try f.vault.release(h1)
        try h2.write(offset: 4, bytes: Array("!".utf8))
        #expect(try h2.read(offset: 0, count: 10) == Array("01AB!".utf8))
        try f.vault.release(h2)
        #expect(try f.vault.readAll(doc.id) == Array("01AB!".utf8))
        // A fresh open after the last release is a new object reading committed content.
        let h3 = try f.vault.openDocument(doc.id)
        #expect(h3 !== h1)
        #expect(try h3.read(offset: 0, count: 10) == Array("01AB!".utf8))
        try f.vault.release(h3)
    }

    @Test func flushCommitsWithoutClosing() throws {
        let f = try VaultFixture()
        let doc = try f.document("d")
        let h = try f.vault.openDocument(doc.id)
        try h.write(offset: 0, bytes: Array("v1".utf8))
        try h.flush(durable: true)
        // Another vault on the same store sees the flushed content while the handle is still open.
        let other = try Vault.open(dataDirectory: f.dataDir)
        #expect(try other.readAll(doc.id) == Array("v1".utf8))
        try f.vault.release(h)
    }

    @Test func unlinkedOpenDocumentStaysUsableUntilRelease() throws {
        let f = try VaultFixture()
        let data = noise(600_000, seed: 5)  // three chunks
        let doc = try f.document("victim", contents: data)
        let h = try f.vault.openDocument(doc.id)
        try f.vault.remove(doc.id)
        expectErrno(2) { _ = try f.vault.resolve("victim") }
        #expect(try h.read(offset: 0, count: data.count) == data, "readable after unlink")
        try h.write(offset: 0, bytes: Array("still writable".utf8))
        #expect(try h.read(offset: 0, count: 14) == Array("still writable".utf8))
        try h.flush()  // must not resurrect the file
        #expect(try f.vault.lookup(f.root, "victim") == nil)
        #expect(try h.read(offset: 300_000, count: 10) == Array(data[300_000..<300_010]))
        try f.vault.release(h)
        #expect(try f.vault.lookup(f.root, "victim") == nil)
        #expect(try f.names() == [])
        // A new file may take the name.
        let again = try f.document("victim", contents: [1])
        #expect(try f.vault.readAll(again.id) == [1])
        #expect(try f.vault.check().isClean)
    }

    @Test func unlinkedOpenDocumentSurvivesGarbageCollection() throws {
        let f = try VaultFixture()
        let data = noise(800_000, seed: 6)  // four chunks
        let doc = try f.document("victim", contents: data)
        let h = try f.vault.openDocument(doc.id)
        try f.vault.remove(doc.id)
        _ = try f.vault.collectGarbage()
        // The handle holds the content until it is released (POSIX unlink semantics).
        #expect(try h.read(offset: 0, count: data.count) == data)
        try f.vault.release(h)
    }

    /// A large write spills sealed chunks to the store before the manifest naming them is
    /// committed; a collection in between must not take them.
    @Test func garbageCollectionDoesNotTakeSpilledChunksOfAnOpenDocument() throws {
        let f = try VaultFixture()
        let doc = try f.document("big")
        let data = randomBytes(Vault.writeBufferLimit + 4 * 256 * 1024)
        let h = try f.vault.openDocument(doc.id)
        try h.write(offset: 0, bytes: data)  // past the buffer limit: chunks are spilled
        h.waitForSpills()  // the spill runs behind the writer
        #expect(try f.chunkCount() > 0, "chunks were spilled before any commit")
        _ = try f.vault.collectGarbage()
        try f.vault.release(h)  // commits the manifest
        #expect(try f.vault.readAll(doc.id) == data)
        #expect(try f.vault.check().isClean)
    }

    /// The spill runs behind the writer: while it seals, the chunks it took are still the
    /// file's content, and writes, truncates and flushes racing it keep their own meaning.
    /// The spills are held (`spillHold`) until the racing calls are done, so every run checks
    /// the race, however fast the machine seals.
    @Test func writesTruncatesAndReadsRacingABackgroundSpill() throws {
        let f = try VaultFixture()
        let chunk = 256 * 1024
        let doc = try f.document("racing")
        let h = try f.vault.openDocument(doc.id)
        let gate = DispatchSemaphore(value: 0)
        h.spillHold.withLock { $0 = gate }
        var expected = randomBytes(Vault.writeBufferLimit + 2 * chunk)
        try h.write(offset: 0, bytes: expected)  // starts a spill of every full chunk
        #expect(h.isSpilling)
        // While the spill runs: reads see every byte.
        // (Compared as Bools: a failing #expect on two 16 MiB arrays would print them whole.)
        var same = try h.read(offset: 0, count: expected.count) == expected
        #expect(same, "read during the first spill")
        // Overwrite inside chunks the spill holds; the spill's result for them must not win.
        let patch = randomBytes(3 * chunk)
        try h.write(offset: UInt64(chunk + 17), bytes: patch)
        expected.replaceSubrange((chunk + 17)..<(chunk + 17 + patch.count), with: patch)
        same = try h.read(offset: 0, count: expected.count) == expected
        #expect(same, "read after the overwrite, spill still running")
        #expect(h.isSpilling)
        gate.signal()
        h.waitForSpills()
        same = try h.read(offset: 0, count: expected.count) == expected
        #expect(same, "read after the first spill landed")
        // Another spill, then a truncate down into the middle of it and back up: the cut-off
        // chunks read as zeros, not as what the spill stored.
        let more = randomBytes(Vault.writeBufferLimit + chunk)
        try h.write(offset: UInt64(expected.count), bytes: more)
        expected += more
        #expect(h.isSpilling)
        let cut = 5 * chunk + 1234
        try h.truncate(to: UInt64(cut))
        try h.truncate(to: UInt64(expected.count))
        expected.replaceSubrange(cut..<expected.count, with: [UInt8](repeating: 0, count: expected.count - cut))
        same = try h.read(offset: 0, count: expected.count) == expected
        #expect(same, "read after the truncates, second spill still running")
        #expect(h.isSpilling)
        gate.signal()
        h.waitForSpills()
        same = try h.read(offset: 0, count: expected.count) == expected
        #expect(same, "read after the second spill landed")
        h.spillHold.withLock { $0 = nil }
        // A flush right behind a spill commits exactly the current content.
        try h.write(offset: 0, bytes: randomBytes(Vault.writeBufferLimit + chunk))  // a third spill
        let head = try h.read(offset: 0, count: Vault.writeBufferLimit + chunk)
        expected.replaceSubrange(0..<head.count, with: head)
        try h.flush()
        try f.vault.release(h)
        same = try f.vault.readAll(doc.id) == expected
        #expect(same, "content after the flush")
        #expect(try f.vault.check().isClean)
    }

    /// The FUSE reader asks `mayTakeLong(.commit)` before a close, to decide whether another worker
    /// should read meanwhile: a small buffer is quick, a megabyte or a running spill is not.
    @Test func commitMayTakeLongTellsASmallCloseFromALargeOne() throws {
        let f = try VaultFixture()
        let doc = try f.document("closing")
        let h = try f.vault.openDocument(doc.id)
        #expect(!h.mayTakeLong(.commit), "nothing buffered")
        try h.write(offset: 0, bytes: randomBytes(4096))
        #expect(!h.mayTakeLong(.commit), "4 KiB buffered")
        try h.write(offset: 4096, bytes: randomBytes(1 << 20))
        #expect(h.mayTakeLong(.commit), "1 MiB more buffered")
        try h.flush()
        #expect(!h.mayTakeLong(.commit), "flushed")
        let gate = DispatchSemaphore(value: 0)
        h.spillHold.withLock { $0 = gate }
        try h.write(offset: 0, bytes: randomBytes(Vault.writeBufferLimit + 1))  // starts a spill
        #expect(h.isSpilling)
        try h.truncate(to: 10)  // drops the buffer, the spill still runs
        #expect(h.mayTakeLong(.commit), "a spill is running")
        gate.signal()
        h.waitForSpills()
        h.spillHold.withLock { $0 = nil }
        #expect(!h.mayTakeLong(.commit), "10 bytes buffered, the spill is over")
        try f.vault.release(h)
        #expect(try f.vault.readAll(doc.id).count == 10)
    }

    /// The last release commits what is buffered, and until that commit lands the document
    /// stays the one the vault hands out: an open or a setattr in between must see the new
    /// content (and its pending times) rather than the store's older version. The release is
    /// held inside its flush by holding a spill it has to wait for.
    @Test func releasedDocumentStaysRegisteredUntilItsCommitLands() throws {
        let f = try VaultFixture()
        let doc = try f.document("closing", contents: Array("old".utf8))
        let h = try f.vault.openDocument(doc.id)
        let gate = DispatchSemaphore(value: 0)
        h.spillHold.withLock { $0 = gate }
        let data = randomBytes(Vault.writeBufferLimit + 256 * 1024)
        try h.write(offset: 0, bytes: data)  // starts a spill, held at the gate
        #expect(h.isSpilling)
        let released = DispatchSemaphore(value: 0)
        let vault = f.vault
        Thread {
            try? vault.release(h)
            released.signal()
        }.start()
        usleep(100_000)  // the release is now waiting for the spill inside its flush
        #expect(released.wait(timeout: .now()) == .timedOut, "the release waits for the spill")
        #expect(vault.registeredDocument(doc.id) === h, "still registered while it commits")
        let again = try vault.openDocument(doc.id)
        #expect(again === h)
        let head = try again.read(offset: 0, count: 16)
        #expect(head == Array(data.prefix(16)), "a new open reads what was written, not the store's version")
        gate.signal()
        #expect(released.wait(timeout: .now() + 30) == .success)
        h.spillHold.withLock { $0 = nil }
        try vault.release(again)
        #expect(vault.registeredDocument(doc.id) == nil, "gone once the last handle is released")
        let stored = try vault.readAll(doc.id)
        let same = stored == data
        #expect(same, "the release committed the content")
    }

    @Test func replacedOpenDocumentStaysReadable() throws {
        let f = try VaultFixture()
        let old = try f.document("target", contents: Array("old content".utf8))
        let new = try f.document("new", contents: Array("new content".utf8))
        let h = try f.vault.openDocument(old.id)
        try f.vault.rename(new.id, to: f.root, name: "target")
        #expect(try h.read(offset: 0, count: 100) == Array("old content".utf8))
        try f.vault.release(h)
        #expect(try f.vault.readAll(try f.vault.resolve("target").id) == Array("new content".utf8))
    }

    /// Changing one byte of a large file re-seals only the chunk under it.
    @Test func oneByteChangeOfA64MiBFileWritesAtMostTwoChunks() throws {
        let f = try VaultFixture()
        let size = 64 << 20
        let data = randomBytes(size)  // non-repeating, so no two chunks dedup
        let doc = try f.document("big")
        try f.vault.writeAll(doc.id, data)
        let before = try f.chunkCount()
        #expect(before == size / (256 * 1024), "one chunk per 256 KiB")
        #expect(try f.vault.node(doc.id).size == UInt64(size))

        let offset = 40_000_123
        let h = try f.vault.openDocument(doc.id)
        try h.write(offset: UInt64(offset), bytes: [data[offset] ^ 0xFF])
        try h.flush()
        let after = try f.chunkCount()
        #expect(after > before, "the changed chunk was stored")
        #expect(after - before <= 2, "wrote \(after - before) chunks")
        // The change is there and nothing else moved.
        #expect(
            try h.read(offset: UInt64(offset - 1), count: 3) == [
                data[offset - 1], data[offset] ^ 0xFF, data[offset + 1],
            ])
        #expect(try h.read(offset: 0, count: 1000) == Array(data.prefix(1000)))
        #expect(try h.read(offset: UInt64(size - 1000), count: 1000) == Array(data.suffix(1000)))
        try f.vault.release(h)
        #expect(try f.chunkCount() == after, "closing re-seals nothing")
        #expect(try f.vault.node(doc.id).size == UInt64(size))
    }

    @Test func garbageCollectionReclaimsOldVersions() throws {
        let f = try VaultFixture()
        let doc = try f.document("d", contents: noise(300_000, seed: 1))
        #expect(try f.chunkCount() == 2)
        try f.vault.writeAll(doc.id, noise(300_000, seed: 2))
        #expect(try f.chunkCount() == 4)
        let r = try f.vault.collectGarbage()
        #expect(r?.chunks == 2)
        #expect(try f.chunkCount() == 2)
        #expect(try f.vault.readAll(doc.id) == noise(300_000, seed: 2))
        // While another vault has the store open, collection is refused (it could race a writer).
        let other = try Vault.open(dataDirectory: f.dataDir)
        let refused = try f.vault.collectGarbage() == nil
        #expect(refused)
        _ = other
    }

    @Test func identicalChunksAreStoredOnce() throws {
        let f = try VaultFixture()
        let chunk = noise(256 * 1024, seed: 9)
        try f.document("d", contents: chunk + chunk + chunk)
        #expect(try f.chunkCount() == 1)
        try f.document("zeros", contents: [UInt8](repeating: 0, count: 4 * 256 * 1024))
        #expect(try f.chunkCount() == 2)
    }

    @Test func aNewDocumentStoresNoManifestUntilItHasContent() throws {
        let f = try VaultFixture()
        let manifests = { try f.vault.store.read { try $0.count("SELECT COUNT(*) FROM manifests") } }
        let doc = try f.document("empty")
        #expect(try manifests() == 0, "creating a file writes no manifest row")
        #expect(try f.vault.readAll(doc.id) == [])
        #expect(try f.vault.node(doc.id).size == 0)
        #expect(try f.vault.check().isClean)
        try f.vault.writeAll(doc.id, Array("now some".utf8))
        #expect(try manifests() == 1)
        let reopened = try Vault.open(dataDirectory: f.dataDir)
        #expect(try reopened.readAll(doc.id) == Array("now some".utf8))
        // Back to empty names a sealed empty manifest, which replaces the old one.
        try f.vault.writeAll(doc.id, [])
        #expect(try manifests() == 1)
        #expect(try f.vault.readAll(doc.id) == [])
    }

    @Test func aReadSpanningChunksOpensThemAllAndNamesAMissingOne() throws {
        let f = try VaultFixture()
        let data = noise(5 * 256 * 1024 + 123, seed: 9)
        let doc = try f.document("big", contents: data)
        // A fresh vault has nothing cached: one read of 1 MiB opens four chunks at once.
        let reader = try Vault.open(dataDirectory: f.dataDir)
        let h = try reader.openDocument(doc.id)
        #expect(try h.read(offset: 100_000, count: 1 << 20) == Array(data[100_000..<100_000 + (1 << 20)]))
        #expect(try h.read(offset: 0, count: data.count + 10) == data)
        try reader.release(h)
        // With one chunk gone, a read over it fails with a clear error instead of returning holes.
        _ = try f.sqlite("DELETE FROM chunks WHERE rowid = (SELECT MAX(rowid) FROM chunks);")
        let again = try Vault.open(dataDirectory: f.dataDir)
        let h2 = try again.openDocument(doc.id)
        defer { try? again.release(h2) }
        let error = #expect(throws: (any Error).self) { _ = try h2.read(offset: 0, count: data.count) }
        #expect(String(describing: error).contains("missing"), "\(String(describing: error))")
    }

    @Test func wholeChunkReadsMatchPiecewiseReads() throws {
        let f = try VaultFixture()
        let data = noise(256 * 1024 + 5000, seed: 11)
        let doc = try f.document("f", contents: data)
        let fresh = try Vault.open(dataDirectory: f.dataDir)
        let h = try fresh.openDocument(doc.id)
        // Exactly the first chunk, exactly the short last one (uncached, then cached), and
        // a read that asks for more than the last chunk holds.
        #expect(try h.read(offset: 0, count: 256 * 1024) == Array(data[0..<256 * 1024]))
        #expect(try h.read(offset: 256 * 1024, count: 5000) == Array(data[(256 * 1024)...]))
        #expect(try h.read(offset: 256 * 1024, count: 5000) == Array(data[(256 * 1024)...]))
        #expect(try h.read(offset: 256 * 1024, count: 1 << 20) == Array(data[(256 * 1024)...]))
        // Unflushed writes: a dirty chunk read whole, and one grown by a truncate up.
        try h.write(offset: 256 * 1024, bytes: [1, 2, 3])
        #expect(try h.read(offset: 256 * 1024, count: 5000) == [1, 2, 3] + Array(data[(256 * 1024 + 3)...]))
        try h.truncate(to: 256 * 1024 + 6000)
        #expect(
            try h.read(offset: 256 * 1024, count: 6000) == [1, 2, 3] + Array(data[(256 * 1024 + 3)...])
                + [UInt8](repeating: 0, count: 1000))
        try fresh.release(h)
        #expect(try fresh.readAll(doc.id).count == 256 * 1024 + 6000)
    }

    /// A document deleted by another process while open here, with writes buffered: the commit
    /// finds it deleted (inside its own write) and commits nothing, and the handle still reads
    /// what was written (unlinked-while-open semantics). Before, the commit reported success, so
    /// the chunks its buffers named were never stored and the next read failed.
    @Test func writesToADocumentDeletedElsewhereStayReadableThroughTheHandle() throws {
        let f = try VaultFixture()
        let doc = try f.document("a.txt", contents: Array("before".utf8))
        let mount = try Vault.open(dataDirectory: f.dataDir)
        let open = try mount.openDocument(doc.id)
        try open.write(offset: 0, bytes: Array("written while open".utf8))
        try f.vault.remove(doc.id, recursive: false)
        try open.flush()
        #expect(try open.read(offset: 0, count: 100) == Array("written while open".utf8))
        try mount.release(open)
    }

    /// Content another process committed with another chunk size (the format allows any; a
    /// device of another build may choose one) is read by that size in a document open here:
    /// adopting kept the old size, and read the first 4-byte chunk as if it were 256 KiB long.
    @Test func adoptedContentIsReadByItsOwnChunkSize() throws {
        let f = try VaultFixture()
        let doc = try f.document("a.txt", contents: Array("before".utf8))
        let mount = try Vault.open(dataDirectory: f.dataDir)
        let open = try mount.openDocument(doc.id)
        #expect(try open.read(offset: 0, count: 100) == Array("before".utf8))
        let text = Array("written elsewhere in four-byte chunks".utf8)
        let cipher = ContentCipher(fileID: doc.id, key: try f.vault.state.withLock { try $0.view.key(doc.id) })
        var plain: [[UInt8]: [UInt8]] = [:]
        var refs: [ChunkRef] = []
        for start in stride(from: 0, to: text.count, by: 4) {
            let piece = Array(text[start..<min(start + 4, text.count)])
            let id = piece.withUnsafeBytes { cipher.chunkID($0) }
            plain[id] = piece
            refs.append(ChunkRef(id: id, length: UInt32(piece.count)))
        }
        _ = try f.vault.commitContent(
            id: doc.id, cipher: cipher, manifest: Manifest(chunkSize: 4, chunks: refs),
            mtime: Timespec(seconds: 7), ctime: Timespec(seconds: 7), unsealed: plain)
        _ = try mount.refreshAll()
        #expect(open.currentSize == UInt64(text.count))
        #expect(try open.read(offset: 0, count: 100) == text)
        #expect(try open.read(offset: 9, count: 6) == Array(text[9..<15]))
        // A write after adopting builds on the adopted chunks, at their size.
        try open.write(offset: 0, bytes: Array("W".utf8))
        try open.flush()
        #expect(try Vault.open(dataDirectory: f.dataDir).readAll(doc.id) == Array("W".utf8) + text.dropFirst())
        try mount.release(open)
    }

    /// A process that has not caught up with another's commit yet (the daemon between its
    /// polls) opens a document whose content that commit replaced: its old manifest is gone,
    /// and the open takes in the commit and reads the new content, where it reported the store
    /// damaged; the daemon's next poll still reports the change, so the kernel hears of it.
    @Test func anOpenBetweenPollsFindsContentReplacedElsewhere() throws {
        let f = try VaultFixture()
        let doc = try f.document("a.txt", contents: Array("first".utf8))
        let mount = try Vault.open(dataDirectory: f.dataDir)
        #expect(try mount.readAll(doc.id) == Array("first".utf8))
        try f.vault.writeAll(doc.id, Array("second".utf8))
        #expect(try mount.readAll(doc.id) == Array("second".utf8))
        #expect(try mount.refresh().contains(doc.id))
    }

    /// The same, for content the server has (its base row keeps the old manifest, so nothing is
    /// missing): the open still takes in the other process's commit, and a write through it
    /// builds on that version (before, it built on the old one and replaced the other
    /// process's write).
    @Test func anOpenBetweenPollsBuildsOnContentReplacedElsewhere() throws {
        let f = try VaultFixture()
        let doc = try f.document("a.txt", contents: Array("first".utf8))
        // As a push leaves it: the record is the base's, nothing local.
        try f.vault.store.write { w in
            let stored = try #require(try w.reader.file(doc.id, .local))
            try w.put(stored, .base)
            try w.remove(doc.id, .local)
        }
        let mount = try Vault.open(dataDirectory: f.dataDir)
        #expect(try mount.readAll(doc.id) == Array("first".utf8))
        try Vault.open(dataDirectory: f.dataDir).writeAll(doc.id, Array("second".utf8))
        let open = try mount.openDocument(doc.id)
        #expect(try open.read(offset: 0, count: 100) == Array("second".utf8))
        try open.write(offset: 0, bytes: Array("S".utf8))
        try mount.release(open)
        #expect(try Vault.open(dataDirectory: f.dataDir).readAll(doc.id) == Array("Second".utf8))
        #expect(try mount.refresh().contains(doc.id))
    }
}
