import CofferModel
import CofferProtocol
import CofferStore
import CofferVault
import Foundation

/// Stops a pull whose pages bring nothing new. A server holds only so many records the account
/// signed, so one that says "more" for ever must, page after page, run out of signed records it
/// has not sent yet: a page that still says "more" must bring at least one. The records are
/// verified as each page arrives (`SyncEngine.updates`), so only newness is checked here.
struct PageProgress {
    private struct Seen: Hashable {
        let signed: SignedMetadata
        let serverDeleted: Bool
    }
    private var seen: Set<Seen> = []
    private var seenGone: Set<FileID> = []

    /// A page counts as progress if it brings a record, or (from the share feed) a file no
    /// longer shared, not seen yet in this pull.
    mutating func admit(_ records: [RemoteFile], gone: [FileID] = [], more: Bool) throws {
        var fresh = false
        for id in gone where seenGone.insert(id).inserted { fresh = true }
        for r in records where seen.insert(Seen(signed: r.signed, serverDeleted: r.serverDeleted)).inserted {
            fresh = true
        }
        guard fresh || !more else {
            throw SyncError.protocolError(
                "the server keeps saying there are more updates without sending any new record; the pull was stopped")
        }
    }
}

/// A server restored from an older backup (or one that lost its last writes) no longer holds
/// records this device already read or pushed, and it hands out again version numbers the
/// device's cursor has already passed. Left alone, the device would say "pending: 0" for ever
/// while the files it pushed never reach another device, and it would never see what other
/// devices push at those reused versions. Devices are the server's backup: the device's base
/// records are signed already, so it sends them again, with their content, and reads the whole
/// tree again.
extension SyncEngine {
    func serverCheckDue() -> Bool {
        lastServerCheck.withLock { last in
            let now = Date()
            if let last, now.timeIntervalSince(last) < serverCheckInterval { return false }
            last = now
            return true
        }
    }

    /// Checks that the server still holds what this device last read from it and, if not, sends
    /// the device's base again and resets the cursor. Runs before the sync's first pull: once the
    /// cursor has moved past versions a restored server handed out again, nothing would tell.
    func catchUpIfServerBehind(_ report: inout SyncReport) async throws {
        let cursor = vault.syncStatus.cursor
        guard cursor > 0 else { return }
        // A server never forgets a record; it only replaces it with a newer version. The cursor is
        // the version of one of this account's records, so asking from just below it must return
        // every record the device holds at that version, at that version with the same bytes
        // or at a newer one.
        let probe = try await client.updates(since: cursor - 1)
        let base = try vault.baseRecords()
        let baseByID = Dictionary(base.map { ($0.metadata.id, $0) }, uniquingKeysWith: { a, _ in a })
        var behind = probe.files.isEmpty
        var suspicious = false
        var answered: [FileID: ServerFile] = [:]
        for f in probe.files {
            guard let signed = try? SignedMetadata(decoding: [UInt8](f.record)) else {
                throw SyncError.protocolError("the server sent a malformed record")
            }
            answered[signed.metadata.id] = f
        }
        let mineAtCursor = base.filter { $0.version == cursor }
        for mine in mineAtCursor {
            if let f = answered[mine.metadata.id] {
                // Different bytes at a version this device read: the server reuses version numbers.
                if f.version == cursor, [UInt8](f.record) != mine.signed.encoded() { behind = true }
            } else if probe.more {
                suspicious = true  // perhaps on a later page
            } else {
                behind = true  // the server's copy is older than what the device read, or gone
            }
        }
        // The device pruned what it read at the cursor (a deletion): the server still has it there.
        if mineAtCursor.isEmpty && !probe.files.contains(where: { $0.version == cursor }) { suspicious = true }
        guard behind || suspicious else { return }

        let server = try await serverTree()
        var resend: [PendingRecord] = []
        var skipped: Set<FileID> = []
        let deletedOnServer = Set(
            server.values.filter { $0.serverDeleted || $0.signed.metadata.isDeleted }.map(\.signed.metadata.id))
        for record in Self.parentsFirst(
            base.map { PendingRecord(stored: $0, expectedParent: nil, expectedNameMAC: nil, expectedRevision: nil) }
        ).joined() {
            let b = record.stored
            let id = b.metadata.id
            // Deleted here only because an ancestor is: that ancestor's record carries the deletion.
            if b.serverDeleted && !b.metadata.isDeleted {
                skipped.insert(id)
                continue
            }
            if let s = server[id] {
                if s.signed.encoded() == b.signed.encoded() { continue }
                // The server's record is as new or newer (another device wrote after the
                // restore): the full pull below brings it; the server would refuse ours anyway.
                if s.signed.revision >= b.signed.revision { continue }
                // A deletion the device has not seen yet wins (the full pull below brings it).
                if deletedOnServer.contains(id) {
                    skipped.insert(id)
                    continue
                }
                resend.append(
                    PendingRecord(
                        stored: b, expectedParent: s.signed.metadata.parent,
                        expectedNameMAC: s.signed.metadata.name.mac,
                        expectedRevision: s.signed.revision))
            } else {
                // A file gone from the server and deleted here has nothing to restore.
                if b.effectiveMetadata.isDeleted {
                    skipped.insert(id)
                    continue
                }
                resend.append(
                    PendingRecord(stored: b, expectedParent: nil, expectedNameMAC: nil, expectedRevision: nil))
            }
        }
        // The server refuses a live record under a folder it has deleted; such files follow the
        // folder's deletion when the device reads the tree again.
        resend = Self.dropUnderDeleted(resend, deleted: deletedOnServer.union(skipped), base: baseByID)
        // Files whose deletion synced and was pruned here, but which the restored server still
        // holds alive: the signed deletion is gone with the prune, so the device signs a new one
        // (any key holder may delete), or the full pull below would bring them back to life.
        let tombstoned = try vault.tombstoned(
            among: server.values.filter { !$0.serverDeleted && !$0.signed.metadata.isDeleted }.map(\.signed))
        resend += tombstoned.map { s in
            PendingRecord(
                stored: vault.signedDeletion(of: s), expectedParent: s.metadata.parent,
                expectedNameMAC: s.metadata.name.mac,
                expectedRevision: s.revision)
        }
        // Records the server changed at versions the cursor has passed are invisible to the
        // device's pulls: the cursor must go back even when nothing needs sending.
        let invisible = server.values.contains { s in
            guard s.version <= cursor, !s.serverDeleted, !s.signed.metadata.isDeleted else { return false }
            return baseByID[s.signed.metadata.id]?.signed.encoded() != s.signed.encoded()
        }
        guard behind || !resend.isEmpty || invisible else { return }

        try await upload(try vault.content(of: resend.map(\.stored)), &report)
        try await upsert(resend, &report) { [vault] in try vault.markPushed($0, version: $1) }
        try vault.resetCursor()
        // The share feed's versions are the server's too: read it again from the start.
        try vault.resetFeedCursor()
        report.resentToServer = resend.count
        vault.recordServerCatchUp(Self.catchUpNotice(resent: resend.count, at: Date()))
        try await pull(&report)
    }

    static func catchUpNotice(resent: Int, at date: Date) -> String {
        let when = ISO8601DateFormatter().string(from: date)
        return
            "the server was behind this device (restored from a backup?); re-sent \(resent) "
            + "file\(resent == 1 ? "" : "s") (\(when))"
    }

    /// The server's whole tree for this account, newest record per file.
    func serverTree() async throws -> [FileID: RemoteFile] { try await updates(since: 0).files }

    /// `records` without those whose parent chain (in the device's base) reaches a folder in `deleted`.
    static func dropUnderDeleted(
        _ records: [PendingRecord], deleted: Set<FileID>, base: [FileID: StoredFile]
    ) -> [PendingRecord] {
        var verdict: [FileID: Bool] = [:]
        func underDeleted(_ id: FileID) -> Bool {
            var chain: [FileID] = []
            var cursor = id
            var result = false
            while chain.count < 100_000 {
                if let v = verdict[cursor] {
                    result = v
                    break
                }
                guard let f = base[cursor], !f.metadata.isRoot else { break }
                let parent = f.metadata.parent
                chain.append(cursor)
                if deleted.contains(parent) {
                    result = true
                    break
                }
                cursor = parent
            }
            for c in chain { verdict[c] = result }
            return result
        }
        return records.filter { $0.stored.effectiveMetadata.isDeleted || !underDeleted($0.stored.metadata.id) }
    }
}
