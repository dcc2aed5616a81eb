import CofferModel
import Foundation
import Synchronization
import Testing

@testable import CofferVault

/// Sizes at and past the limit, sparse files, and reads that race each other.
@Suite("Vault limits and sparse content")
struct VaultLimitsTests {
    @Test func pastTheLargestDocumentIsEFBIGAndChangesNothing() throws {
        let f = try VaultFixture()
        let doc = try f.document("doc", contents: Array("keep".utf8))
        let open = try f.vault.openDocument(doc.id)
        defer { try? f.vault.release(open) }
        // pjdfstest truncate/12 asks for 999999999999999 bytes; that once aborted the daemon.
        expectErrno(27) { try open.truncate(to: 999_999_999_999_999) }
        expectErrno(27) { try open.truncate(to: Vault.maxDocumentSize + 1) }
        expectErrno(27) { try open.write(offset: Vault.maxDocumentSize, bytes: [1]) }
        expectErrno(27) { try open.write(offset: UInt64.max - 1, bytes: [1, 2, 3]) }
        try open.flush()
        #expect(try f.vault.readAll(doc.id) == Array("keep".utf8))
        #expect(try f.vault.check().isClean)
    }

    @Test func aHugeSparseFileCostsOneZeroChunk() throws {
        let f = try VaultFixture()
        let doc = try f.document("sparse")
        let open = try f.vault.openDocument(doc.id)
        let size: UInt64 = 10 << 30  // 10 GiB of hole: 40,960 chunks
        try open.truncate(to: size)
        try open.write(offset: size - 4, bytes: Array("tail".utf8))
        try open.flush()
        // Sealing the hole must not hash 10 GiB: one zero chunk stands for all 40,959 gaps.
        let hashed = open.state.withLock { $0.holesHashed }
        #expect(hashed == 1, "\(hashed) zero chunks built and hashed")
        try f.vault.release(open)
        #expect(try f.vault.node(doc.id).size == size)
        #expect(try f.chunkCount() <= 3, "holes share one zero chunk (plus the partial last one)")
        let reader = try f.vault.openDocument(doc.id)
        defer { try? f.vault.release(reader) }
        #expect(try reader.read(offset: 5 << 30, count: 8) == [UInt8](repeating: 0, count: 8))
        #expect(try reader.read(offset: size - 4, count: 100) == Array("tail".utf8))
    }

    @Test func parallelReadsOfOneDocumentAgree() throws {
        let f = try VaultFixture()
        let data = noise(3 << 20, seed: 11)  // 12 chunks
        let doc = try f.document("big", contents: data)
        let open = try f.vault.openDocument(doc.id)
        defer { try? f.vault.release(open) }
        let failures = Mutex<[String]>([])
        DispatchQueue.concurrentPerform(iterations: 48) { i in
            let offset = (i * 131_071) % (data.count - 200_000)
            do {
                let got = try open.read(offset: UInt64(offset), count: 200_000)
                if got != Array(data[offset..<(offset + 200_000)]) {
                    failures.withLock { $0.append("offset \(offset)") }
                }
            } catch {
                failures.withLock { $0.append("offset \(offset): \(error)") }
            }
        }
        #expect(failures.withLock { $0 }.isEmpty)
    }

    @Test func writesSealedOnSeveralThreadsReadBackExactly() throws {
        let f = try VaultFixture()
        let doc = try f.document("spilled")
        // Past the write buffer, so full chunks are sealed in parallel batches (spill) and the
        // rest at flush; a few chunks repeat to exercise de-duplication within one batch.
        let block = noise(256 * 1024, seed: 5)
        var data: [UInt8] = []
        for i in 0..<80 { data += i % 10 == 3 ? block : noise(256 * 1024, seed: UInt64(100 + i)) }
        data += noise(1000, seed: 9)
        try f.vault.writeAll(doc.id, data)
        #expect(try f.vault.readAll(doc.id) == data)
        #expect(try f.vault.check().isClean)
    }
}
