import CofferContent
import CofferCrypto
import CofferModel
import CofferStore
import Foundation

/// A write grantee's own changes to the files of a share (docs/SHARING.md, "Writing in a
/// share"): made in the mirror's local layer (`shared_local`), held to the same rules the
/// server runs (`Authorization.check` against the mirror before the change) and to the tree's
/// invariants within the share, pushed into the owner's tree at the next sync
/// (`pendingSharedRecords`), and merged with what the feed brings (`SharedRebase`).
extension MirrorTree: StagingTree {
    func upsert(_ m: FileMetadata) { staged[m.id] = m }
    func drop(_ id: FileID) { staged[id] = nil }
}

extension Vault {
    /// The shared file a change at `id` changes: a link's target, a file of the mirror itself,
    /// nil for this account's own files.
    func sharedTarget(_ id: FileID) -> FileID? {
        let own = state.withLock { $0.view.tree.file(id) }
        if let own { return own.type == .link ? own.linkTarget : nil }
        if sharedRecords.record(id) != nil { return id }  // read so far, and not forgotten since
        return (try? store.readOne { try $0.sharedFile(id) }) != nil ? id : nil
    }

    /// Whether `id` is a file of the mirror (another account's, shared with this one), not of
    /// this account's own tree.
    func isSharedFile(_ id: FileID) -> Bool {
        sharedTarget(id) == id  // a link's target is never the link itself
    }

    /// Whether a change at `id` would change a share this account may not write (read access,
    /// or a link whose share is gone); false for its own files and for write shares.
    public func isReadOnlyShare(_ id: FileID) -> Bool {
        let own = state.withLock { $0.view.tree.file(id) }
        if let own, own.type != .link { return false }
        guard let target = own?.linkTarget ?? id as FileID? else { return true }
        let me = accountID
        let mode = try? store.readOne { r -> AccessMode? in
            let tree = MirrorTree(reader: r, cache: sharedRecords)
            guard let m = tree.file(target), Self.isReachable(m, by: me, in: tree) else { return nil }
            return tree.accessMode(of: me, on: target)
        }
        return mode != .write
    }

    /// Builds a change to shares in the mirror's local layer, checks it as the server will
    /// (the sharing rules against the mirror before it, the tree's invariants within the share)
    /// and stores it, in one transaction. Under the state lock, as the own tree's commits are,
    /// so the two kinds of write take the locks in one order.
    func commitShared<R: Sendable>(
        _ body: (inout KeyedTree<MirrorTree>, inout VaultState, StoreWriter) throws -> R
    ) throws -> R {
        let me = accountID
        do {
            let result = try state.withLock { s -> (R, [FileID]) in
                let leaseBefore = s.clockLease
                do {
                    try recoverLostGroup(&s)
                    let (result, lastSeq, group, changed) = try store.write { w -> (R, Int64, UInt64?, [FileID]) in
                        // Other processes' commits are taken in first, as for the own tree: an
                        // open after this write must not build on a version they replaced.
                        let latest = try catchUp(&s, in: w)
                        var access = grantKeys
                        access.known = sharedKeys
                        // Records come from those read so far where they can (`sharedRecords`):
                        // what other processes committed was just taken in (`catchUp` forgets
                        // them all), and this process forgets each record it writes, so the
                        // cache holds the store as this write sees it. Reading every ancestor
                        // through the writer was most of a small file's cost in a share.
                        var view = KeyedTree(
                            tree: MirrorTree(reader: w.reader, cache: sharedRecords), cache: KeyCache(capacity: 4096),
                            access: access)
                        let result = try body(&view, &s, w)
                        let before = MirrorTree(reader: w.reader, cache: sharedRecords)
                        let ids = view.tree.staged.keys.sorted()
                        for id in ids {
                            guard let m = view.tree.staged[id] else { continue }
                            try Self.checkSharedPlacement(m, old: before.file(id), in: view.tree, me: me)
                        }
                        do {
                            try Authorization.check(
                                changed: ids, before: before, after: view.tree,
                                verify: { PublicSigningKey.isValid($0.bytes, $1, $2) },
                                describe: sharedDescribe(view.tree))
                        } catch {
                            if case AccessError.crossOwner(let why) = error { throw VaultError.crossOwner(why) }
                            throw VaultError.denied("\(error)")
                        }
                        try view.tree.throwIfFailed()
                        try before.throwIfFailed()
                        for id in ids {
                            guard let m = view.tree.staged[id] else { continue }
                            // Made here and deleted before the server saw it: nothing to push.
                            if m.isDeleted, try w.reader.sharedFile(id, .pulled) == nil {
                                try w.removeSharedLocal(id)
                            } else {
                                try w.putSharedLocal(unsigned(m))
                            }
                            try w.logChange(id)
                        }
                        try renewClockLease(&s, w)
                        return (result, w.lastLogged ?? latest, w.groupGeneration, ids)
                    }
                    s.checkedGroup = group
                    s.lastSeq = lastSeq
                    // Forgotten under the lock: the next commit must not build on a record this
                    // one replaced (its catch-up finds nothing new in the log; this was ours).
                    sharedRecords.forget(changed)
                    return (result, changed)
                } catch {
                    s.checkedGroup = nil
                    s.clockLease = leaseBefore  // the write that stored a new one did not land
                    throw error
                }
            }
            // Only the records written (forgotten above): a grantee's change never changes a
            // file's key (moves re-wrap the same key; rotations are the owner's and come with the
            // feed, which forgets everything), so the keys opened so far stay good.
            return result.0
        } catch { throw VaultError.wrap(error) }
    }

    /// A shared file's path for messages: the share's name, then the folders below it (a
    /// share's parent is its owner's, which this account never sees).
    func sharedDescribe(_ tree: MirrorTree) -> Validator.Describe {
        let me = accountID
        // Keys opened so far are taken as known: opening a grant's sealed key for each name
        // asked was most of the cost of opening a shared document for writing.
        var access = grantKeys
        access.known = sharedKeys
        return { [self] id in
            var view = KeyedTree(tree: tree, access: access)
            var parts: [String] = []
            var cursor = id
            while let m = view.tree.file(cursor), parts.count < 4096 {
                parts.append(sharedName(m, &view) ?? cursor.description)
                if m.grant(to: me) != nil { break }
                if m.isRoot { break }
                cursor = m.parent
            }
            return parts.reversed().joined(separator: "/")
        }
    }

    /// The tree's invariants for one changed record of a share, as far as the mirror shows the
    /// owner's tree: its folder is a live folder of the share, no live sibling has its name,
    /// its type stays, and a folder is not moved into itself.
    static func checkSharedPlacement(_ m: FileMetadata, old: FileMetadata?, in tree: MirrorTree, me: AccountID) throws {
        if let old, old.type != m.type { throw VaultError.tree(.typeChanged(m.id.description)) }
        // In place, under its name, live or deleted as before (content, attributes): nothing
        // else can break (the share's root, whose folder this account never sees, included).
        if let old, old.parent == m.parent, old.name.mac == m.name.mac, old.isDeleted == m.isDeleted { return }
        if m.isDeleted { return }
        guard let parent = tree.file(m.parent), isReachable(parent, by: me, in: tree) else {
            throw VaultError.tree(.notFound(m.parent.description))
        }
        guard parent.type == .folder else { throw VaultError.tree(.notAFolder(m.parent.description)) }
        for other in tree.childIDs(of: m.parent, nameMAC: m.name.mac) where other != m.id {
            if let o = tree.file(other), !o.isDeleted { throw VaultError.tree(.pathConflict(m.id.description)) }
        }
        if m.type == .folder, old?.parent != m.parent {
            var cursor = m.parent
            for _ in 0...TreeLimits.maxDepth + 1 {
                if cursor == m.id { throw VaultError.tree(.cycle(m.id.description)) }
                guard let c = tree.file(cursor), !c.isRoot else { break }
                cursor = c.parent
            }
        }
    }

    /// A shared file's name as this account reads it: a share's own folder by its shared name
    /// (its real name is sealed under a folder of the owner's this account never sees), any
    /// other by its sealed name. Nil if it does not open.
    func sharedName(_ m: FileMetadata, _ view: inout KeyedTree<MirrorTree>) -> String? {
        m.grant(to: accountID) != nil ? try? shareName(m, &view) : try? view.openName(m)
    }

    /// The live child called `name` of a shared folder in `view`, if any.
    static func sharedChild(
        _ folder: FileID, _ name: String, _ view: inout KeyedTree<MirrorTree>
    ) throws
        -> FileMetadata?
    {
        let mac = try view.nameMAC(name, in: folder)
        return view.tree.childIDs(of: folder, nameMAC: mac).compactMap(view.tree.file).first { !$0.isDeleted }
    }

    /// A shared file's record as staged, with this account as its writer.
    static func staged(_ id: FileID, _ view: inout KeyedTree<MirrorTree>, me: AccountID) throws -> FileMetadata {
        guard var m = view.tree.file(id) else { throw VaultError.tree(.notFound(id.description)) }
        m.lastModifiedBy = me
        return m
    }

    /// Opens, changes and seals back a shared file's attributes in `view`.
    func changeSharedAttributes(
        _ id: FileID, _ view: inout KeyedTree<MirrorTree>, _ change: (inout PosixAttributes) throws -> Void
    ) throws -> PosixAttributes {
        var m = try Self.staged(id, &view, me: accountID)
        var a = try view.openAttributes(m)
        try change(&a)
        m.sealedAttributes = try view.sealAttributes(a, of: id)
        view.put(m)
        view.cache.attributes[id] = a
        return a
    }

    /// A folder's mtime and ctime follow an entry added, removed or renamed, in shares too.
    func touchSharedFolder(_ folder: FileID, _ view: inout KeyedTree<MirrorTree>, _ s: inout VaultState) throws {
        let stamp = nextStamp(&s)
        let t = now()
        _ = try changeSharedAttributes(folder, &view) { a in
            a.mtime = Stamped(t, at: stamp)
            a.ctime = t
        }
    }

    /// `create` in a share: the new file is the share owner's (one owner per subtree), its key
    /// wrapped and its name sealed under the folder's key, as in the owner's own tree.
    func createInShare(
        _ folder: FileID, name: String, type: FileType, mode: UInt32, uid: UInt32, gid: UInt32,
        symlinkTarget: String?, mtime: Timespec?, atime: Timespec?
    ) throws -> Node {
        do { try FileName.validate(name) } catch { throw VaultError.tree(error) }
        let id = try FileID(random: randomBytes(16))
        let fileKey = SymmetricKey.random()
        let me = accountID
        return try commitShared { view, s, _ in
            guard let parent = view.tree.file(folder), Self.isReachable(parent, by: me, in: view.tree) else {
                throw VaultError.tree(.notFound(folder.description))
            }
            guard parent.type == .folder else { throw VaultError.tree(.notAFolder(name)) }
            if try Self.sharedChild(folder, name, &view) != nil { throw VaultError.tree(.pathConflict(name)) }
            let stamp = nextStamp(&s)
            var attrs = PosixAttributes(
                mode: mode, uid: uid, gid: gid, mtime: mtime ?? now(), stamp: stamp, symlinkTarget: symlinkTarget)
            if let atime { attrs.atime.value = atime }
            attrs.ctime = now()
            let m = FileMetadata(
                id: id, type: type, parent: folder, name: try view.sealName(name, in: folder, of: id),
                owner: parent.owner, wrappedKey: try view.wrap(fileKey, of: id, in: folder),
                sealedAttributes: attrs.sealed(key: fileKey, of: id), lastModifiedBy: me)
            view.put(m)
            view.cache.keys[id] = fileKey
            try touchSharedFolder(folder, &view, &s)
            return Node(id: id, type: type, parent: folder, name: name, attributes: attrs)
        }
    }

    /// `rename` within one share. A move between a share and this account's tree, or between
    /// two owners' trees, is refused as a change of owner (the mount answers EXDEV, and tools
    /// copy instead).
    func renameInShare(_ id: FileID, to newParent: FileID, name newName: String, mode: RenameMode) throws -> FileID? {
        do { try FileName.validate(newName) } catch { throw VaultError.tree(error) }
        let me = accountID
        return try commitShared { view, s, _ -> FileID? in
            guard let m = view.tree.file(id), Self.isReachable(m, by: me, in: view.tree) else {
                throw VaultError.tree(.notFound(id.description))
            }
            guard let target = view.tree.file(newParent), Self.isReachable(target, by: me, in: view.tree) else {
                throw VaultError.tree(.notFound(newParent.description))
            }
            guard target.owner == m.owner else { throw VaultError.crossOwner("a move between two owners' trees") }
            guard target.type == .folder else { throw VaultError.tree(.notAFolder(newName)) }
            var replaced: FileID?
            if let existing = try Self.sharedChild(newParent, newName, &view) {
                if existing.id == id { return nil }
                if mode == .noReplace { throw VaultError.tree(.pathConflict(newName)) }
                if m.type == .folder {
                    guard existing.type == .folder else { throw VaultError.tree(.notAFolder(newName)) }
                    if view.tree.childIDs(of: existing.id).contains(where: { view.tree.file($0)?.isDeleted == false }) {
                        throw VaultError.tree(.folderNotEmpty(newName))
                    }
                } else if existing.type == .folder {
                    throw VaultError.tree(.isAFolder(newName))
                }
                var gone = try Self.staged(existing.id, &view, me: me)
                gone.isDeleted = true
                view.put(gone)
                replaced = existing.id
            }
            var moved = try Self.staged(id, &view, me: me)
            let key = try view.key(id)
            moved.name = try view.sealName(newName, in: newParent, of: id)
            if newParent != m.parent { moved.wrappedKey = try view.wrap(key, of: id, in: newParent) }
            moved.parent = newParent
            // A file shared on its own inside the share: its grantees read its name under its key.
            if moved.shareName != nil { moved.shareName = try view.sealShareName(newName, of: id) }
            view.put(moved)
            view.cache.names[id] = newName
            _ = try changeSharedAttributes(id, &view) { $0.ctime = now() }
            try touchSharedFolder(m.parent, &view, &s)
            if newParent != m.parent { try touchSharedFolder(newParent, &view, &s) }
            return replaced
        }
    }

    /// `remove` in a share: a deletion the owner's tree keeps as a record, as for any file the
    /// server knows (a file this account made and never pushed is dropped outright).
    func removeInShare(_ id: FileID, recursive: Bool, expectFolder: Bool?) throws {
        let me = accountID
        try commitShared { view, s, w in
            guard let m = view.tree.file(id), Self.isReachable(m, by: me, in: view.tree) else {
                throw VaultError.tree(.notFound(id.description))
            }
            if m.grant(to: me) != nil {
                throw VaultError.denied("the shared folder itself is its owner's; remove your link to it instead")
            }
            if expectFolder == true && m.type != .folder { throw VaultError.tree(.notAFolder(id.description)) }
            if expectFolder == false && m.type == .folder { throw VaultError.tree(.isAFolder(id.description)) }
            let live = view.tree.childIDs(of: id).contains { view.tree.file($0)?.isDeleted == false }
            if m.type == .folder && !recursive && live { throw VaultError.tree(.folderNotEmpty(id.description)) }
            var gone = try Self.staged(id, &view, me: me)
            gone.isDeleted = true
            view.put(gone)
            // What was made below it here and never pushed goes with it (the server knows none
            // of it; left behind, it would name a folder that is not there).
            var queue = m.type == .folder ? [id] : []
            while let next = queue.popLast() {
                for c in view.tree.childIDs(of: next) where c != next {
                    guard let cm = view.tree.file(c), try w.reader.sharedFile(c, .pulled) == nil else { continue }
                    var dropped = cm
                    dropped.isDeleted = true
                    dropped.lastModifiedBy = me
                    view.put(dropped)
                    if cm.type == .folder { queue.append(c) }
                }
            }
            try touchSharedFolder(m.parent, &view, &s)
        }
    }

    /// `setAttributes` in a share.
    func setAttributesInShare(_ id: FileID, _ changes: AttributeChanges) throws -> Node {
        let me = accountID
        return try commitShared { view, s, _ in
            guard let m = view.tree.file(id), Self.isReachable(m, by: me, in: view.tree) else {
                throw VaultError.tree(.notFound(id.description))
            }
            let stamp = nextStamp(&s)
            let time = now()
            let a = try changeSharedAttributes(id, &view) { changes.apply(to: &$0, at: stamp, now: time) }
            return Node(id: id, type: m.type, parent: m.parent, name: sharedName(m, &view) ?? "", attributes: a)
        }
    }

    /// `setXattr` in a share; nil if done, else the refusal `setXattr` throws.
    func setXattrInShare(
        _ id: FileID, name: String, value: [UInt8]?, create: Bool, replace: Bool
    ) throws
        -> XattrError?
    {
        var refusal: XattrError?
        let me = accountID
        try commitShared { view, s, _ in
            guard let m = view.tree.file(id), Self.isReachable(m, by: me, in: view.tree) else {
                throw VaultError.tree(.notFound(id.description))
            }
            let stamp = nextStamp(&s)
            _ = try changeSharedAttributes(id, &view) { a in
                let exists = a.xattrs[name]?.value != nil
                if create && exists { refusal = .exists }
                if (replace || value == nil) && !exists { refusal = .missing }
                if refusal != nil { return }
                if a.xattrs.count >= 1000 && !exists { throw VaultError.invalidArgument("too many xattrs") }
                a.xattrs[name] = Stamped(value, at: stamp)
                a.ctime = now()
            }
            if refusal != nil { view.tree.staged[id] = nil }
        }
        return refusal
    }

    /// A shared document's flush: the manifest and chunks stored, the record naming them
    /// changed in the mirror's local layer, in one transaction (as `commitContent` for the
    /// account's own). Nil when the file is gone or no longer writable (the caller keeps its
    /// chunks); a rotation by the owner since the open re-seals what was written under the
    /// new key, as for the account's own documents.
    func commitSharedContent(
        id: FileID, cipher: ContentCipher, manifest: Manifest, mtime: Timespec, ctime: Timespec,
        chunks: [[UInt8]: [UInt8]], unsealed: [[UInt8]: [UInt8]],
        ownership: (mode: UInt32?, uid: UInt32?, gid: UInt32?), atime: Timespec?, place: [String]
    ) throws -> (digest: [UInt8], resealed: (ContentCipher, Manifest)?)? {
        let me = accountID
        let sealed = cipher.sealManifest(manifest)
        var digest = ContentCipher.digest(ofSealedManifest: sealed)
        var resealed: (ContentCipher, Manifest)?
        var committed = false
        var queued = false
        try commitShared { view, s, w in
            let m = view.tree.file(id)
            guard let m, Self.isReachable(m, by: me, in: view.tree), view.tree.accessMode(of: me, on: id) == .write
            else {
                // Deleted meanwhile (here or by the owner): dropped, as for the account's own.
                if let m, m.isDeleted || view.tree.accessMode(of: me, on: id) == .write { return }
                // Access went while it was open here (the share left the mirror, or write was
                // taken away): what was written is saved in the account's own tree, as for
                // unpushed work (docs/SHARING.md).
                guard let root = s.view.tree.rootID, let rootKey = try? s.view.key(root) else { return }
                _ = try w.storeFlush(
                    manifest, sealed: sealed, digest: digest, cipher: cipher, current: cipher.key, chunks: chunks,
                    unsealed: unsealed)
                // Where it is now if the mirror still holds it, else where it was when opened.
                let now = m.map { _ in sharedDescribe(view.tree)(id).split(separator: "/").map(String.init) }
                let parts = now ?? (place.isEmpty ? [id.description] : place)
                var attributes = PosixAttributes(
                    mode: ownership.mode ?? 0o644, uid: ownership.uid ?? getuid(), gid: ownership.gid ?? getgid(),
                    mtime: mtime, stamp: nextStamp(&s))
                attributes.size = manifest.size
                let saved = RecoveredFile(
                    share: parts.count > 1 ? parts[0] : "a share",
                    path: parts.count > 1 ? Array(parts.dropFirst()) : parts,
                    type: .document, attributes: attributes, fileID: id, key: cipher.key, contentDigest: digest)
                try enqueueRecovered([saved], under: (root, rootKey), w)
                queued = true
                return
            }
            committed = true
            (digest, resealed) = try w.storeFlush(
                manifest, sealed: sealed, digest: digest, cipher: cipher, current: try view.key(id), chunks: chunks,
                unsealed: unsealed)
            let stamp = nextStamp(&s)
            _ = try changeSharedAttributes(id, &view) { a in
                Self.applyFlush(
                    to: &a, size: manifest.size, mtime: mtime, ctime: ctime, ownership: ownership, atime: atime,
                    at: stamp)
            }
            guard var changed = view.tree.staged[id] else { return }
            changed.contentDigest = digest
            view.put(changed)
        }
        // Saved in the own tree now if it can be; else the next sync does it (it stays queued).
        if queued { try? drainRecovery() }
        guard committed else { return nil }
        return (digest, resealed)
    }
}

/// Pushing a grantee's changes into the owners' trees (docs/SHARING.md, "Writing in a share").
extension Vault {
    /// How many changes to shared files wait to be pushed.
    public func pendingSharedChanges() throws -> Int {
        try store.read { try $0.sharedLocalFiles().count }
    }

    /// Content of changed shared documents the server does not have yet, each with the file
    /// the upload goes through (`via`): the document itself once the server holds it, else
    /// the nearest folder above it that it holds. Content goes to the owner's namespace.
    public func pendingSharedContent() throws -> [(upload: PendingUpload, via: FileID)] {
        try store.read { r in
            var out: [(PendingUpload, FileID)] = []
            for local in try r.sharedLocalFiles() {
                let m = local.metadata
                guard m.type == .document, !m.isDeleted, let digest = m.contentDigest else { continue }
                if try r.sharedFile(m.id, .pulled)?.signed.metadata.contentDigest == digest { continue }
                guard let upload = try Self.upload(of: m, r) else { continue }
                out.append((upload, try Self.nearestPulled(m.id, r)))
            }
            return out
        }
    }

    /// The nearest file at or above `id` that the server holds (has a pulled record).
    static func nearestPulled(_ id: FileID, _ r: StoreReader) throws -> FileID {
        var cursor = id
        for _ in 0...TreeLimits.maxDepth + 1 {
            if try r.sharedFile(cursor, .pulled) != nil { return cursor }
            guard let m = try r.sharedFile(cursor)?.signed.metadata, !m.isRoot else { break }
            cursor = m.parent
        }
        throw VaultError.corrupt("shared file \(id) is in no folder the server holds")
    }

    /// This account's unpushed changes to shared files, signed, by owner: each owner's tree
    /// takes its own batch.
    public func pendingSharedRecords() throws -> [AccountID: [PendingRecord]] {
        let millis = nowMillis
        return try store.read { r in
            var out: [AccountID: [PendingRecord]] = [:]
            for local in try r.sharedLocalFiles() {
                let m = local.metadata
                let base = try r.sharedFile(m.id, .pulled)
                let signed = sign(m, revision: SignedMetadata.revision(after: base?.signed.revision, now: millis))
                out[m.owner, default: []].append(
                    PendingRecord(
                        stored: StoredFile(signed: signed), expectedParent: base?.signed.metadata.parent,
                        expectedNameMAC: base?.signed.metadata.name.mac, expectedRevision: base?.signed.revision))
            }
            return out
        }
    }

    /// The owner's tree took `records` at `version`: they become the mirror's pulled records.
    /// A change made again while the push was in flight stays to be pushed.
    @discardableResult
    public func markSharedPushed(_ records: [PendingRecord], version: Int64) throws -> Set<FileID> {
        var changed: Set<FileID> = []
        try store.write { w in
            for p in records {
                let m = p.stored.signed.metadata
                let base = try w.reader.sharedFile(m.id, .pulled)
                let contentVersion =
                    base?.signed.metadata.contentDigest != m.contentDigest ? version : (base?.contentVersion ?? version)
                try w.putShared(StoredFile(signed: p.stored.signed, version: version, contentVersion: contentVersion))
                if let current = try w.reader.sharedLocalFile(m.id), PullMerge.sameContent(current.metadata, m) {
                    try w.removeSharedLocal(m.id)
                }
                try w.logChange(m.id)
                changed.insert(m.id)
            }
        }
        forgetSharedReads()
        return changed
    }
}
