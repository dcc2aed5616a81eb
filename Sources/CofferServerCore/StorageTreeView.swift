import CofferModel
import Foundation

extension StoredFile {
    /// The columns kept beside a record for the tree's index: its parent (nil for the root, so
    /// the root is found by one lookup and is nobody's child) and its name MAC.
    static func placement(of m: FileMetadata) -> (parent: Data?, nameMAC: Data) {
        (m.isRoot ? nil : Data(m.parent.bytes), Data(m.name.mac))
    }

    /// The column kept for a record another account wrote (`writer`): that account; nil for
    /// the owner's own.
    static func writer(of m: FileMetadata) -> Data? {
        m.lastModifiedBy == m.owner ? nil : Data(m.lastModifiedBy.bytes)
    }
}

/// One account's tree as stored, read through the storage's indexes inside one transaction (an
/// upsert's), so a request reads what it touches rather than the account: a record by id, a
/// folder's children, its live children of one name, the root. Records are given in their
/// effective form, as clients must see them: a file the server marked `serverDeleted` (its
/// `deleted` column set) has `isDeleted` set.
///
/// Records read are kept for the rest of the request (the validator, the plan and the write all
/// ask about the same few files); the view lives only as long as its transaction, so the memo is
/// sized by the request, never by the tree. `TreeView` cannot throw: a storage failure or a stored
/// record that does not decode reads as a missing file and is kept in `failure`, which the
/// caller must check (`throwIfFailed`) before trusting any answer it got.
final class StorageTreeView: TreeView {
    /// What the upsert needs of a stored file besides its record.
    struct Entry {
        /// The record in its effective form.
        var metadata: FileMetadata
        var revision: UInt64
        var contentVersion: Int64
        var serverDeleted: Bool
    }

    private enum Slot {
        case missing
        /// Stored, but another account's file: not in this tree.
        case foreign
        case file(Entry)
    }

    let account: Data
    let reader: any MetadataReader
    private var slots: [FileID: Slot] = [:]
    private var root: FileID??
    private(set) var failure: (any Error)?

    init(account: Data, reader: any MetadataReader) {
        self.account = account
        self.reader = reader
    }

    func throwIfFailed() throws {
        if let failure { throw failure }
    }

    private func note(_ error: any Error) {
        if failure == nil { failure = error }
    }

    private func slot(_ id: FileID) -> Slot {
        if let known = slots[id] { return known }
        let found: Slot
        do {
            if let f = try reader.file(id: Data(id.bytes)) {
                if f.account != account {
                    found = .foreign
                } else {
                    let signed = try SignedMetadata(decoding: Array(f.record))
                    guard signed.metadata.id == id else { throw StorageError("file \(id) holds another file's record") }
                    var m = signed.metadata
                    if f.deleted { m.isDeleted = true }
                    found = .file(
                        Entry(
                            metadata: m, revision: signed.revision, contentVersion: f.contentVersion,
                            serverDeleted: f.serverDeleted))
                }
            } else {
                found = .missing
            }
        } catch {
            note(error)
            return .missing
        }
        slots[id] = found
        return found
    }

    /// The stored file of this account, with what the upsert needs besides its record.
    func entry(_ id: FileID) -> Entry? {
        if case .file(let e) = slot(id) { return e }
        return nil
    }

    /// Whether the id is stored as another account's file.
    func isForeign(_ id: FileID) -> Bool {
        if case .foreign = slot(id) { return true }
        return false
    }

    func file(_ id: FileID) -> FileMetadata? { entry(id)?.metadata }

    var rootID: FileID? {
        if let root { return root }
        var found: FileID?
        do {
            found = try reader.rootID(account: account).map { try FileID(bytes: Array($0)) }
        } catch {
            note(error)
            return nil
        }
        root = .some(found)
        return found
    }

    /// Every child, any deletion state (`TreeView`): the walks that need them (a moved folder's
    /// height, a revived folder's names) walk the subtree the batch changed.
    func childIDs(of id: FileID) -> [FileID] {
        ids(children(of: id, liveOnly: false).map(\.id))
    }

    /// Only live children (`TreeView` allows leaving deleted ones out): on the server a deleted
    /// file never comes back, and a name saved over many times leaves many deleted siblings.
    func childIDs(of id: FileID, nameMAC: [UInt8]) -> [FileID] {
        do {
            return ids(try reader.liveChildIDs(account: account, parent: Data(id.bytes), nameMAC: Data(nameMAC)))
        } catch {
            note(error)
            return []
        }
    }

    /// A folder's stored children from the index, without reading their records.
    func children(of id: FileID, liveOnly: Bool) -> [StoredChild] {
        do {
            return try reader.children(account: account, parent: Data(id.bytes), liveOnly: liveOnly)
        } catch {
            note(error)
            return []
        }
    }

    func fileID(_ bytes: Data) -> FileID? {
        do { return try FileID(bytes: Array(bytes)) } catch {
            note(StorageError("a stored file id is not 16 bytes"))
            return nil
        }
    }

    private func ids(_ stored: [Data]) -> [FileID] { stored.compactMap(fileID) }
}
