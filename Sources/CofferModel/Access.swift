/// Who may do what to a file: the mode an account holds, and the rules every change is held to
/// (docs/SHARING.md, "The rules"). Pure: signatures are checked through a function the caller
/// passes in, and files of other accounts' trees (a link's target) are asked of the caller too.
extension TreeView {
    /// The highest mode `account` holds on `id`: `.owner` on its own files, else the highest
    /// live grant on the file or any ancestor; nil when it holds none. Walks up to the root, or
    /// to the first ancestor this view does not have (a shared folder's parent, in a sharee's
    /// view of another account's tree), at most `TreeLimits.maxDepth` steps.
    public func accessMode(of account: AccountID, on id: FileID) -> AccessMode? {
        var best: AccessMode?
        var cursor = id
        for _ in 0...TreeLimits.maxDepth + 1 {
            guard let m = file(cursor) else { break }
            if m.owner == account { return .owner }
            for e in m.access where e.account == account && !e.isDeleted && e.mode != .owner {
                best = max(best ?? e.mode, e.mode)
            }
            if m.isRoot { break }
            cursor = m.parent
        }
        return best
    }

    /// The nearest file at or above `id` with a live grant to an account other than its owner
    /// (so everything below it is seen by that account), or nil.
    public func sharedAncestor(ofOrAt id: FileID) -> FileID? {
        var cursor = id
        for _ in 0...TreeLimits.maxDepth + 1 {
            guard let m = file(cursor) else { return nil }
            if m.isShared { return cursor }
            if m.isRoot { return nil }
            cursor = m.parent
        }
        return nil
    }
}

extension FileMetadata {
    /// Whether another account holds a live grant on this file itself.
    public var isShared: Bool { access.contains { $0.account != owner && !$0.isDeleted } }

    /// The live grant to `account`, if any.
    public func grant(to account: AccountID) -> AccessEntry? {
        access.first { $0.account == account && !$0.isDeleted }
    }
}

/// Why a change was refused for want of access, or because a grant or link breaks a rule.
/// The server answers these with 403; the CLI prints the description, the mount EACCES (or
/// EXDEV for `crossOwner`, which tools answer by copying).
public enum AccessError: Error, Equatable, Sendable, CustomStringConvertible {
    /// The writer lacks the mode the change needs.
    case denied(String)
    /// A grant that is malformed, unsigned, or not the owner's to give.
    case invalidGrant(String)
    /// A link that breaks a link rule.
    case invalidLink(String)
    /// A file placed under another owner's folder (a move across owners, or a new file whose
    /// owner is not its parent's).
    case crossOwner(String)

    public var description: String {
        switch self {
        case .denied(let why): return "permission denied: \(why)"
        case .invalidGrant(let why): return "invalid share: \(why)"
        case .invalidLink(let why): return "invalid link: \(why)"
        case .crossOwner(let why): return "cannot move between owners (copy instead): \(why)"
        }
    }
}

/// What the rules need to know about a link's target, which lives in another account's tree.
public struct LinkTargetFacts: Sendable, Equatable {
    public var owner: AccountID
    public var isLive: Bool
    /// The link owner's mode on the target (through the target or an ancestor).
    public var mode: AccessMode?
    /// This account's live links to the target, the link being checked included if stored.
    public var liveLinks: [FileID]

    public init(owner: AccountID, isLive: Bool, mode: AccessMode?, liveLinks: [FileID]) {
        self.owner = owner
        self.isLive = isLive
        self.mode = mode
        self.liveLinks = liveLinks
    }
}

/// The access rules, checked for every changed record of a batch, on the server (for every
/// upsert) and on devices (for every pulled record, and before a local change is committed).
///
/// Each change is authorised against the tree **before** the batch, so nothing a batch does can
/// raise its writer's access for the rest of it (Lockbook checks its staged tree, which appears
/// to let a read-only sharee grant itself write). Who wrote a record is its `lastModifiedBy`;
/// callers check that its signature is that account's.
public enum Authorization {
    /// Checks an Ed25519 signature: `(signer, message, signature) -> valid`.
    public typealias Verify = (AccountID, [UInt8], [UInt8]) -> Bool

    /// Checks every changed record of a batch.
    ///
    /// - `before`: the tree as it was (the server's stored tree of the files' owner).
    /// - `after`: the tree with the batch applied (a `Batch` over `before`).
    /// - `linkTarget`: facts about a link's target, or nil when no such file exists.
    ///
    /// Cost: per changed record, a walk up its ancestors in both trees; a grant added to a
    /// folder and a folder moved under a shared folder also walk the folder's subtree (looking
    /// for links, which may not be shared), as the share itself sends that subtree anyway.
    public static func check<Before: TreeView, After: TreeView>(
        changed: some Sequence<FileID>, before: Before, after: After,
        verify: Verify, linkTarget: (FileID) -> LinkTargetFacts? = { _ in nil },
        describe: (FileID) -> String = { $0.description }
    ) throws(AccessError) {
        for id in changed {
            guard let m = after.file(id) else { continue }
            try checkRecord(
                m, old: before.file(id), before: before, after: after, verify: verify, linkTarget: linkTarget,
                describe: describe)
        }
    }

    static func checkRecord<Before: TreeView, After: TreeView>(
        _ m: FileMetadata, old: FileMetadata?, before: Before, after: After, verify: Verify,
        linkTarget: (FileID) -> LinkTargetFacts?, describe: (FileID) -> String
    ) throws(AccessError) {
        let actor = m.lastModifiedBy
        let name = describe(m.id)
        if let old, old.owner != m.owner { throw .crossOwner("\(name) changes owner") }
        if m.isRoot {
            // Only an account's own root; the validator keeps it unchanged afterwards.
            guard m.owner == actor else { throw .denied("\(name) is another account's root") }
            if m.access.contains(where: { $0.account != m.owner || $0.mode != .owner || !$0.signature.isEmpty }) {
                throw .invalidGrant("the root folder cannot be shared")
            }
            return
        }
        // One owner per subtree: a file is its parent's owner's (so a file created in a shared
        // folder is the folder owner's, who is billed for it), and never moves to another.
        if let parent = after.file(m.parent), parent.owner != m.owner {
            throw .crossOwner("\(name) would sit in a folder another account owns")
        }
        // What only the owner changes, whoever else may write the file: a deleted file (its
        // devices adopt and prune it; a grantee re-signing one could leave a record below folders
        // they have forgotten, which they could then never judge), and the key generation
        // (give-ups are judged by it; another writer's new file starts at 0).
        if actor != m.owner {
            if old?.isDeleted == true { throw .denied("\(name) is deleted; only its owner changes it now") }
            if m.keyGeneration != (old?.keyGeneration ?? 0) {
                throw .denied("only the owner of \(name) replaces its key")
            }
        }
        // Placement (create, rename, move, delete, restore) needs write on the folder it leaves
        // and the folder it enters; a sharee holds neither above a shared folder, so it cannot
        // rename, move or delete the shared folder itself, only its own link to it.
        // The file's key is wrapped under its parent's, so a new wrapping is the parent's
        // business too: a grantee holding write on a shared folder, but not on the folder above
        // it, must not replace the folder's key (it could only write one its owner cannot open).
        let placementChanged =
            old == nil || old?.parent != m.parent || old?.name != m.name || old?.isDeleted != m.isDeleted
            || old?.wrappedKey != m.wrappedKey
        if placementChanged {
            if let old { try need(.write, on: old.parent, in: before, after: after, actor: actor, for: name) }
            if old?.parent != m.parent {
                try need(.write, on: m.parent, in: before, after: after, actor: actor, for: name)
            }
        }
        // Content and attributes: write on the file itself. So is any other change another
        // account makes, even one that changes nothing but the writer (a re-signed record that
        // only a writer may leave behind), but for giving up its own grant, which `checkGrants`
        // judges alone.
        if let old {
            var grantsOnly = old
            grantsOnly.access = m.access
            grantsOnly.lastModifiedBy = m.lastModifiedBy
            let givingUp = actor != m.owner && grantsOnly == m && old.access != m.access
            if !givingUp,
                actor != m.owner || old.sealedAttributes != m.sealedAttributes || old.contentDigest != m.contentDigest
                    || old.type != m.type || old.linkTarget != m.linkTarget
            {
                try need(.write, on: m.id, in: before, after: after, actor: actor, for: name)
            }
        }
        try checkGrants(m, old: old, actor: actor, verify: verify, name: name)
        if m.isShared, old?.isShared != true || old?.isDeleted != m.isDeleted,
            let link = firstLink(atOrBelow: m.id, in: after)
        {
            throw .invalidLink("\(describe(link)) is a link; a folder holding a link cannot be shared")
        }
        if let old, old.parent != m.parent, !m.isDeleted, after.sharedAncestor(ofOrAt: m.parent) != nil,
            let link = firstLink(atOrBelow: m.id, in: after)
        {
            throw .invalidLink("\(describe(link)) is a link; links cannot be moved into a shared folder")
        }
        try checkLink(m, old: old, after: after, linkTarget: linkTarget, name: name)
    }

    /// Throws unless `actor` held at least `mode` on `id` before the batch. A folder the batch
    /// itself creates is judged by its nearest ancestor that existed before (whose access a new
    /// folder inherits), or, in a tree the batch creates whole, by whose root it is.
    static func need<Before: TreeView, After: TreeView>(
        _ mode: AccessMode, on id: FileID, in before: Before, after: After, actor: AccountID, for name: String
    ) throws(AccessError) {
        var cursor = id
        for _ in 0...TreeLimits.maxDepth + 1 {
            if before.file(cursor) != nil {
                if let held = before.accessMode(of: actor, on: cursor), held >= mode { return }
                throw .denied("\(name) needs \(mode == .read ? "read" : "write") access")
            }
            guard let m = after.file(cursor) else { break }
            // A root the batch creates (an account's first push) is its owner's alone.
            if m.isRoot {
                if m.owner == actor { return }
                break
            }
            cursor = m.parent
        }
        throw .denied("\(name) is in no folder the writer can reach")
    }

    /// At most one grant per account, and none removed (a removal would be an unsigned change
    /// made by dropping bytes): revoked grants stay as tombstones.
    static func checkGrantList(_ m: FileMetadata, old: FileMetadata?, name: String) throws(AccessError) {
        var seen: Set<AccountID> = []
        for e in m.access {
            guard seen.insert(e.account).inserted else { throw .invalidGrant("\(name) has two grants to one account") }
        }
        for e in old?.access ?? [] where !seen.contains(e.account) {
            throw .invalidGrant("\(name): a grant was removed instead of revoked")
        }
    }

    /// Grants change only by the owner, one per account, never removed, always signed; the
    /// one exception is a grantee giving up its own grant (a tombstone it signs).
    static func checkGrants(
        _ m: FileMetadata, old: FileMetadata?, actor: AccountID, verify: Verify, name: String
    ) throws(AccessError) {
        try checkGrantList(m, old: old, name: name)
        for e in m.access {
            let previous = old?.access.first { $0.account == e.account }
            if previous == e { continue }  // unchanged, checked when it was written
            if e.account == m.owner { throw .invalidGrant("\(name): an owner holds no grant on its own file") }
            guard e.mode != .owner else { throw .invalidGrant("\(name): a grant is read or write") }
            guard e.generation <= m.keyGeneration else {
                throw .invalidGrant("\(name): a grant names a key generation the file has not reached")
            }
            guard m.type != .link else { throw .invalidGrant("\(name) is a link; share its target instead") }
            guard e.sealedKey.count <= 256, e.signature.count == 64 else {
                throw .invalidGrant("\(name): a grant is not signed")
            }
            let message = e.grantMessage(fileID: m.id)
            if actor == m.owner, e.ownerSignature == nil, verify(m.owner, message, e.signature) { continue }
            // A grantee may give its own grant up (reject, leave), and nothing else; the give-up
            // keeps the owner's signature of the grant it ends (`AccessEntry.ownerSignature`).
            if actor == e.account, e.isDeleted, let previous, !previous.isDeleted, previous.mode == e.mode,
                previous.sealedKey == e.sealedKey, previous.generation == e.generation,
                verify(e.account, message, e.signature), e.endsOwnersGrant(m, verify)
            {
                continue
            }
            throw actor == m.owner
                ? .invalidGrant("\(name): a grant's signature does not verify")
                : .denied("only the owner shares \(name), changes a mode or removes someone")
        }
    }

    /// A link names a live file of another account that its owner can read, is the account's
    /// only live link to it, and sits outside shared folders (a link inside a shared folder
    /// would show the sharees a file that was never shared with them).
    static func checkLink<After: TreeView>(
        _ m: FileMetadata, old: FileMetadata?, after: After, linkTarget: (FileID) -> LinkTargetFacts?,
        name: String
    ) throws(AccessError) {
        guard m.type == .link else {
            if m.linkTarget != nil { throw .invalidLink("\(name) names a target but is not a link") }
            return
        }
        guard let target = m.linkTarget else { throw .invalidLink("\(name) names no target") }
        if m.isDeleted { return }  // a deleted link may point anywhere, even at nothing
        if after.sharedAncestor(ofOrAt: m.parent) != nil {
            throw .invalidLink("\(name) would sit in a shared folder")
        }
        // A link that already stood and keeps its target is not judged again on a rename or a
        // move (its target may have gone since; the merge removes such links).
        if let old, !old.isDeleted, old.linkTarget == target { return }
        // One answer for a target that is missing, deleted, the link owner's own or not shared
        // with it, so links cannot be used to probe which file ids exist.
        guard let facts = linkTarget(target), facts.isLive, facts.owner != m.owner, facts.mode != nil else {
            throw .invalidLink("\(name): no such file is shared with this account")
        }
        if facts.liveLinks.contains(where: { $0 != m.id }) {
            throw .invalidLink("\(name): the shared file already has a link in this tree")
        }
    }

    /// The first live link at or below `id` (a walk of the live subtree), or nil.
    static func firstLink<T: TreeView>(atOrBelow id: FileID, in tree: T) -> FileID? {
        var queue = [id]
        var seen: Set<FileID> = [id]
        while let next = queue.popLast() {
            guard let m = tree.file(next), !m.isDeleted else { continue }
            if m.type == .link { return next }
            guard m.type == .folder else { continue }
            for c in tree.childIDs(of: next) where seen.insert(c).inserted { queue.append(c) }
        }
        return nil
    }
}

extension AccessEntry {
    /// Grants merged field by field (docs/SYNC.md): every account's entry is taken from the side
    /// that changed it since the base; when both did, a revocation wins (the safer outcome, and
    /// the same on every device), else the remote's.
    public static func merged(base: [AccessEntry], local: [AccessEntry], remote: [AccessEntry]) -> [AccessEntry] {
        func byAccount(_ list: [AccessEntry]) -> [AccountID: AccessEntry] {
            Dictionary(list.map { ($0.account, $0) }, uniquingKeysWith: { a, _ in a })
        }
        let b = byAccount(base)
        let l = byAccount(local)
        var merged = remote
        var index = Dictionary(remote.enumerated().map { ($1.account, $0) }, uniquingKeysWith: { a, _ in a })
        for e in local where l[e.account] == e {
            let localChanged = b[e.account] != e
            guard localChanged else { continue }
            if let i = index[e.account] {
                let r = merged[i]
                let remoteChanged = b[e.account] != r
                if !remoteChanged || (e.isDeleted && !r.isDeleted) { merged[i] = e }
            } else {
                index[e.account] = merged.count
                merged.append(e)
            }
        }
        return merged
    }
}

extension Authorization {
    /// How a device judges a pulled record of a tree it does not write alone (its own, where
    /// grantees write too, or another account's shared with it), against `tree`: what it held
    /// before with the pulled records staged over it. `old` is the record it held, if any.
    ///
    /// - One owner per subtree: a record under a folder of another owner is refused, whoever
    ///   signed it (a server could otherwise plant files of an account it made up in a share).
    /// - Grants are judged on their own signatures, whoever carried them (`checkPulledGrants`).
    /// - A record written by someone other than its owner needs write, by a grant the owner
    ///   signed that is live or that the writer gave up itself (`TreeView.heldWrite`; never one
    ///   the owner revoked or lowered, since the owner's change signs what the writer wrote as
    ///   the owner's own, and the server takes no such change before it does): on the file or
    ///   a folder above for content and attributes; when the device holds the record before,
    ///   and its name, place, deletion or key wrapping changed, on the folder it left and the
    ///   one it entered (so a grantee cannot rename, move, delete or re-key the shared folder
    ///   itself); or it only gives up the writer's own grant.
    ///
    /// Without the record before (a device new to the file), a change's kind cannot be told:
    /// only write at or above the file is asked (the owner's devices re-sign what grantees
    /// write as they pull it, which closes that window; docs/SHARING.md, "What devices verify").
    ///
    /// `keyOpens`, when given (a device that holds the keys above the file: the owner's), says
    /// whether a record's key unwraps under its folder's key there; a rotation carried by a
    /// writer's change counts only if it does, so a forged wrapping is refused where it can be
    /// told.
    public static func checkPulled<T: TreeView>(
        _ m: FileMetadata, old: FileMetadata?, in tree: T, keyOpens: ((FileMetadata) -> Bool)? = nil,
        verify: Verify
    ) throws(AccessError) {
        func wrote(_ actor: AccountID, atOrAbove id: FileID) -> Bool {
            tree.heldWrite(by: actor, atOrAbove: id, verify: verify)
        }
        if let old, old == m { return }  // what the device holds already
        let actor = m.lastModifiedBy
        let name = m.id.description
        if let old, old.owner != m.owner { throw .crossOwner("\(name) changes owner") }
        if !m.isRoot, let parent = tree.file(m.parent), parent.owner != m.owner {
            throw .crossOwner("\(name) would sit in a folder another account owns")
        }
        try checkPulledGrants(m, old: old, verify: verify, name: name)
        guard actor != m.owner else { return }
        if m.isRoot { throw .denied("\(name) is another account's root") }
        let denied = AccessError.denied("\(name) was written by an account without write access to it")
        guard let old else {
            if wrote(actor, atOrAbove: m.id) { return }
            throw denied
        }
        var grantsOnly = old
        grantsOnly.access = m.access
        grantsOnly.lastModifiedBy = actor
        // A grant given up (judged above), by a writer that held it live.
        if grantsOnly == m && old.access != m.access
            && old.access.contains(where: { $0.account == actor && !$0.isDeleted })
        {
            return
        }
        // A new key generation wrapped under the same folder is the owner's rotation, which a
        // writer's later change to the file carries along (the device never saw the owner's
        // version in between). A writer cannot rotate (the server holds it to write on the
        // folder above); the owner's devices check the new wrapping opens (`keyOpens`), and a
        // grantee's device, which cannot, never uses it (its key comes from its grant).
        let rotationCarried =
            old.wrappedKey != m.wrappedKey && m.keyGeneration > old.keyGeneration && old.parent == m.parent
            && keyOpens?(m) != false
        // The key generation is the owner's to move (give-ups are judged by it), only ever
        // together with a new key.
        if old.keyGeneration != m.keyGeneration, !rotationCarried { throw denied }
        let placementChanged =
            old.parent != m.parent || old.name != m.name || old.isDeleted != m.isDeleted
            || (old.wrappedKey != m.wrappedKey && !rotationCarried)
        if placementChanged {
            guard wrote(actor, atOrAbove: old.parent) else { throw denied }
            if old.parent != m.parent, !wrote(actor, atOrAbove: m.parent) {
                throw denied
            }
        }
        guard wrote(actor, atOrAbove: m.id) else { throw denied }
    }

    /// Grants of a pulled record, each judged by its own signature, whoever wrote the record: a
    /// grant the device held unchanged stands; any other is the owner's, signed by it, or a
    /// tombstone its grantee signed giving up a grant the owner made (the owner's signature of
    /// it kept, at the mode and key it had when the device knows them). None removed, one per
    /// account, none to the owner or on a link.
    static func checkPulledGrants(
        _ m: FileMetadata, old: FileMetadata?, verify: Verify, name: String
    ) throws(AccessError) {
        try checkGrantList(m, old: old, name: name)
        for e in m.access {
            let previous = old?.access.first { $0.account == e.account }
            if previous == e { continue }
            if m.isRoot, e.account == m.owner, e.mode == .owner, e.signature.isEmpty { continue }
            guard e.account != m.owner, e.mode != .owner, m.type != .link, e.sealedKey.count <= 256,
                e.signature.count == 64, e.generation <= m.keyGeneration
            else { throw .invalidGrant("\(name) carries a grant no owner could make") }
            // A grant the device holds revoked or given up does not come back as it was: a new
            // grant seals the key afresh (sealed boxes are randomised), so the same sealed key
            // live again is the old grant's signature replayed over its end.
            if let previous, previous.isDeleted, !e.isDeleted, previous.sealedKey == e.sealedKey {
                throw .invalidGrant("\(name) brings back a grant that was revoked or given up")
            }
            let message = e.grantMessage(fileID: m.id)
            if e.ownerSignature == nil, verify(m.owner, message, e.signature) { continue }
            // A grantee gives up only a grant the owner made, whose signature the give-up keeps;
            // when the device knows the record before, the grant must be live in it, at the same
            // mode and key (an owner's revocation keeps both, and the revoked grantee still holds
            // the owner's signature of its grant: it must not turn the revocation into a give-up
            // that counts for what it writes), or be of a newer key generation (the owner's
            // reseal at a rotation this device has not seen yet; a revocation rotates too).
            if e.isDeleted, verify(e.account, message, e.signature), e.endsOwnersGrant(m, verify),
                old == nil
                    || previous.map({
                        !$0.isDeleted && $0.mode == e.mode
                            && ($0.generation < e.generation
                                || ($0.sealedKey == e.sealedKey && $0.generation == e.generation))
                    }) == true
            {
                continue
            }
            throw .invalidGrant("\(name) carries a grant its owner did not sign (only the owner shares)")
        }
    }
}

extension AccessEntry {
    /// Whether this give-up carries the owner's signature of the live grant it ends, sealed at
    /// the record's key generation (every live grant is sealed again when its file's key is
    /// replaced, and the owner's device turns a give-up into its own revocation before it
    /// replaces the key; a grant the owner revoked and then re-keyed is of an older generation).
    func endsOwnersGrant(_ m: FileMetadata, _ verify: Authorization.Verify) -> Bool {
        guard let ownerSignature, generation == m.keyGeneration else { return false }
        return verify(m.owner, liveGrant.grantMessage(fileID: m.id), ownerSignature)
    }

    /// Whether this entry vouches, by the owner's signature, for what its grantee writes at
    /// `mode` or above: a live grant the owner signed, or one the grantee gave up (the owner's
    /// signature of it kept). A grant the owner revoked or lowered does not: the owner's device
    /// signs what the grantee wrote as its own in the same change, and the server refuses the
    /// change until it has (`CofferServer`'s orphaned-writes rule).
    func vouches(for mode: AccessMode, in m: FileMetadata, _ verify: Authorization.Verify) -> Bool {
        guard self.mode >= mode else { return false }
        if isDeleted { return endsOwnersGrant(m, verify) }
        return ownerSignature == nil && verify(m.owner, grantMessage(fileID: m.id), signature)
    }
}

extension TreeView {
    /// Whether `account` may have written what it wrote on `id`: it owns it, or a grant of
    /// write the owner signed, live or given up by the grantee itself, sits on it or a folder
    /// above (`AccessEntry.vouches`). What a grantee wrote under a grant the owner later revoked
    /// or lowered is not covered: the owner's devices sign all of it as their own with the
    /// change, so none is left in the tree once the change is in.
    public func heldWrite(by account: AccountID, atOrAbove id: FileID, verify: Authorization.Verify) -> Bool {
        var cursor = id
        for _ in 0...TreeLimits.maxDepth + 1 {
            guard let m = file(cursor) else { return false }
            if m.owner == account { return true }
            let written = m.access.contains { $0.account == account && $0.vouches(for: .write, in: m, verify) }
            if written { return true }
            if m.isRoot { return false }
            cursor = m.parent
        }
        return false
    }
}
