import Foundation
import GRDB

/// The server's files are for the server alone: its data directory is 0700 and every database
/// file 0600, whatever the process umask.
enum PrivateFiles {
    static func prepareDirectory(_ url: URL) throws {
        try FileManager.default.createDirectory(
            at: url, withIntermediateDirectories: true,
            attributes: [.posixPermissions: 0o700])
        guard chmod(url.path, 0o700) == 0 else { throw StorageError("cannot make \(url.path) private: errno \(errno)") }
    }

    /// Creates the database file 0600 before SQLite opens it (SQLite gives its -wal and -shm
    /// files the database file's mode).
    static func prepareDatabase(_ path: String) throws {
        let fd = open(path, O_CREAT | O_RDWR | O_CLOEXEC, 0o600)
        guard fd >= 0 else { throw StorageError("cannot create \(path): errno \(errno)") }
        close(fd)
        guard chmod(path, 0o600) == 0 else { throw StorageError("cannot make \(path) private: errno \(errno)") }
    }

    /// Narrows files an older server created with the umask's mode.
    static func restrictDatabase(_ path: String) {
        for suffix in ["", "-wal", "-shm"] where FileManager.default.fileExists(atPath: path + suffix) {
            _ = chmod(path + suffix, 0o600)
        }
    }

    /// How a database's commits reach the disk: FULL fsyncs each (what the server acknowledges
    /// survives a power loss), NORMAL only at checkpoints.
    enum Synchronous: String {
        case full = "FULL"
        case normal = "NORMAL"
    }

    /// Opens one of the server's SQLite databases (WAL) private to its owner, with the durability
    /// asked, and brings its schema up to date; a database with an applied migration `migrator`
    /// does not know (made by a newer or a pre-release server) is refused. `synchronous` is set on
    /// every connection and once more on the writer, because GRDB sets the writer to NORMAL when it turns WAL on, after
    /// `prepareDatabase` ran, and the writer is the connection that commits.
    static func openPool(
        path: String, busyTimeout: TimeInterval, synchronous: Synchronous, migrator: DatabaseMigrator
    ) throws -> DatabasePool {
        try prepareDatabase(path)
        var config = Configuration()
        config.busyMode = .timeout(busyTimeout)
        let pragma = "PRAGMA synchronous = \(synchronous.rawValue)"
        config.prepareDatabase { db in try db.execute(sql: pragma) }
        let pool = try DatabasePool(path: path, configuration: config)
        try pool.writeWithoutTransaction { try $0.execute(sql: pragma) }
        if try pool.read({ try migrator.hasBeenSuperseded($0) }) {
            throw StorageError(
                "\(path) has a format this server does not know (made by a newer or a pre-release coffer-server); "
                    + "run the server that made it, or start from an empty data directory")
        }
        try migrator.migrate(pool)
        restrictDatabase(path)
        return pool
    }
}
