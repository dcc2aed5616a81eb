import Foundation
import Testing

@testable import CofferServerCore

@Suite struct DurabilityTests {
    /// A 200 means the batch is on disk: every commit of the metadata store is fsynced
    /// (`synchronous = FULL`, 2, in WAL mode), not only at checkpoints.
    @Test func metadataCommitsAreSynchronousFull() throws {
        let storage = try SQLiteMetadataStorage(path: tempDirectory().appendingPathComponent("metadata.sqlite").path)
        let synchronous = try storage.pragma("synchronous")
        #expect(synchronous.reader == "2" && synchronous.writer == "2")
        #expect(try storage.pragma("journal_mode").writer == "wal")
    }
}
