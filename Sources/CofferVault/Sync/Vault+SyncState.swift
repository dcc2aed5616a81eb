import CofferModel
import CofferStore
import Foundation

/// What the device remembers about syncing: the server, the cursor (the last server version
/// whose changes are applied here) and the outcome of the last attempt.
public struct SyncStatus: Sendable, Equatable {
    public var server: String?
    public var cursor: Int64
    public var lastSuccessMillis: Int64?
    public var lastAttemptMillis: Int64?
    public var lastError: String?
}

extension Vault {
    public var syncStatus: SyncStatus {
        (try? store.read { r in
            SyncStatus(
                server: try r.setting("server").map { String(decoding: $0, as: UTF8.self) },
                cursor: try r.setting("cursor").map(Self.int64) ?? 0,
                lastSuccessMillis: try r.setting("lastSuccess").map(Self.int64),
                lastAttemptMillis: try r.setting("lastAttempt").map(Self.int64),
                lastError: try r.setting("lastError").flatMap { $0.isEmpty ? nil : String(decoding: $0, as: UTF8.self) }
            )
        }) ?? SyncStatus(server: nil, cursor: 0)
    }

    /// How this device reaches its server: the URL, a certificate to trust for it beyond the
    /// system's (a self-signed server), whether plain HTTP to a non-loopback address was allowed
    /// explicitly, and the server id pinned at first contact (`RequestSigning`).
    public struct ServerSettings: Sendable, Equatable {
        public var url: String
        public var trustedCertificatePEM: [UInt8]?
        public var insecureHTTP: Bool
        public var pinnedID: [UInt8]?
    }

    /// Records the server (a different server forgets the pinned id of the previous one).
    public func setServer(_ url: String, trustedCertificatePEM: [UInt8]? = nil, insecureHTTP: Bool = false) throws {
        try store.write { w in
            if try w.reader.setting("server") != Array(url.utf8) { try w.setSetting("serverID", []) }
            try w.setSetting("server", Array(url.utf8))
            try w.setSetting("serverCA", trustedCertificatePEM ?? [])
            try w.setSetting("insecureHTTP", insecureHTTP ? [1] : [])
        }
    }

    public var serverSettings: ServerSettings? {
        try? store.read { r -> ServerSettings? in
            guard let url = try r.setting("server") else { return nil }
            return ServerSettings(
                url: String(decoding: url, as: UTF8.self),
                trustedCertificatePEM: try r.setting("serverCA").flatMap { $0.isEmpty ? nil : $0 },
                insecureHTTP: try r.setting("insecureHTTP") == [1],
                pinnedID: try r.setting("serverID").flatMap { $0.isEmpty ? nil : $0 })
        } ?? nil
    }

    /// Remembers the id the server gave at first contact; later syncs refuse any other.
    public func pinServerID(_ id: [UInt8]) throws {
        try store.write { w in try w.setSetting("serverID", id) }
    }

    /// The mount daemon's live channel to the server (docs/SYNC.md, "Live"), as `coffer status`
    /// shows it: its state, since when (ms), and why it is down.
    public struct LiveChannelStatus: Sendable, Equatable {
        public var state: String
        public var sinceMillis: Int64
        public var detail: String?
    }

    /// Records the live channel's new state (nil: the daemon stopped holding one).
    public func recordLiveChannel(state: String?, detail: String?) {
        let value = state.map { Self.stampedNote(epochMillis, [$0, detail ?? ""]) } ?? []
        try? store.write { w in try w.setSetting("liveChannel", value) }
    }

    public var liveChannel: LiveChannelStatus? {
        guard let raw = try? store.read({ try $0.setting("liveChannel") }) ?? nil,
            let note = Self.stampedNote(raw, fields: 2), let state = note.fields.first
        else { return nil }
        let detail = note.fields.count > 1 && !note.fields[1].isEmpty ? note.fields[1] : nil
        return LiveChannelStatus(state: state, sinceMillis: note.millis, detail: detail)
    }

    /// Records the outcome of a sync attempt for `coffer status`.
    public func recordSyncOutcome(error: String?) {
        let ms = epochMillis
        try? store.write { w in
            try w.setSetting("lastAttempt", Self.bytes(ms))
            if let error {
                try w.setSetting("lastError", Array(error.utf8))
            } else {
                try w.setSetting("lastError", [])
                try w.setSetting("lastSuccess", Self.bytes(ms))
            }
        }
    }

    /// Forgets how far this device has read the server's changes, so the next pull reads them all
    /// again. Used when the server's versions stopped meaning what the cursor says (a server
    /// restored from a backup reuses version numbers the device has already read past).
    public func resetCursor() throws {
        try store.write { w in try w.setSetting("cursor", Self.bytes(0)) }
    }

    /// `resetCursor` for the share feed (`feedCursor`).
    public func resetFeedCursor() throws {
        try store.write { w in try w.setSetting("feedCursor", Self.bytes(0)) }
    }

    /// The last time a sync found the server behind this device (restored from a backup, or lost
    /// its last writes) and what it did, for `coffer status`; nil if that never happened.
    public var serverCatchUpNotice: String? {
        (try? store.read { r in try r.setting("serverCatchUp") }).flatMap { $0 }.flatMap {
            $0.isEmpty ? nil : String(decoding: $0, as: UTF8.self)
        }
    }

    public func recordServerCatchUp(_ notice: String) {
        try? store.write { w in try w.setSetting("serverCatchUp", Array(notice.utf8)) }
    }

    static func int64(_ b: [UInt8]) -> Int64 { Int64(bitPattern: b.reduce(UInt64(0)) { ($0 << 8) | UInt64($1) }) }
    static func bytes(_ v: Int64) -> [UInt8] { withUnsafeBytes(of: UInt64(bitPattern: v).bigEndian) { Array($0) } }

    public var hasRoot: Bool { state.withLock { $0.view.tree.rootID != nil } }
}
