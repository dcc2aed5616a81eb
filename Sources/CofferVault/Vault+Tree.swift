import CofferContent
import CofferCrypto
import CofferModel
import Foundation

/// How `rename` treats an existing file at the destination.
public enum RenameMode: Sendable {
    /// Replace it atomically (POSIX rename): a document or symlink over a non-folder, or a
    /// folder over an empty folder.
    case replace
    /// Fail with EEXIST (RENAME_NOREPLACE, and the CLI's `mv`).
    case noReplace
}

/// Attribute changes from chmod, chown, utimens.
public struct AttributeChanges: Sendable {
    public var mode: UInt32?
    public var uid: UInt32?
    public var gid: UInt32?
    public var mtime: Timespec?
    public var atime: Timespec?
    /// Makes these changes to `a`, stamped `stamp`; ctime is `now`.
    func apply(to a: inout PosixAttributes, at stamp: HybridTimestamp, now: Timespec) {
        if let mode { a.mode = Stamped(mode & 0o7777, at: stamp) }
        if let uid { a.uid = Stamped(uid, at: stamp) }
        if let gid { a.gid = Stamped(gid, at: stamp) }
        if let mtime { a.mtime = Stamped(mtime, at: stamp) }
        if let atime { a.atime = Stamped(atime, at: stamp) }
        a.ctime = now
    }

    public init(
        mode: UInt32? = nil, uid: UInt32? = nil, gid: UInt32? = nil, mtime: Timespec? = nil, atime: Timespec? = nil
    ) {
        self.mode = mode
        self.uid = uid
        self.gid = gid
        self.mtime = mtime
        self.atime = atime
    }

    public var isEmpty: Bool { mode == nil && uid == nil && gid == nil && mtime == nil && atime == nil }
}

extension Vault {
    public var rootID: FileID {
        state.withLock { $0.view.tree.rootID } ?? .none
    }

    /// A file of this account's tree, or of a share it reaches (docs/SHARING.md, "In the
    /// mount"); a link shows as what it places there.
    public func node(_ id: FileID) throws -> Node {
        do {
            let own = try state.withLock { s in s.view.tree.file(id) == nil ? nil : try node(id, &s) }
            if let own { return own.type == .link ? presented(link: own) : own }
            if let shared = try sharedLiveNode(id) { return shared }
            throw TreeError.notFound(id.description)
        } catch { throw VaultError.wrap(error) }
    }

    /// The node if the file is live, nil if it is deleted or unknown, decided under one lock:
    /// a caller that asked `isLive` and then `node` could see a rename remove it in between.
    /// Files of shares this account reaches count too; a link shows as what it places there.
    public func liveNode(_ id: FileID) throws -> Node? {
        do {
            let (own, known) = try state.withLock { s -> (Node?, Bool) in
                (s.view.tree.isLive(id) ? try node(id, &s) : nil, s.view.tree.file(id) != nil)
            }
            if let own { return own.type == .link ? presented(link: own) : own }
            return known ? nil : try sharedLiveNode(id)
        } catch { throw VaultError.wrap(error) }
    }

    /// The type of a live file, nil if it is deleted or unknown: for a caller that only needs
    /// to know a folder is one (every lookup and create checks its parent), without decrypting
    /// its name and attributes or counting its subfolders as `node` does. A link has the type
    /// of what it places (a folder when that is gone); a shared file its own.
    public func liveType(_ id: FileID) -> FileType? {
        let own = state.withLock { s -> (FileType?, Bool) in
            (s.view.tree.isLive(id) ? s.view.tree.file(id)?.type : nil, s.view.tree.file(id) != nil)
        }
        if let type = own.0 {
            guard type == .link else { return type }
            guard let target = linkTarget(of: id) else { return .folder }
            return (try? sharedLiveType(target)) ?? .folder
        }
        return own.1 ? nil : (try? sharedLiveType(id)) ?? nil
    }

    /// Whether the file exists and is live (not deleted, no deleted ancestor).
    public func isLive(_ id: FileID) -> Bool {
        state.withLock { $0.view.tree.isLive(id) }
    }

    /// The live children of a folder, by name; of a link, what is in the share it places; of a
    /// shared folder, its children. Links among them show as what they place.
    public func children(of id: FileID) throws -> [Node] {
        let listed: [Node]?
        do {
            listed = try ownChildren(of: id)
        } catch { throw VaultError.wrap(error) }
        guard let listed else {
            if let target = linkTarget(of: id) {
                return (try? sharedLiveType(target)) == nil ? [] : try sharedChildren(of: target)
            }
            return try sharedChildren(of: id)
        }
        guard listed.contains(where: { $0.type == .link }) else { return listed }
        return listed.map { $0.type == .link ? presented(link: $0) : $0 }
    }

    /// The children of a folder of this account's tree; nil for a link or a file it does not hold.
    private func ownChildren(of id: FileID) throws -> [Node]? {
        do {
            return try state.withLock { s -> [Node]? in
                guard let m = s.view.tree.file(id), m.type != .link else { return nil }
                guard m.type == .folder else { throw TreeError.notAFolder(s.view.path(id)) }
                let kids = s.view.tree.liveChildren(of: id)
                let times = s.pendingFolderTimes
                let opened = try s.view.open(children: kids, of: id) { Self.apply(times[$0], to: &$1) }
                let open = openDocuments.withLock { $0 }
                let order = Self.byteOrder(opened.map(\.name))
                var nodes: [Node] = []
                nodes.reserveCapacity(kids.count)
                for i in order {
                    let (m, o) = (kids[i], opened[i])
                    let doc = m.type == .document ? open[m.id] : nil
                    nodes.append(node(m, name: o.name, attributes: o.attributes, open: doc, &s))
                }
                return nodes
            }
        } catch { throw VaultError.wrap(error) }
    }

    /// The positions of `names` in the byte order of their UTF-8 (`String`'s own `<` is
    /// Unicode's order). Sorted as positions over one buffer holding every name's bytes: moving
    /// whole nodes was most of a sort's cost, and comparing the strings themselves retained and
    /// released both at each comparison (8% of the daemon's CPU in a cold `find`).
    static func byteOrder(_ names: [String]) -> [Int] {
        var bytes: [UInt8] = []
        bytes.reserveCapacity(names.count * 16)
        var spans: [(start: Int, count: Int)] = []
        spans.reserveCapacity(names.count)
        for var name in names {
            name.withUTF8 { u in
                spans.append((bytes.count, u.count))
                bytes.append(contentsOf: u)
            }
        }
        return bytes.withUnsafeBufferPointer { b in
            spans.withUnsafeBufferPointer { s in
                s.indices.sorted { i, j in
                    let (x, y) = (s[i], s[j])
                    let n = min(x.count, y.count)
                    if n > 0, let base = b.baseAddress {
                        let c = memcmp(base + x.start, base + y.start, n)
                        if c != 0 { return c < 0 }
                    }
                    return x.count < y.count
                }
            }
        }
    }

    /// The live child of `parent` called `name`, found by name MAC without decrypting siblings.
    /// Through a link, or in a shared folder, the child of the share; a link found shows as what
    /// it places.
    public func lookup(_ parent: FileID, _ name: String) throws -> Node? {
        // The own tree's answer; else the shared folder to look in (a link's target, or `parent`).
        enum Answer {
            case own(Node?)
            case shared(FileID)
        }
        let answer: Answer
        do {
            answer = try state.withLock { s in
                guard let p = s.view.tree.file(parent) else { return .shared(parent) }
                if p.type == .link { return .shared(p.linkTarget ?? parent) }
                return .own(try lookup(parent, name, &s))
            }
        } catch { throw VaultError.wrap(error) }
        switch answer {
        case .own(let node): return node.map { $0.type == .link ? presented(link: $0) : $0 }
        case .shared(let folder): return try sharedChild(of: folder, named: name)
        }
    }

    func lookup(_ parent: FileID, _ name: String, _ s: inout VaultState) throws -> Node? {
        guard let p = s.view.tree.file(parent) else { throw TreeError.notFound(parent.description) }
        if p.type == .link { return nil }
        guard p.type == .folder else { throw TreeError.notAFolder(s.view.path(parent)) }
        let mac = try s.view.nameMAC(name, in: parent)
        guard let child = s.view.tree.liveChild(of: parent, nameMAC: mac) else { return nil }
        return try node(child.id, &s)
    }

    /// Resolves a slash-separated path from the root ("" and "/" are the root). Symlinks are not
    /// followed: the CLI works on the tree as stored.
    public func resolve(_ path: String) throws -> Node {
        let parts = Self.components(path)
        do {
            return try state.withLock { s in
                guard let root = s.view.tree.rootID else { throw TreeError.noRoot }
                var current = try node(root, &s)
                var walked = ""
                for part in parts {
                    walked += "/" + part
                    guard current.type == .folder else { throw TreeError.notAFolder(walked) }
                    guard let next = try lookup(current.id, part, &s) else { throw TreeError.notFound(walked) }
                    current = next
                }
                return current
            }
        } catch { throw VaultError.wrap(error) }
    }

    public static func components(_ path: String) -> [String] {
        path.split(separator: "/", omittingEmptySubsequences: true).map(String.init).filter { $0 != "." }
    }

    public func path(of id: FileID) -> String {
        state.withLock { s in s.view.path(id) }
    }

    // MARK: Create

    /// Creates a folder, document or symlink. `atime` defaults to the mtime.
    @discardableResult
    public func create(
        in parent: FileID, name: String, type: FileType, mode: UInt32, uid: UInt32 = getuid(),
        gid: UInt32 = getgid(), symlinkTarget: String? = nil, mtime: Timespec? = nil,
        atime: Timespec? = nil
    ) throws -> Node {
        // The name is checked by `createFile`, as for a link.
        if type == .symlink {
            guard let t = symlinkTarget, !t.isEmpty, t.utf8.count <= 4095 else {
                throw VaultError.invalidArgument("a symlink target must be 1 to 4095 bytes")
            }
        }
        guard type != .link else { throw VaultError.invalidArgument("a link is made by accepting a share") }
        if let folder = sharedTarget(parent) {
            return try createInShare(
                folder, name: name, type: type, mode: mode, uid: uid, gid: gid, symlinkTarget: symlinkTarget,
                mtime: mtime, atime: atime)
        }
        return try createFile(
            in: parent, name: name, type: type, mode: mode, uid: uid, gid: gid, symlinkTarget: symlinkTarget,
            mtime: mtime, atime: atime, linkTarget: nil, linkFacts: nil)
    }

    /// `create`, also for a link (`acceptShare`): `linkTarget` names the shared file and
    /// `linkFacts` what this device knows of it, and the link is held to the sharing rules here
    /// as the server will hold it.
    func createFile(
        in parent: FileID, name: String, type: FileType, mode: UInt32, uid: UInt32 = getuid(),
        gid: UInt32 = getgid(), symlinkTarget: String? = nil, mtime: Timespec? = nil,
        atime: Timespec? = nil, linkTarget: FileID?, linkFacts: LinkTargetFacts?
    ) throws -> Node {
        do { try FileName.validate(name) } catch { throw VaultError.tree(error) }
        let id = try FileID(random: randomBytes(16))
        let fileKey = SymmetricKey.random()
        return try commit { batch, s, _ in
            s.view.tree.isNew(id)
            let stamp = nextStamp(&s)
            let t = mtime ?? now()
            var attrs = PosixAttributes(
                mode: mode, uid: uid, gid: gid, mtime: t, stamp: stamp, symlinkTarget: symlinkTarget)
            if let atime { attrs.atime.value = atime }
            attrs.ctime = now()
            // A new document names no manifest (contentDigest nil reads as empty everywhere):
            // storing a sealed empty one cost an insert, and a delete at the first flush, per file.
            let m = FileMetadata(
                id: id, type: type, parent: parent, name: try s.view.sealName(name, in: parent, of: id),
                owner: accountID, wrappedKey: try s.view.wrap(fileKey, of: id, in: parent),
                sealedAttributes: attrs.sealed(key: fileKey, of: id),
                lastModifiedBy: accountID, linkTarget: linkTarget)
            let describe = s.view.describe
            try batch.create(
                m,
                describe: { _ in
                    let p = describe(parent)
                    return (p == "/" ? "" : p) + "/" + name
                })
            if type == .link {
                do {
                    try Authorization.check(
                        changed: [id], before: s.view.tree, after: batch,
                        verify: { PublicSigningKey.isValid($0.bytes, $1, $2) },
                        linkTarget: { $0 == linkTarget ? linkFacts : nil }, describe: s.view.describe)
                } catch { throw VaultError.invalidArgument("\(error)") }
            }
            s.view.cache.keys[id] = fileKey
            s.view.cache.names[id] = name
            s.view.cache.attributes[id] = attrs
            try touchParent(parent, &batch, &s)
            return Node(id: id, type: type, parent: parent, name: name, attributes: attrs)
        }
    }

    /// A folder's mtime and ctime change when an entry is added, removed or renamed.
    ///
    /// With `coalesceFolderTimes` on, the new times go to memory at once (what stat reports)
    /// and reach the folder's record with a later commit: untar or rm -rf would otherwise
    /// re-seal and rewrite the same folder record for every entry (about a tenth of an unlink).
    func touchParent(_ parent: FileID, _ batch: inout Batch<StoreTree>, _ s: inout VaultState) throws {
        guard var attrs = try? attributes(parent, &s), batch.file(parent).map({ !$0.isDeleted }) == true else { return }
        let t = now()
        let stamp = nextStamp(&s)
        attrs.mtime = Stamped(t, at: stamp)
        attrs.ctime = t
        if coalescing.load(ordering: .relaxed) {
            s.view.cache.attributes[parent] = attrs
            s.pendingFolderTimes[parent] = PendingFolderTime(
                time: t, stamp: stamp, since: s.pendingFolderTimes[parent]?.since ?? t)
            return
        }
        try setSealedAttributes(parent, attrs, &batch, &s)
    }

    /// Turns coalescing of folder time updates on or off (the mount daemon turns it on; it
    /// also calls `flushFolderTimes` every fraction of a second and before it exits). Pending
    /// times are written by the first commit at least `folderTimesWindow` after the oldest, by
    /// `flushFolderTimes`, and before a push; a crash can lose the last ones (a folder's mtime
    /// then shows its previous change), never an entry.
    public func coalesceFolderTimes(_ on: Bool) {
        if !on { try? flushFolderTimes() }
        coalescing.store(on, ordering: .relaxed)
    }

    static let folderTimesWindow: Int64 = 50_000_000  // nanoseconds

    /// Writes every pending folder time now.
    /// Whether folder times wait to be written (`flushFolderTimes`).
    public var hasPendingFolderTimes: Bool { state.withLock { !$0.pendingFolderTimes.isEmpty } }

    public func flushFolderTimes() throws {
        guard state.withLock({ !$0.pendingFolderTimes.isEmpty }) else { return }
        try commit { batch, s, _ in try writeDueFolderTimes(&batch, &s, force: true) }
    }

    /// Adds the pending folder times to the batch being built, if they are due (or `force`).
    func writeDueFolderTimes(_ batch: inout Batch<StoreTree>, _ s: inout VaultState, force: Bool) throws {
        guard let since = s.pendingFolderTimes.values.map(\.since).min() else { return }
        if !force {
            let t = now()
            let waited = (t.seconds - since.seconds) * 1_000_000_000 + (t.nanoseconds - since.nanoseconds)
            guard waited >= Self.folderTimesWindow || waited < 0 else { return }
        }
        for id in Array(s.pendingFolderTimes.keys) {
            // A folder deleted or pruned meanwhile has nothing left to update.
            guard batch.file(id).map({ !$0.isDeleted }) == true, let attrs = try? attributes(id, &s) else {
                s.pendingFolderTimes[id] = nil
                continue
            }
            try setSealedAttributes(id, attrs, &batch, &s)
        }
    }

    func setSealedAttributes(
        _ id: FileID, _ attrs: PosixAttributes, _ batch: inout Batch<StoreTree>, _ s: inout VaultState
    ) throws {
        // Attributes built from `attributes(id)` carry a pending folder time: this write
        // settles it (`commit` puts it back if the batch fails).
        if let p = s.pendingFolderTimes[id], attrs.mtime.stamp >= p.stamp { s.pendingFolderTimes[id] = nil }
        let sealed = try s.view.sealAttributes(attrs, of: id)
        try batch.update(id, describe: s.view.describe) { $0.sealedAttributes = sealed }
        s.view.cache.attributes[id] = attrs
    }

    /// `mkdir -p`: creates missing folders along `path`, returns the last.
    @discardableResult
    public func makeFolders(_ path: String, mode: UInt32 = 0o755) throws -> Node {
        var current = try resolve("/")
        for part in Self.components(path) {
            if let next = try lookup(current.id, part) {
                guard next.type == .folder else { throw VaultError.tree(.notAFolder(self.path(of: next.id))) }
                current = next
            } else {
                current = try create(in: current.id, name: part, type: .folder, mode: mode)
            }
        }
        return current
    }

    // MARK: Rename, move, exchange

    /// Renames and/or moves `id` to `newParent`/`newName`. With `.replace`, an existing file
    /// there is deleted in the same batch, so the swap is atomic for every reader.
    /// Returns the id of the replaced file, if any.
    @discardableResult
    public func rename(
        _ id: FileID, to newParent: FileID, name newName: String, mode: RenameMode = .replace
    ) throws -> FileID? {
        do { try FileName.validate(newName) } catch { throw VaultError.tree(error) }
        let sharedSource = isSharedFile(id)
        let sharedFolder = sharedTarget(newParent)
        if sharedSource || sharedFolder != nil {
            guard sharedSource, let sharedFolder else {
                throw VaultError.crossOwner("a move between a share and this account's own files")
            }
            return try renameInShare(id, to: sharedFolder, name: newName, mode: mode)
        }
        return try commit { batch, s, _ -> FileID? in
            guard let m = s.view.tree.file(id) else { throw TreeError.notFound(id.description) }
            if m.isRoot { throw TreeError.rootModified }
            let describe = s.view.describe
            var replaced: FileID? = nil
            if let existing = try lookup(newParent, newName, &s), existing.id != id {
                if mode == .noReplace { throw TreeError.pathConflict(s.view.path(existing.id)) }
                if m.type == .folder {
                    guard existing.type == .folder else { throw TreeError.notAFolder(s.view.path(existing.id)) }
                    if !s.view.tree.liveChildren(of: existing.id).isEmpty {
                        throw TreeError.folderNotEmpty(s.view.path(existing.id))
                    }
                } else if existing.type == .folder {
                    throw TreeError.isAFolder(s.view.path(existing.id))
                }
                try batch.delete(existing.id, describe: describe)
                replaced = existing.id
            } else if let existing = try lookup(newParent, newName, &s), existing.id == id {
                return nil  // renaming onto itself is a no-op
            }
            try moveInBatch(id, to: newParent, name: newName, &batch, &s, describe)
            try touchParent(m.parent, &batch, &s)
            if newParent != m.parent { try touchParent(newParent, &batch, &s) }
            return replaced
        }.map { replaced in
            try? pruneDeleted(replaced)
            return replaced
        }
    }

    func moveInBatch(
        _ id: FileID, to newParent: FileID, name newName: String, _ batch: inout Batch<StoreTree>,
        _ s: inout VaultState, _ describe: Validator.Describe
    ) throws {
        guard let m = batch.file(id) else { throw TreeError.notFound(describe(id)) }
        let sealed = try s.view.sealName(newName, in: newParent, of: id)
        if newParent == m.parent {
            try batch.rename(id, to: sealed, describe: describe)
        } else {
            let wrapped = try s.view.wrap(try s.view.key(id), of: id, in: newParent)
            try batch.move(id, to: newParent, name: sealed, wrappedKey: wrapped, describe: describe)
        }
        s.view.cache.names[id] = newName
        // A shared file's grantees read its name under its own key: it follows the rename.
        if batch.file(id)?.shareName != nil {
            let shareName = try s.view.sealShareName(newName, of: id)
            try batch.update(id, describe: describe) { $0.shareName = shareName }
        }
        if var a = try? attributes(id, &s) {
            a.ctime = now()
            try setSealedAttributes(id, a, &batch, &s)
        }
    }

    /// RENAME_EXCHANGE: atomically swaps two entries.
    public func exchange(_ a: FileID, _ b: FileID) throws {
        if isSharedFile(a) || isSharedFile(b) {
            throw VaultError.crossOwner("exchanging a shared file with another")
        }
        try commit { batch, s, _ in
            guard let ma = s.view.tree.file(a), let mb = s.view.tree.file(b) else {
                throw TreeError.notFound("exchange target")
            }
            if ma.isRoot || mb.isRoot { throw TreeError.rootModified }
            if s.view.tree.ancestors(of: mb.parent).contains(a) || mb.parent == a
                || s.view.tree.ancestors(of: ma.parent).contains(b) || ma.parent == b
            {
                throw TreeError.cycle(s.view.path(a))
            }
            let na = try s.view.name(a)
            let nb = try s.view.name(b)
            let describe = s.view.describe
            // Park `a` under a temporary name first: each step must be checkable on its own.
            let pa = ma.parent
            let pb = mb.parent
            batch.upsertUnchecked(
                {
                    var t = ma
                    t.name = SealedName(ciphertext: [], mac: Array("exchange".utf8) + a.bytes)
                    return t
                }())
            try moveInBatch(b, to: pa, name: na, &batch, &s, describe)
            try moveInBatch(a, to: pb, name: nb, &batch, &s, describe)
            try touchParent(pa, &batch, &s)
            if pb != pa { try touchParent(pb, &batch, &s) }
        }
    }

    // MARK: Delete

    /// Deletes a file; a folder must be empty unless `recursive` (its contents are then
    /// implicitly deleted, as the design's deletion states say).
    public func remove(_ id: FileID, recursive: Bool = false, expectFolder: Bool? = nil) throws {
        if isSharedFile(id) { return try removeInShare(id, recursive: recursive, expectFolder: expectFolder) }
        try commit { batch, s, _ in
            guard let m = s.view.tree.file(id), s.view.tree.isLive(id) else { throw TreeError.notFound(id.description) }
            if m.isRoot { throw TreeError.rootModified }
            if expectFolder == true && m.type != .folder && m.type != .link {
                throw TreeError.notAFolder(s.view.path(id))
            }
            if expectFolder == false && m.type == .folder { throw TreeError.isAFolder(s.view.path(id)) }
            if m.type == .folder && !recursive && !s.view.tree.liveChildren(of: id).isEmpty {
                throw TreeError.folderNotEmpty(s.view.path(id))
            }
            try batch.delete(id, describe: s.view.describe)
            try touchParent(m.parent, &batch, &s)
            // A leaf the server never saw goes in this same commit; a subtree is pruned after.
            if m.type != .folder || s.view.tree.childIDs(of: id).isEmpty { s.pruneCandidates = [id] }
        }
        if !state.withLock({ $0.view.tree.file(id) == nil }) { try? pruneDeleted(id) }
    }

    /// Prunes what a deletion made unreachable and the server never saw: records that exist only
    /// locally are removed outright; records the server knows stay as explicit deletions until a
    /// sync pushes them. Open documents keep their content (their handles hold it).
    func pruneDeleted(_ id: FileID?) throws {
        guard let id else { return }
        try state.withLock { s in
            let ids = [id] + s.view.tree.descendants(of: id)
            let (removed, lastSeq, group) = try store.write { w -> ([(FileID, FileMetadata?)], Int64, UInt64?) in
                var removed: [(FileID, FileMetadata?)] = []
                var gone: Set<FileID> = []
                // Children first (each comes after its parent in `ids`), and a folder only once
                // every child is gone: one the server knows stays, and so does its parent.
                for f in ids.reversed() {
                    guard try !w.reader.exists(f, .base) else { continue }
                    if s.view.tree.childIDs(of: f).contains(where: { !gone.contains($0) }) { continue }
                    gone.insert(f)
                    removed.append((f, s.view.tree.file(f)))
                    try w.remove(f, .local)
                    try w.forgetInode(of: f)
                }
                // A child list that could not be read looked empty: remove nothing on its word.
                if let failure = s.view.tree.takeFailure() { throw VaultError.io(failure) }
                return (removed, try w.reader.lastChange(), w.groupGeneration)
            }
            for (f, before) in removed { s.view.wrote(f, before: before, after: nil, generation: group) }
            // Commits of others before this one are not read here: what was kept of shares goes.
            forgetSharedReads()
            s.lastSeq = lastSeq
        }
    }

    // MARK: Attributes

    @discardableResult
    public func setAttributes(_ id: FileID, _ changes: AttributeChanges) throws -> Node {
        if let shared = sharedTarget(id) { return try setAttributesInShare(shared, changes) }
        return try commit { batch, s, _ in
            var a = try attributes(id, &s)
            changes.apply(to: &a, at: nextStamp(&s), now: now())
            try setSealedAttributes(id, a, &batch, &s)
            return try node(id, &s)
        }
    }

    public func xattrs(_ id: FileID) throws -> [String: [UInt8]] {
        try node(id).attributes.liveXattrs
    }

    /// Sets (`value`) or removes (nil) a user xattr. `create`/`replace` are XATTR_CREATE/REPLACE.
    public func setXattr(
        _ id: FileID, name: String, value: [UInt8]?, create: Bool = false, replace: Bool = false
    ) throws {
        guard name.utf8.count <= 255, !name.isEmpty else { throw VaultError.invalidArgument("xattr name too long") }
        if let value, value.count > 64 * 1024 { throw VaultError.invalidArgument("xattr value larger than 64 KiB") }
        // `commit` wraps what its body throws into a VaultError (EIO); these two keep their errno.
        if let shared = sharedTarget(id) {
            if let refusal = try setXattrInShare(shared, name: name, value: value, create: create, replace: replace) {
                throw refusal
            }
            return
        }
        var refusal: XattrError?
        try commit { batch, s, _ in
            var a = try attributes(id, &s)
            let exists = a.xattrs[name]?.value != nil
            if create && exists {
                refusal = .exists
                return
            }
            if (replace || value == nil) && !exists {
                refusal = .missing
                return
            }
            if a.xattrs.count >= 1000 && !exists { throw VaultError.invalidArgument("too many xattrs") }
            a.xattrs[name] = Stamped(value, at: nextStamp(&s))
            a.ctime = now()
            try setSealedAttributes(id, a, &batch, &s)
        }
        if let refusal { throw refusal }
    }
}

/// xattr-specific failures with their own errnos (EEXIST, ENODATA).
public enum XattrError: Error {
    case exists
    case missing
}
