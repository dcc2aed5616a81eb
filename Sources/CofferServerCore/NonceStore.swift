import Foundation
import GRDB
import Synchronization

/// Where the server remembers request nonces (replay protection), apart from the metadata store:
/// recording a nonce is part of authenticating every request, and must never wait for another
/// account's upsert, which holds the metadata write lock while it validates a batch.
///
/// Every server process that accepts requests for the same accounts must use the same nonce
/// store, or a request could be replayed against another process within the clock window.
public protocol NonceStore: Sendable {
    /// Records a nonce; returns false if this account already used it (a replay).
    func insert(account: Data, nonce: String, expiresAt: Int64) throws -> Bool
    /// Forgets nonces that expired before this time (ms since the epoch).
    func purge(expiredBefore: Int64) throws
}

/// The embedded nonce store: its own small SQLite database (`nonces.sqlite` in the server's data
/// directory), so its write lock is not the metadata database's. Several server processes on one
/// machine sharing the data directory share it, as they share `metadata.sqlite`.
public final class SQLiteNonceStore: NonceStore {
    let pool: DatabasePool

    public init(path: String, busyTimeout: TimeInterval = 10) throws {
        var migrator = DatabaseMigrator()
        migrator.registerMigration("v1") { db in
            try db.execute(
                sql: """
                    CREATE TABLE nonce (
                        account BLOB NOT NULL,
                        nonce TEXT NOT NULL,
                        expires_at INTEGER NOT NULL,
                        PRIMARY KEY (account, nonce)
                    ) WITHOUT ROWID;
                    CREATE INDEX nonce_by_expiry ON nonce (expires_at);
                    """)
        }
        // NORMAL: see docs/PROTOCOL.md on what a power cut can cost here.
        pool = try PrivateFiles.openPool(path: path, busyTimeout: busyTimeout, synchronous: .normal, migrator: migrator)
    }

    public func insert(account: Data, nonce: String, expiresAt: Int64) throws -> Bool {
        try pool.write { db in
            try db.execute(
                sql: "INSERT OR IGNORE INTO nonce (account, nonce, expires_at) VALUES (?, ?, ?)",
                arguments: [account, nonce, expiresAt])
            return db.changesCount == 1
        }
    }

    public func purge(expiredBefore: Int64) throws {
        try pool.write { db in try db.execute(sql: "DELETE FROM nonce WHERE expires_at < ?", arguments: [expiredBefore])
        }
    }
}

/// Nonces in memory, for tests and a server built around `CofferServer.init` by hand: one process
/// only, and a restart forgets them (a request could then be replayed within the clock window),
/// so `CofferServer.open` uses `SQLiteNonceStore`.
public final class MemoryNonceStore: NonceStore {
    let seen: Mutex<[Data: [String: Int64]]> = Mutex([:])

    public init() {}

    public func insert(account: Data, nonce: String, expiresAt: Int64) throws -> Bool {
        seen.withLock { all in
            if all[account]?[nonce] != nil { return false }
            all[account, default: [:]][nonce] = expiresAt
            return true
        }
    }

    public func purge(expiredBefore: Int64) throws {
        seen.withLock { all in
            for (account, nonces) in all {
                let kept = nonces.filter { $0.value >= expiredBefore }
                all[account] = kept.isEmpty ? nil : kept
            }
        }
    }
}
