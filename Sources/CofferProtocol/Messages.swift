import CofferModel
import Foundation

/// The wire format between `coffer` and `coffer-server`: JSON bodies (binary fields base64,
/// as `Data` encodes) on `/v1/...` paths, raw bytes for chunks. Metadata records travel as the
/// signed, canonically encoded `SignedMetadata` bytes, so the server stores exactly what the
/// client signed and other devices verify exactly that. See docs/PROTOCOL.md.
public enum API {
    public static let prefix = "/v1"

    /// Whether `host` (a name or an address, IPv6 in brackets or not) is this machine:
    /// `localhost`, `::1` or 127.0.0.0/8. Clients send plain HTTP only there; a server listening
    /// only there may take registrations from anyone.
    public static func isLoopback(_ host: String) -> Bool {
        let h = host.lowercased().trimmingCharacters(in: CharacterSet(charactersIn: "[]"))
        if h == "localhost" || h == "::1" { return true }
        var addr = in_addr()
        return inet_pton(AF_INET, h, &addr) == 1 && (UInt32(bigEndian: addr.s_addr) >> 24) == 127
    }
    /// Largest request body the server accepts (a batch of metadata or one chunk).
    public static let maxBodyBytes = 32 * 1024 * 1024
    /// How far a request's timestamp may be from the server's clock.
    public static let maxClockSkewMillis: Int64 = 5 * 60 * 1000
    /// Most records one updates response carries; clients page with `since` and `afterID`.
    public static let updatesPageSize = 5000
    /// Most bytes of records (as JSON, estimated from their lengths) one updates response carries.
    public static let updatesPageBytes = 16 * 1024 * 1024
    /// Longest a watch (`POST /v1/watch`) is held open before it is answered unchanged: well
    /// inside clients' 60 s request deadline and proxies' usual idle limits.
    public static let maxWatchSeconds = 25
}

/// `GET /v1/server` (unauthenticated): the server's identity, which every request signature
/// covers. Devices pin it on first contact and refuse a server whose id changed.
public struct ServerInfoResponse: Codable, Sendable {
    public var id: Data
    public init(id: Data) { self.id = id }
}

public struct CreateAccountRequest: Codable, Sendable {
    public var username: String
    public var signingKey: Data
    public var boxKey: Data
    /// An invite code from the server's operator (`coffer-server invite`), needed when the server
    /// runs with `--registration invite`.
    public var invite: String?
    /// The account's signature over its username and keys (`KeyCard`), which the server keeps and
    /// serves with them. Accounts made before key cards publish theirs later (`KeyCardRequest`).
    public var card: Data?
    public init(username: String, signingKey: Data, boxKey: Data, invite: String? = nil, card: Data? = nil) {
        self.username = username
        self.signingKey = signingKey
        self.boxKey = boxKey
        self.invite = invite
        self.card = card
    }
}

public struct AccountResponse: Codable, Sendable {
    public var username: String
    public var signingKey: Data
    public var boxKey: Data
    /// The `KeyCard` signature, if the account published one.
    public var card: Data?
    public init(username: String, signingKey: Data, boxKey: Data, card: Data? = nil) {
        self.username = username
        self.signingKey = signingKey
        self.boxKey = boxKey
        self.card = card
    }

    /// The key card this answer makes, valid or not (callers check `isValid`); nil without one.
    public var keyCard: KeyCard? {
        card.map {
            KeyCard(username: username, signingKey: Array(signingKey), boxKey: Array(boxKey), signature: Array($0))
        }
    }
}

/// `POST /v1/accounts/card`: the caller's `KeyCard` signature over its stored username and keys.
/// The account's contact book, sealed by its devices under the account's root key (the server
/// reads nothing of it), and its revision: `GET /v1/contacts` answers it, `PUT /v1/contacts`
/// replaces it when `revision` is one above the stored one (docs/SHARING.md, "Contacts across
/// devices").
public struct ContactBookMessage: Codable, Sendable {
    public var sealed: Data?
    public var revision: Int64
    public init(sealed: Data?, revision: Int64) {
        self.sealed = sealed
        self.revision = revision
    }
}

public struct KeyCardRequest: Codable, Sendable {
    public var card: Data
    public init(card: Data) { self.card = card }
}

/// One metadata record to upsert, with the precondition the client saw: the parent, name MAC and
/// signed revision of its base version (all nil for a file the server has never seen). A stale
/// precondition makes the whole batch fail with `get_updates_required`, so a record is only ever
/// written over the one it was based on.
public struct FileUpdate: Codable, Sendable {
    public var record: Data
    public var expectedParent: Data?
    public var expectedNameMAC: Data?
    public var expectedRevision: UInt64?
    public init(record: Data, expectedParent: Data?, expectedNameMAC: Data?, expectedRevision: UInt64? = nil) {
        self.record = record
        self.expectedParent = expectedParent
        self.expectedNameMAC = expectedNameMAC
        self.expectedRevision = expectedRevision
    }
}

public struct UpsertRequest: Codable, Sendable {
    public var updates: [FileUpdate]
    public init(updates: [FileUpdate]) { self.updates = updates }
}

public struct UpsertResponse: Codable, Sendable {
    /// The metadata version assigned to this batch.
    public var version: Int64
    public init(version: Int64) { self.version = version }
}

/// A record as the server holds it.
public struct ServerFile: Codable, Sendable, Equatable {
    public var record: Data
    public var version: Int64
    public var contentVersion: Int64
    /// Set when the server turned an implicit deletion (a deleted ancestor) into an explicit one.
    /// The signed record is left untouched, so its signature still verifies.
    public var serverDeleted: Bool
    public init(record: Data, version: Int64, contentVersion: Int64, serverDeleted: Bool) {
        self.record = record
        self.version = version
        self.contentVersion = contentVersion
        self.serverDeleted = serverDeleted
    }
}

/// Asks for records after a cursor, oldest first in (version, file id) order: without `afterID`,
/// those with version > `since`; with it, those with (version, id) > (`since`, `afterID`), which
/// continues a version that an earlier page split.
public struct UpdatesRequest: Codable, Sendable {
    public var since: Int64
    public var afterID: Data?
    /// Also what other accounts share with the caller (its share feed, docs/SHARING.md). Devices
    /// ask for it once they hold shared trees; until then they are sent their own tree only, so
    /// nothing they cannot check yet is ever sent to them.
    public var shared: Bool?
    /// The share feed alone, without the caller's own records: a device keeps a cursor of its
    /// own for the feed, so it can start reading it at any time without reading its own tree
    /// again from the start.
    public var feedOnly: Bool?
    /// The cursor the device's read began from (the same on every page of it): files of the feed
    /// granted to the caller again after it are named in `UpdatesResponse.regranted`.
    public var origin: Int64?
    public init(
        since: Int64, afterID: Data? = nil, shared: Bool? = nil, feedOnly: Bool? = nil, origin: Int64? = nil
    ) {
        self.since = since
        self.afterID = afterID
        self.shared = shared
        self.feedOnly = feedOnly
        self.origin = origin
    }
}

/// `POST /v1/watch`: a long poll. Answered at once when the caller's view moved past what the
/// device says it has seen (its own tree past `since`, its share feed past `feedSince`, its
/// contact book past `contactsRevision`), else as soon as it moves, or with `changed: false`
/// after about `wait` seconds (the server caps it at `API.maxWatchSeconds`). What changed is not
/// said: the device syncs, as it would on any other nudge (docs/SYNC.md, "Live").
public struct WatchRequest: Codable, Sendable {
    public var since: Int64
    public var feedSince: Int64?
    public var contactsRevision: Int64?
    public var wait: Int?
    public init(since: Int64, feedSince: Int64? = nil, contactsRevision: Int64? = nil, wait: Int? = nil) {
        self.since = since
        self.feedSince = feedSince
        self.contactsRevision = contactsRevision
        self.wait = wait
    }
}

/// Where the caller's view stands: its tree's version, its feed's newest version, its contact
/// book's revision. A device watches again from these, so an answer it already acted on does
/// not wake it twice.
public struct WatchResponse: Codable, Sendable {
    public var changed: Bool
    public var latest: Int64
    public var feedLatest: Int64
    public var contactsRevision: Int64
    public init(changed: Bool, latest: Int64, feedLatest: Int64, contactsRevision: Int64) {
        self.changed = changed
        self.latest = latest
        self.feedLatest = feedLatest
        self.contactsRevision = contactsRevision
    }
}

/// Positions in the updates stream: (version, file id), a nil id standing for the end of its
/// version (every id of it read). Pages follow this order (docs/PROTOCOL.md, "Paging").
public enum UpdatesCursor {
    /// Whether cursor `a` is past `b`.
    public static func isAfter(_ a: (Int64, Data?), _ b: (Int64, Data?)) -> Bool {
        if a.0 != b.0 { return a.0 > b.0 }
        switch (a.1, b.1) {
        case (nil, nil): return false
        case (nil, _?): return true
        case (_?, nil): return false
        case (let x?, let y?): return y.lexicographicallyPrecedes(x)
        }
    }
}

public struct UpdatesResponse: Codable, Sendable {
    public var files: [ServerFile]
    /// The version to ask from next time (the last record's version, or `since` if none).
    public var latest: Int64
    /// More records remain past the cursor; ask again with `since: latest, afterID: nextAfterID`.
    public var more: Bool
    /// Set when the page ended inside version `latest`: the last record's file id, to send as
    /// `afterID`. A version is complete (and `latest` a cursor to keep) only when this is nil.
    public var nextAfterID: Data?
    /// Files of other accounts' trees this account was sent before and no longer sees (access
    /// revoked, or moved out of what was shared with it): a device drops them and what it holds
    /// below them, but for subtrees under a grant of their own to it (docs/SHARING.md, "The
    /// feed"). Absent when empty.
    public var gone: [Data]?
    /// Files of this page's feed granted to the caller again since the request's `origin` (a
    /// share revoked or given up, then granted anew): a device drops what it holds below each
    /// before taking the read's records, which bring the live subtree again (docs/SHARING.md,
    /// "The feed"). Absent when empty.
    public var regranted: [Data]?
    public init(
        files: [ServerFile], latest: Int64, more: Bool, nextAfterID: Data? = nil, gone: [Data]? = nil,
        regranted: [Data]? = nil
    ) {
        self.files = files
        self.latest = latest
        self.more = more
        self.nextAfterID = nextAfterID
        self.gone = gone
        self.regranted = regranted
    }
}

public struct ChunkIDsRequest: Codable, Sendable {
    public var ids: [Data]
    /// A file of another account's tree shared with the caller: the chunks are that account's
    /// (docs/SHARING.md, "Content"). Absent for the caller's own.
    public var via: Data?
    public init(ids: [Data], via: Data? = nil) {
        self.ids = ids
        self.via = via
    }
}

public struct MissingChunksResponse: Codable, Sendable {
    public var missing: [Data]
    public init(missing: [Data]) { self.missing = missing }
}

/// Stores a document version's sealed manifest. Every listed chunk must already be on the server
/// (content before metadata); the metadata naming `digest` is upserted afterwards.
public struct PutManifestRequest: Codable, Sendable {
    public var fileID: Data
    public var digest: Data
    public var sealed: Data
    public var chunkIDs: [Data]
    /// For a document not yet on the server, in a folder another account shares with the caller
    /// at write: that folder (or any file of the share), whose owner's the content is.
    public var via: Data?
    public init(fileID: Data, digest: Data, sealed: Data, chunkIDs: [Data], via: Data? = nil) {
        self.fileID = fileID
        self.digest = digest
        self.sealed = sealed
        self.chunkIDs = chunkIDs
        self.via = via
    }
}

public struct GetManifestRequest: Codable, Sendable {
    public var fileID: Data
    public var digest: Data
    public init(fileID: Data, digest: Data) {
        self.fileID = fileID
        self.digest = digest
    }
}

public struct UsageResponse: Codable, Sendable {
    public var files: Int64
    public var bytes: Int64
    public var quotaBytes: Int64
    public init(files: Int64, bytes: Int64, quotaBytes: Int64) {
        self.files = files
        self.bytes = bytes
        self.quotaBytes = quotaBytes
    }
}

/// Every error body. `code` is stable for programs; `message` is for people.
public struct ErrorResponse: Codable, Sendable {
    public var code: String
    public var message: String
    public init(code: String, message: String) {
        self.code = code
        self.message = message
    }

    public static let getUpdatesRequired = "get_updates_required"
    public static let badRequest = "bad_request"
    public static let unauthorized = "unauthorized"
    public static let forbidden = "forbidden"
    public static let notFound = "not_found"
    public static let tooLarge = "too_large"
    public static let quotaExceeded = "quota_exceeded"
    public static let conflict = "conflict"
    public static let rateLimited = "rate_limited"
    public static let invalidTree = "invalid_tree"
    /// 409: the tree's owner is ending the caller's access to part of it, and the caller's
    /// changes to that tree are held back for a short while; try again later (docs/SHARING.md).
    public static let writesPaused = "writes_paused"
}

/// Batched chunk bodies (for fetching many chunks in one response):
/// u32 count, then per chunk: 32-byte id, u32 length, sealed bytes. Big-endian.
public enum ChunkBundle {
    public static func encode(_ chunks: [(id: [UInt8], sealed: [UInt8])]) -> [UInt8] {
        var out = header(count: chunks.count)
        out.reserveCapacity(4 + chunks.reduce(0) { $0 + 36 + $1.sealed.count })
        for c in chunks { out += entryHeader(id: c.id, size: c.sealed.count) + c.sealed }
        return out
    }

    /// The bundle's first bytes: how many chunks follow. (A server streaming a bundle writes
    /// these headers and each chunk's bytes in turn; `encode` is the same thing in one piece.)
    public static func header(count: Int) -> [UInt8] { u32(count) }

    /// What precedes one chunk's bytes: its id and its length.
    public static func entryHeader(id: [UInt8], size: Int) -> [UInt8] { id + u32(size) }

    static func u32(_ v: Int) -> [UInt8] {
        var w = ByteWriter(capacity: 4)
        w.u32(UInt32(clamping: v))
        return w.bytes
    }

    public static func decode(_ bytes: [UInt8]) -> [(id: [UInt8], sealed: [UInt8])]? {
        var i = 0
        func u32() -> Int? {
            guard i + 4 <= bytes.count else { return nil }
            defer { i += 4 }
            return (Int(bytes[i]) << 24) | (Int(bytes[i + 1]) << 16) | (Int(bytes[i + 2]) << 8) | Int(bytes[i + 3])
        }
        guard let n = u32(), n <= 1 << 20 else { return nil }
        var out: [(id: [UInt8], sealed: [UInt8])] = []
        for _ in 0..<n {
            guard i + 32 <= bytes.count else { return nil }
            let id = Array(bytes[i..<(i + 32)])
            i += 32
            guard let len = u32(), i + len <= bytes.count else { return nil }
            out.append((id, Array(bytes[i..<(i + len)])))
            i += len
        }
        return i == bytes.count ? out : nil
    }
}
