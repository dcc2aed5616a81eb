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

    /// A database with an applied migration this server has not registered (a newer server's,
    /// or a pre-release one's) is refused with a reason, not served as if it had this format.
    @Test func aDatabaseOfAnUnknownFormatIsRefused() throws {
        let path = tempDirectory().appendingPathComponent("metadata.sqlite").path
        do {
            let storage = try SQLiteMetadataStorage(path: path)
            try storage.pool.write { try $0.execute(sql: "INSERT INTO grdb_migrations VALUES ('v99')") }
        }
        let error = #expect(throws: StorageError.self) { _ = try SQLiteMetadataStorage(path: path) }
        #expect(error?.description.contains("a format this server does not know") == true)
    }
}
