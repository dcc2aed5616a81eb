import CofferContent
import CofferCrypto
import CofferModel
import CofferStore
import Foundation

/// Merging a write grantee's unpushed changes to shares with what the feed brings
/// (docs/SHARING.md, "Writing in a share"). Each change is read, before the pull is applied,
/// for what it meant (names, attributes and content in the clear, with the keys it was made
/// under); changes the pull touched are then made again on top of the owner's new records, under
/// whatever keys they now carry, as two devices' edits merge:
///
/// - a rename or move stands if its folder is still there and writable (a name taken meanwhile
///   gets " (conflict)"); attributes merge field by field, the later stamp winning;
/// - content changed on one side only is that side's (re-encrypted if the owner rotated the
///   file's key); changed on both, the owner's stays and this account's is saved beside it as
///   a copy named "NAME (conflict from USER)";
/// - a deletion stands unless the owner changed the file's content meanwhile;
/// - nothing written is dropped: a new file, or changed content, that can no longer be placed
///   (its folder gone, the share revoked, access reduced to read) is saved in this account's own
///   tree, in a folder named after the share (`Vault.saveRecovered`), and `coffer status` says so.
struct SharedIntent {
    let base: FileMetadata?
    let local: FileMetadata
    let key: SymmetricKey
    let name: String
    let attributes: PosixAttributes
    let baseAttributes: PosixAttributes?
    /// The share's name and the folders from it down to the file's, for a recovery.
    let share: String
    let folders: [String]

    var id: FileID { local.id }
    var isNew: Bool { base == nil }
    var placementChanged: Bool { base.map { $0.parent != local.parent || $0.name != local.name } ?? true }
    var contentChanged: Bool {
        local.type == .document && !local.isDeleted && (base == nil || base?.contentDigest != local.contentDigest)
    }
    var attributesChanged: Bool { base?.sealedAttributes != local.sealedAttributes }
    var deletes: Bool { local.isDeleted && base?.isDeleted == false }
}

/// Something written in a share that could not stay there, to be saved in the account's tree.
/// It waits in the store's recovery queue, sealed under the account's root key, from the
/// transaction that took it out of the share until it is saved (`Vault.drainRecovery`): no crash
/// in between loses it.
struct RecoveredFile: Sendable, Equatable {
    let share: String
    /// Folders below the share, then the file's name.
    let path: [String]
    let type: FileType
    let attributes: PosixAttributes
    /// A document's content as the store keeps it: its manifest, under the file's key.
    let fileID: FileID
    let key: SymmetricKey
    let contentDigest: [UInt8]?

    func encoded() -> [UInt8] {
        var w = ByteWriter()
        w.u8(1)
        w.string(share)
        w.u32(UInt32(path.count))
        for p in path { w.string(p) }
        w.u8(type.rawValue)
        w.data(attributes.encoded())
        w.raw(fileID.bytes)
        w.raw(key.bytes)
        w.optionalData(contentDigest)
        return w.bytes
    }

    init(decoding bytes: [UInt8]) throws {
        var r = ByteReader(bytes)
        guard try r.u8() == 1 else { throw DecodingError("unknown saved-work format") }
        share = try r.string(max: 4096)
        let count = try r.u32()
        guard count <= UInt32(TreeLimits.maxDepth) + 1 else { throw DecodingError("saved work nested too deep") }
        path = try (0..<count).map { _ in try r.string(max: 4096) }
        guard let t = FileType(rawValue: try r.u8()) else { throw DecodingError("unknown file type") }
        type = t
        attributes = try PosixAttributes(decoding: try r.data(max: 1 << 20))
        fileID = try FileID(bytes: try r.raw(16))
        key = try SymmetricKey(bytes: try r.raw(32))
        contentDigest = try r.optionalData(max: 64)
        try r.expectEnd()
    }

    init(
        share: String, path: [String], type: FileType, attributes: PosixAttributes, fileID: FileID,
        key: SymmetricKey, contentDigest: [UInt8]?
    ) {
        self.share = share
        self.path = path
        self.type = type
        self.attributes = attributes
        self.fileID = fileID
        self.key = key
        self.contentDigest = contentDigest
    }
}

extension Vault {
    /// Reads every unpushed change to shares for what it meant (`SharedIntent`), in the store's
    /// current state, before a pull changes it. Changes that no longer open (a damaged row) are
    /// left as they are.
    func captureSharedIntents(_ w: StoreWriter) throws -> [SharedIntent] {
        let locals = try w.reader.sharedLocalFiles()
        guard !locals.isEmpty else { return [] }
        let me = accountID
        var view = KeyedTree(tree: MirrorTree(reader: w.reader), cache: KeyCache(capacity: 4096), access: grantKeys)
        var out: [SharedIntent] = []
        for signed in locals {
            let m = signed.metadata
            // A share's own folder is named under a key this account never holds: by its
            // shared name (its place and name are its owner's; only its times and attributes
            // change here).
            let name = m.grant(to: me) != nil ? sharedName(m, &view) ?? m.id.description : sharedName(m, &view)
            guard let key = try? view.key(m.id), let name, let attributes = try? view.openAttributes(m) else {
                continue
            }
            let base = try w.reader.sharedFile(m.id, .pulled)?.signed.metadata
            let baseAttributes = base.flatMap { b in
                try? PosixAttributes(
                    decoding: AEAD.open(
                        b.sealedAttributes, key: key, purpose: .attributes, fileID: b.id.bytes, what: "attributes"))
            }
            // The folders from the share down to the file's, by name.
            var folders: [String] = []
            var share = "share"
            var cursor = m.parent
            for _ in 0...TreeLimits.maxDepth + 1 {
                guard let f = view.tree.file(cursor) else { break }
                let name = sharedName(f, &view) ?? f.id.description
                if f.grant(to: me) != nil {
                    share = name
                    break
                }
                folders.append(name)
                if f.isRoot { break }
                cursor = f.parent
            }
            out.append(
                SharedIntent(
                    base: base, local: m, key: key, name: name, attributes: attributes, baseAttributes: baseAttributes,
                    share: share, folders: folders.reversed()))
        }
        return out
    }

    /// Makes again, over the mirror as the pull left it, each change the pull touched (`touched`:
    /// ids it stored or dropped); the others stay as they were. Returns what must be saved in
    /// the account's own tree.
    /// `user` names this account in conflict copies; it is read before the store's write
    /// transaction (`username` takes the state lock, which is taken before the store's).
    func replaySharedIntents(
        _ intents: [SharedIntent], touched: Set<FileID>, user: String, _ w: StoreWriter
    ) throws -> [RecoveredFile] {
        var redoIDs = Set(
            intents.filter { i in
                touched.contains(i.id) || touched.contains(i.local.parent)
                    || i.base.map { touched.contains($0.parent) } == true
            }.map(\.id))
        // And every change this account may no longer make where it stands (write taken away
        // above it, or its folder moved where this account only reads): the pull may have
        // touched nothing but a folder far above.
        let me = accountID
        let probe = MirrorTree(reader: w.reader)
        for i in intents where !redoIDs.contains(i.id) {
            let place = i.local.isDeleted ? (i.base?.parent ?? i.local.parent) : i.local.parent
            guard let folder = probe.file(place), Self.isReachable(folder, by: me, in: probe),
                probe.accessMode(of: me, on: place) == .write
            else {
                redoIDs.insert(i.id)
                continue
            }
        }
        try probe.throwIfFailed()
        guard !redoIDs.isEmpty else { return [] }
        // What was made or moved inside a change made again is made again too: its folder may
        // not stay (saved in the account's tree instead), and nothing may be left inside it.
        while true {
            let more = intents.filter { !redoIDs.contains($0.id) && redoIDs.contains($0.local.parent) }
            if more.isEmpty { break }
            redoIDs.formUnion(more.map(\.id))
        }
        let redo = intents.filter { redoIDs.contains($0.id) }
        for i in redo { try w.removeSharedLocal(i.id) }
        // Parents before children: a folder made here comes back before what was made in it.
        let byID = Dictionary(redo.map { ($0.id, $0) }, uniquingKeysWith: { a, _ in a })
        func depth(_ i: SharedIntent) -> Int {
            var d = 0
            var cursor = i.local.parent
            while let p = byID[cursor], d < 10_000 {
                d += 1
                cursor = p.local.parent
            }
            return d
        }
        let ordered = redo.sorted { (depth($0), $0.id) < (depth($1), $1.id) }
        var view = KeyedTree(tree: MirrorTree(reader: w.reader), cache: KeyCache(capacity: 4096), access: grantKeys)
        var recovered: [RecoveredFile] = []
        func writable(_ folder: FileID, owner: AccountID) -> Bool {
            guard let f = view.tree.file(folder), f.type == .folder, f.owner == owner else { return false }
            return Self.isReachable(f, by: me, in: view.tree) && view.tree.accessMode(of: me, on: folder) == .write
        }
        func recover(_ i: SharedIntent) throws {
            recovered.append(
                RecoveredFile(
                    share: i.share, path: i.folders + [i.name], type: i.local.type, attributes: i.attributes,
                    fileID: i.id, key: i.key, contentDigest: i.local.type == .document ? i.local.contentDigest : nil))
        }
        func store(_ m: FileMetadata, _ view: inout KeyedTree<MirrorTree>) throws {
            try w.putSharedLocal(unsigned(m))
            try w.logChange(m.id)
            // The view's memo holds the record as it was before this write.
            view.tree.staged[m.id] = m
            view.cache.forget(m.id)
        }
        for i in ordered {
            if i.isNew {
                if i.local.isDeleted { continue }
                guard writable(i.local.parent, owner: i.local.owner) else {
                    try recover(i)
                    continue
                }
                var m = i.local
                let name = try Self.freeName(i.name, in: m.parent, for: m.id, &view)
                m.name = try view.sealName(name, in: m.parent, of: m.id)
                m.wrappedKey = try view.wrap(i.key, of: m.id, in: m.parent)
                m.lastModifiedBy = me
                try store(m, &view)
                continue
            }
            guard let now = view.tree.file(i.id), let base = i.base, Self.isReachable(now, by: me, in: view.tree),
                view.tree.accessMode(of: me, on: i.id) == .write
            else {
                // Gone, deleted or no longer writable: what was written is saved; a rename or an
                // attribute change of a file that is not there any more has nothing to keep.
                if i.contentChanged { try recover(i) }
                continue
            }
            let newKey = try view.key(i.id)
            var m = now
            m.lastModifiedBy = me
            let ownerChangedContent = now.contentDigest != base.contentDigest
            if i.deletes {
                if !ownerChangedContent { m.isDeleted = true }
            } else if !now.isDeleted {
                if i.placementChanged, writable(i.local.parent, owner: now.owner) {
                    let name = try Self.freeName(i.name, in: i.local.parent, for: i.id, &view)
                    var moved = m
                    moved.parent = i.local.parent
                    moved.name = try view.sealName(name, in: moved.parent, of: i.id)
                    moved.wrappedKey = try view.wrap(newKey, of: i.id, in: moved.parent)
                    if moved.shareName != nil { moved.shareName = try view.sealShareName(name, of: i.id) }
                    if (try? Self.checkSharedPlacement(moved, old: now, in: view.tree, me: me)) != nil { m = moved }
                }
                let owners = try view.openAttributes(now)
                var attributes = owners
                if i.attributesChanged { attributes = PosixAttributes.merge(i.attributes, attributes) }
                // The size is the content's: the owner's unless this account's content is taken
                // below (the merge gives it with the later mtime, which may be the other side's).
                attributes.size = owners.size
                if i.contentChanged {
                    if !ownerChangedContent {
                        if newKey == i.key {
                            m.contentDigest = i.local.contentDigest
                        } else {
                            m.contentDigest = try w.resealContent(
                                i.local.contentDigest, from: ContentCipher(fileID: i.id, key: i.key),
                                to: ContentCipher(fileID: i.id, key: newKey)
                            ).digest
                        }
                        attributes.size = i.attributes.size
                        attributes.mtime = i.attributes.mtime
                    } else if writable(now.parent, owner: now.owner) {
                        let copy = try conflictCopy(of: i, in: now.parent, by: user, &view, w)
                        try store(copy, &view)
                    } else {
                        try recover(i)
                    }
                }
                m.sealedAttributes = attributes.sealed(key: newKey, of: i.id)
            }
            if !PullMerge.sameContent(m, now) { try store(m, &view) }
        }
        return recovered
    }

    /// This account's version of a document the owner changed too, saved beside it as a new
    /// file under a fresh key: "NAME (conflict from USER)".
    private func conflictCopy(
        of i: SharedIntent, in folder: FileID, by user: String, _ view: inout KeyedTree<MirrorTree>, _ w: StoreWriter
    ) throws -> FileMetadata {
        let id = try FileID(random: randomBytes(16))
        let key = SymmetricKey.random()
        let content = try w.resealContent(
            i.local.contentDigest, from: ContentCipher(fileID: i.id, key: i.key),
            to: ContentCipher(fileID: id, key: key))
        let name = try Self.freeName(Self.conflictName(i.name, by: user), in: folder, for: id, &view)
        var attributes = i.attributes
        attributes.size = content.size
        let m = FileMetadata(
            id: id, type: .document, parent: folder, name: try view.sealName(name, in: folder, of: id),
            owner: i.local.owner, wrappedKey: try view.wrap(key, of: id, in: folder),
            sealedAttributes: attributes.sealed(key: key, of: id), contentDigest: content.digest,
            lastModifiedBy: accountID)
        return m
    }

    /// "NAME (conflict from USER)", the extension kept at the end ("a (conflict from bob).txt").
    static func conflictName(_ name: String, by user: String) -> String {
        let tag = " (conflict from \(user))"
        if let dot = name.lastIndex(of: "."), dot != name.startIndex {
            return fitted(String(name[..<dot]), suffix: fitted(tag + String(name[dot...]), suffix: ""))
        }
        return fitted(name, suffix: fitted(tag, suffix: ""))
    }

    /// `name` if no other live file of `folder` has it, else the first free "NAME (conflict N)".
    static func freeName(
        _ name: String, in folder: FileID, for id: FileID, _ view: inout KeyedTree<MirrorTree>
    ) throws -> String {
        var candidate = name
        for n in 1...1000 {
            let taken = try sharedChild(folder, candidate, &view)
            if taken == nil || taken?.id == id { return candidate }
            candidate = fitted(name, suffix: n == 1 ? " (conflict)" : " (conflict \(n))")
        }
        throw VaultError.tree(.pathConflict(name))
    }

    static let recoveredSetting = "recoveredFromShares"

    /// The key saved work is sealed under in the recovery queue: the account's root folder's,
    /// which only this account holds. Read before a store write (it takes the state lock).
    func recoveryKey() throws -> (root: FileID, key: SymmetricKey) {
        try state.withLock { s in
            guard let root = s.view.tree.rootID else { throw VaultError.tree(.noRoot) }
            return (root, try s.view.key(root))
        }
    }

    /// Queues `files` in this transaction (`drainRecovery` saves them afterwards).
    func enqueueRecovered(
        _ files: [RecoveredFile], under key: (root: FileID, key: SymmetricKey), _ w: StoreWriter
    )
        throws
    {
        for f in files {
            let sealed = AEAD.seal(f.encoded(), key: key.key, purpose: .recovery, fileID: key.root.bytes)
            try w.enqueueRecovery(sealed, file: f.fileID, contentDigest: f.contentDigest)
        }
    }

    /// Saves the queued work from shares in this account's own tree, under "/Recovered from
    /// SHARE" (a free name), notes each path for `coffer status`, and takes each item off the
    /// queue once saved. An item that fails stays queued for the next sync (a crash between
    /// saving and taking it off saves it twice, never loses it); one that no longer opens is
    /// dropped and reported.
    ///
    /// Drains are one at a time in a process (a sync and a mount's flush may both drain); two
    /// processes draining at the very same moment may save an item twice.
    public func drainRecovery() throws {
        try draining.withLock { _ in
            // One process drains at a time (the daemon and a command may both try): a lease in
            // the store, taken in one write, so two never save the same item twice. One that
            // stopped mid-drain holds it a minute at most; what it saved is out of the queue,
            // the rest waits for the next drain.
            guard try takeDrainLease() else { return }
            defer {
                let token = drainToken
                try? store.write { w in
                    if let held = try w.reader.setting(Self.drainLeaseSetting), Array(held.suffix(16)) == token {
                        try w.removeSetting(Self.drainLeaseSetting)
                    }
                }
            }
            try drainRecoveryQueue()
        }
    }

    static let drainLeaseSetting = "recoveryDrain"
    static let drainLeaseMillis: UInt64 = 60_000

    /// Takes the store's drain lease if nobody holds it, or its holder let it run out.
    private func takeDrainLease() throws -> Bool {
        let now = nowMillis
        let token = drainToken
        return try store.write { w -> Bool in
            if let held = try w.reader.setting(Self.drainLeaseSetting), held.count == 24 {
                var r = ByteReader(Array(held.prefix(8)))
                let until = (try? r.u64()) ?? 0
                if until > now, Array(held.suffix(16)) != token { return false }
            }
            var lease = ByteWriter()
            lease.u64(now &+ Self.drainLeaseMillis)
            lease.raw(token)
            try w.setSetting(Self.drainLeaseSetting, lease.bytes)
            return true
        }
    }

    /// How many items of saved work wait to be saved (`coffer status`).
    public var recoveryWaiting: Int { (try? store.read { try $0.recoveryQueueCount() }) ?? 0 }

    private func drainRecoveryQueue() throws {
        let items = try store.read { try $0.recoveryQueue() }
        guard !items.isEmpty else { return }
        let key = try recoveryKey()
        var failure: (any Error)?
        var folders: [String: FileID] = [:]
        var saved: [String] = []
        for (seq, sealed) in items {
            let f: RecoveredFile
            do {
                f = try RecoveredFile(
                    decoding: AEAD.open(
                        sealed, key: key.key, purpose: .recovery, fileID: key.root.bytes, what: "saved work"))
            } catch {
                try store.write { try $0.removeRecovery(seq) }
                failure = failure ?? VaultError.corrupt("an item of work saved from a share was damaged and dropped")
                continue
            }
            do {
                saved.append(try save(f, &folders))
                try store.write { try $0.removeRecovery(seq) }
            } catch {
                failure = failure ?? error
            }
        }
        if !saved.isEmpty {
            let note = try store.read { try $0.setting(Self.recoveredSetting) }.map {
                String(decoding: $0, as: UTF8.self)
            }
            let lines = (note.map { [$0] } ?? []) + saved
            try store.write { w in try w.setSetting(Self.recoveredSetting, Array(lines.joined(separator: "\n").utf8)) }
        }
        if let failure { throw failure }
    }

    /// Saves one item; returns its path.
    private func save(_ f: RecoveredFile, _ folders: inout [String: FileID]) throws -> String {
        let root = try resolve("/")
        let top: FileID
        let topName = Self.fitted("Recovered from \(f.share)", suffix: "")
        if let known = folders[f.share], isLive(known) {
            top = known
        } else if let existing = try lookup(root.id, topName), existing.type == .folder {
            // What earlier syncs saved from this share is there already: one folder per share.
            top = existing.id
            folders[f.share] = top
        } else {
            top = try create(in: root.id, name: try freeOwnName(topName, in: root.id), type: .folder, mode: 0o755).id
            folders[f.share] = top
        }
        var folder = top
        for part in f.path.dropLast() {
            let name = Self.fitted(part, suffix: "")
            if let next = try lookup(folder, name), next.type == .folder {
                folder = next.id
            } else {
                folder = try create(in: folder, name: try freeOwnName(name, in: folder), type: .folder, mode: 0o755).id
            }
        }
        let last = Self.fitted(f.path.last ?? f.fileID.description, suffix: "")
        // A folder saved with what was in it: the first of its files made it already.
        if f.type == .folder, let existing = try lookup(folder, last), existing.type == .folder {
            return path(of: existing.id)
        }
        let type: FileType = f.type == .folder || f.type == .symlink ? f.type : .document
        let node = try create(
            in: folder, name: try freeOwnName(last, in: folder), type: type, mode: f.attributes.mode.value,
            symlinkTarget: type == .symlink ? f.attributes.symlinkTarget : nil, mtime: f.attributes.mtime.value)
        if type == .document {
            do {
                let cipher = ContentCipher(fileID: f.fileID, key: f.key)
                let manifest = try loadManifest(f.contentDigest, cipher: cipher)
                var next = 0
                try writeContents(node.id, mtime: f.attributes.mtime.value) {
                    guard next < manifest.chunks.count else { return nil }
                    let ref = manifest.chunks[next]
                    next += 1
                    guard let sealed = try store.chunk(ref.id) else {
                        throw ContentError.missingChunk(hexString(Array(ref.id.prefix(8))))
                    }
                    return try cipher.openChunk(sealed, ref: ref)
                }
            } catch {
                // No empty copy left behind: the item stays queued for the next attempt.
                try? remove(node.id)
                throw error
            }
        }
        return path(of: node.id)
    }

    /// `name`, or the first free "NAME (N)", in a folder of this account's own tree.
    private func freeOwnName(_ name: String, in folder: FileID) throws -> String {
        var candidate = name
        for n in 2...1001 {
            if try lookup(folder, candidate) == nil { return candidate }
            candidate = Self.fitted(name, suffix: " (\(n))")
        }
        throw VaultError.tree(.pathConflict(name))
    }

    /// `base` cut at a character boundary so that, with `suffix`, it fits a file name's 255
    /// bytes (names this code makes up: conflict copies, saved work).
    static func fitted(_ base: String, suffix: String) -> String {
        let budget = FileName.maxBytes - suffix.utf8.count
        guard base.utf8.count > budget else { return base + suffix }
        var out = ""
        for ch in base {
            if out.utf8.count + String(ch).utf8.count > budget { break }
            out.append(ch)
        }
        return out + suffix
    }

    /// The paths of files saved from shares this account could no longer write to (newest last).
    public var recoveredFromShares: [String] {
        guard let bytes = try? store.read({ try $0.setting(Self.recoveredSetting) }) else { return [] }
        return String(decoding: bytes, as: UTF8.self).split(separator: "\n").map(String.init)
    }
}
