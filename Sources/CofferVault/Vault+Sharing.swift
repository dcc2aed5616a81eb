import CofferCrypto
import CofferModel
import CofferStore
import Foundation

/// The owner's side of sharing (docs/SHARING.md): grants added, changed and revoked on this
/// account's own files, each grant's key sealed for its grantee and the grant signed here.
extension Vault {
    /// Shares `id` with `contact` at `mode` (read or write), or changes the mode of its grant.
    /// The file's key is sealed for the contact's box key together with file, grantee, mode and
    /// owner, and the grant is signed with this account's key; the access rules are checked
    /// here as the server will check them, so a refusal comes with the rule's own words.
    public func share(_ id: FileID, with contact: Contact, mode: AccessMode) throws {
        guard mode == .read || mode == .write else { throw VaultError.invalidArgument("a share is read or write") }
        let grantee = try AccountID(bytes: contact.signingKey)
        guard grantee != accountID else { throw VaultError.invalidArgument("you cannot share with yourself") }
        let box = try PublicBoxKey(bytes: contact.boxKey)
        try commit { batch, s, _ in
            guard let m = batch.file(id), s.view.tree.isLive(id) else {
                throw VaultError.tree(.notFound(s.view.describe(id)))
            }
            if m.isRoot { throw VaultError.invalidArgument("the root folder cannot be shared; share a folder in it") }
            if let live = m.grant(to: grantee), live.mode == mode {
                throw VaultError.invalidArgument("\(s.view.describe(id)) is already shared with \(contact.username)")
            }
            var e = AccessEntry(account: grantee, mode: mode, sealedKey: [])
            sealGrant(&e, key: try s.view.key(id), box: box, fileID: id, generation: m.keyGeneration)
            var access = m.access
            if let i = access.firstIndex(where: { $0.account == grantee }) { access[i] = e } else { access.append(e) }
            // The grantee holds the file's key, not its parent's: the name goes under the former.
            let shareName = try s.view.sealShareName(try s.view.name(id), of: id)
            let me = accountID
            try batch.update(id, describe: s.view.describe) {
                $0.access = access
                $0.lastModifiedBy = me
                if $0.shareName == nil { $0.shareName = shareName }
            }
            try authorize(id, batch: batch, &s)
        }
    }

    /// Revokes `account`'s grant on `id`: the grant stays as a signed tombstone (grants are never
    /// removed), and `id` and everything below it get new keys in the same commit, sealed for
    /// every grantee that keeps access (`granteesKeeping`), whose box keys `boxKeys` must hold
    /// (docs/SHARING.md, "Revocation").
    public func unshare(
        _ id: FileID, from account: AccountID, name: String, boxKeys: [AccountID: PublicBoxKey]
    ) throws {
        // Everything below is sealed again: a store on demand fetches what it lacks first.
        try fetchWholeContent(under: [id])
        try commit { batch, s, w in
            guard let m = batch.file(id) else { throw VaultError.tree(.notFound(s.view.describe(id))) }
            guard let i = m.access.firstIndex(where: { $0.account == account && !$0.isDeleted }) else {
                throw VaultError.invalidArgument("\(s.view.describe(id)) is not shared with \(name)")
            }
            var access = m.access
            access[i].isDeleted = true
            access[i].signature = signing.sign(access[i].grantMessage(fileID: id))
            let me = accountID
            try batch.update(id, describe: s.view.describe) {
                $0.access = access
                $0.lastModifiedBy = me
            }
            var stale: Set<FileID> = []
            _ = try rotateKeys(
                from: id, key: s.view.key(id), parentKey: s.view.key(m.parent), in: &batch, boxKeys: boxKeys,
                staleGrants: &stale, w)
            try authorize(id, batch: batch, &s)
        }
    }

    /// Seals `key` (the file's, of key generation `generation`) for `e`'s grantee, bound to the
    /// file, grantee, mode and this account as owner, and signs the grant: the one place grants
    /// are made.
    func sealGrant(_ e: inout AccessEntry, key: SymmetricKey, box: PublicBoxKey, fileID: FileID, generation: UInt32) {
        e.generation = generation
        e.sealedKey = box.seal(key: key, binding: e.keyBinding(fileID: fileID, owner: accountID))
        e.signature = signing.sign(e.grantMessage(fileID: fileID))
    }

    /// Seals `key` again for every live grant to another account on `m` (`sealGrant`), each
    /// grantee's box key taken from `boxKeys`; refuses if one is missing.
    func sealGrants(of m: inout FileMetadata, key: SymmetricKey, boxKeys: [AccountID: PublicBoxKey]) throws {
        for i in m.access.indices where !m.access[i].isDeleted && m.access[i].account != m.owner {
            guard let box = boxKeys[m.access[i].account] else {
                let who = KeyFingerprint.of(m.access[i].account.bytes)
                throw VaultError.invalidArgument("no key for \(who), who shares \(m.id); cannot seal its key")
            }
            sealGrant(&m.access[i], key: key, box: box, fileID: m.id, generation: m.keyGeneration)
        }
    }

    /// `m`, written by a grantee, as this account takes it over: written by this account, and
    /// each grant its grantee gave up revoked under the owner's signature instead. The owner's
    /// devices adopt what grantees write as they pull it (checked against the grants they hold),
    /// so the server soon holds every record of the tree signed by its owner: a device new to
    /// the tree, or one judging an old record against grants that changed since (a grantee
    /// lowered to read, a folder moved out of a share), then has nothing it cannot check
    /// (docs/SHARING.md, "What devices verify").
    ///
    /// A tombstone its grantee signed becomes the owner's only if it carries this account's
    /// signature of the live grant it ends: the owner never vouches for a grant it did not make.
    func adopted(_ m: FileMetadata) -> FileMetadata {
        guard m.owner == accountID else { return m }
        var out = m
        out.lastModifiedBy = accountID
        for i in out.access.indices where out.access[i].account != accountID && out.access[i].isDeleted {
            let e = out.access[i]
            guard let owners = e.ownerSignature,
                PublicSigningKey.isValid(accountID.bytes, e.liveGrant.grantMessage(fileID: m.id), owners)
            else { continue }
            out.access[i].ownerSignature = nil
            out.access[i].signature = signing.sign(e.grantMessage(fileID: m.id))
        }
        return out
    }

    /// The access rules over one changed record, as the server runs them.
    private func authorize(_ id: FileID, batch: Batch<StoreTree>, _ s: inout VaultState) throws {
        do {
            try Authorization.check(
                changed: [id], before: s.view.tree, after: batch,
                verify: { PublicSigningKey.isValid($0.bytes, $1, $2) },
                describe: s.view.describe)
        } catch { throw VaultError.invalidArgument(error.description) }
    }

    /// The grants to other accounts on `id` and on each folder above it (live and revoked), the
    /// nearest first: who can reach `id`, and through which folder.
    public func grants(reaching id: FileID) throws -> [(file: FileID, grant: AccessEntry)] {
        try state.withLock { s in
            var out: [(FileID, AccessEntry)] = []
            var cursor = id
            for _ in 0...TreeLimits.maxDepth + 1 {
                guard let m = s.view.tree.file(cursor) else { break }
                for e in m.access where e.account != m.owner { out.append((cursor, e)) }
                if m.isRoot { break }
                cursor = m.parent
            }
            if let failure = s.view.tree.takeFailure() { throw VaultError.io(failure) }
            return out
        }
    }

    /// Every file of this account's tree that carries a grant to another account, with its
    /// grants. Streams the store's records once (local over base), holding only those found.
    public func sharedFiles() throws -> [(file: FileID, grants: [AccessEntry])] {
        var found: [FileID: [AccessEntry]] = [:]
        try visitCurrentRecords { m in
            let grants = m.access.filter { $0.account != m.owner }
            if !grants.isEmpty, !m.isDeleted { found[m.id] = grants }
        }
        return found.map { ($0.key, $0.value) }.filter { isLive($0.0) }
    }

    /// Every record of this account's tree as it stands (the local one where there is one, else
    /// the base), read once, a row at a time: for questions no index answers (which files carry
    /// grants, which are links).
    func visitCurrentRecords(_ body: (FileMetadata) throws -> Void) throws {
        var local: Set<FileID> = []
        try store.readOne { r in
            try r.visitFiles(.local) { f in
                local.insert(f.signed.metadata.id)
                try body(f.signed.metadata)
                return true
            }
            try r.visitFiles(.base) { f in
                if !local.contains(f.signed.metadata.id) { try body(f.signed.metadata) }
                return true
            }
        }
    }
}
