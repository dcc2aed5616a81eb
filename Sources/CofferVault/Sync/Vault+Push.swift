import CofferContent
import CofferModel
import CofferStore
import Foundation

/// A document version the server needs before the metadata naming it can be pushed.
public struct PendingUpload: Sendable {
    public let fileID: FileID
    public let digest: [UInt8]
    public let sealedManifest: [UInt8]
    public let chunkIDs: [[UInt8]]
}

/// A local record to push, with the precondition (what the device last agreed with the server).
public struct PendingRecord: Sendable {
    public let stored: StoredFile
    public let expectedParent: FileID?
    public let expectedNameMAC: [UInt8]?
    public let expectedRevision: UInt64?
    /// Whether it changes grants the server holds on a file it has: a push in parts sends these
    /// last, after the records the same change signs as this account's own (the server takes
    /// no revocation while a record the revoked account wrote is left below it).
    public let changesGrants: Bool

    public init(
        stored: StoredFile, expectedParent: FileID?, expectedNameMAC: [UInt8]?, expectedRevision: UInt64?,
        changesGrants: Bool = false
    ) {
        self.stored = stored
        self.expectedParent = expectedParent
        self.expectedNameMAC = expectedNameMAC
        self.expectedRevision = expectedRevision
        self.changesGrants = changesGrants
    }
}

extension Vault {
    /// Content of locally changed documents that the server does not have yet: content is pushed
    /// before the metadata that names it, so no device ever pulls a record whose content is missing.
    public func pendingContent() throws -> [PendingUpload] {
        try store.read { r in
            try r.files(.local).compactMap { local in
                // Content the server has already (the base's) is not sent again.
                let digest = local.metadata.contentDigest
                if digest != nil, try r.file(local.metadata.id, .base)?.metadata.contentDigest == digest { return nil }
                return try Self.upload(of: local.metadata, r)
            }
        }
    }

    /// Every base record: what this device last agreed with the server, each already signed. A
    /// server found to have lost some of it (restored from a backup) is sent these again.
    public func baseRecords() throws -> [StoredFile] {
        try store.read { r in try r.files(.base) }
    }

    /// The stored content (sealed manifest and chunk ids) of these records' documents, for
    /// pushing base records again: content before the metadata naming it.
    public func content(of records: [StoredFile]) throws -> [PendingUpload] {
        try store.read { r in
            try records.filter { !$0.effectiveMetadata.isDeleted }.compactMap { try Self.upload(of: $0.metadata, r) }
        }
    }

    /// A document's stored content as the server is sent it (nil for anything but a document
    /// with content).
    static func upload(of m: FileMetadata, _ r: StoreReader) throws -> PendingUpload? {
        guard m.type == .document, let digest = m.contentDigest else { return nil }
        guard let sealed = try r.manifest(digest) else {
            throw VaultError.corrupt("the manifest of \(m.id) is missing")
        }
        return PendingUpload(
            fileID: m.id, digest: digest, sealedManifest: sealed, chunkIDs: try r.chunkIDs(ofManifest: digest))
    }

    /// Sealed bytes of content this device has not pushed yet (the chunks of documents whose
    /// content changed here, each counted once, whether or not the server already holds some of
    /// them): what `coffer status` reports as waiting to go up.
    public func pendingUploadBytes() throws -> Int {
        try store.read { try $0.pendingContentBytes() }
    }

    public func sealedChunk(_ id: [UInt8]) throws -> [UInt8]? {
        try store.chunk(id)
    }

    /// Every local record, signed (local edits are stored unsigned, see `unsigned`), with its
    /// base version's parent and name MAC as the precondition. Each is signed afresh with a
    /// revision above its base's, so the server can refuse a push based on an older record and
    /// other devices can refuse an older record served again (`SignedMetadata`).
    public func pendingRecords() throws -> [PendingRecord] {
        try flushFolderTimes()  // what is pushed includes the latest folder times
        let millis = nowMillis
        return try store.read { r in
            try r.files(.local).map { local in
                let base = try r.file(local.metadata.id, .base)
                var signed = local
                signed.signed = sign(
                    local.metadata, revision: SignedMetadata.revision(after: base?.signed.revision, now: millis))
                return PendingRecord(
                    stored: signed, expectedParent: base?.metadata.parent, expectedNameMAC: base?.metadata.name.mac,
                    expectedRevision: base?.signed.revision,
                    changesGrants: base.map { $0.metadata.access != local.metadata.access } ?? false)
            }
        }
    }

    /// Which of `records` (as a server holds them) this device deleted and pruned (`tombstones`).
    public func tombstoned(among records: [SignedMetadata]) throws -> [SignedMetadata] {
        try store.read { r in try records.filter { try r.isTombstoned($0.id) } }
    }

    /// A new signed deletion of `record`, one revision above it: for a file this device deleted
    /// and pruned, whose deletion a restored server lost.
    public func signedDeletion(of record: SignedMetadata) -> StoredFile {
        var m = record.metadata
        m.isDeleted = true
        m.lastModifiedBy = accountID
        return StoredFile(signed: sign(m, revision: SignedMetadata.revision(after: record.revision, now: nowMillis)))
    }

    /// The server accepted `records` at `version`: they become base. A local record that changed
    /// again while the push was in flight stays local (it is pushed next time).
    @discardableResult
    public func markPushed(_ records: [PendingRecord], version: Int64) throws -> Set<FileID> {
        try state.withLock { s in
            let changed = try store.write { w -> Set<FileID> in
                var changed: Set<FileID> = []
                for p in records {
                    let id = p.stored.metadata.id
                    let base = try w.reader.file(id, .base)
                    let digestChanged = base?.metadata.contentDigest != p.stored.metadata.contentDigest
                    let contentVersion = digestChanged ? version : (base?.contentVersion ?? version)
                    try w.put(
                        StoredFile(signed: p.stored.signed, version: version, contentVersion: contentVersion), .base)
                    // The same record but for its writer (a row written before local changes named
                    // this account) is pushed too.
                    if let current = try w.reader.file(id, .local),
                        PullMerge.sameContent(current.metadata, p.stored.metadata)
                    {
                        try w.remove(id, .local)
                    } else if var current = try w.reader.file(id, .local) {
                        current.version = version
                        current.contentVersion = contentVersion
                        try w.put(current, .local)
                    }
                    changed.insert(id)
                }
                return changed
            }
            try settle(changed, &s)
            return changed
        }
    }
}
