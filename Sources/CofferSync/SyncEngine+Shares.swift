import CofferCrypto
import CofferModel
import CofferProtocol
import CofferVault
import Foundation

/// The grantee's side of sync (docs/SHARING.md, "On the grantee's device"): other accounts'
/// files shared with this one come from the share feed, read with a cursor of its own, checked
/// record by record, with their content fetched through each document (`via`).
extension SyncEngine {
    /// Pulls the share feed and applies it (`Vault.applyFeed`, which also removes the links
    /// whose share it took out of reach).
    func pullFeed(_ report: inout SyncReport) async throws {
        let cursor = vault.feedCursor
        let read = try await updates(since: cursor, feed: true)
        guard !read.files.isEmpty || !read.gone.isEmpty || !read.regranted.isEmpty || read.latest != cursor else {
            return
        }
        let (accepted, refused) = try vault.checkFeed(Array(read.files.values))
        report.refusedShared += refused
        // Content before the metadata that names it.
        report.fetchedChunks += try await fetch(
            try vault.onDemandFilter(try vault.feedContentNeeds(accepted)), shared: true)
        let (changed, removedLinks) = try vault.applyFeed(
            accepted, gone: Array(read.gone), regranted: read.regranted, cursor: read.latest)
        report.removedLinks += removedLinks
        report.pulled += accepted.count
        report.changed.formUnion(changed)
        // Best effort: a name to show for owners this device has not pinned.
        try? await learnOwnerNames(Set(accepted.map(\.signed.metadata.owner)))
    }

    /// Remembers the name each of `owners` signed into its key card, for display beside its
    /// fingerprint (`Vault.claimedName`). Never pinned: a server can make an account and sign a
    /// card with any free name, so only `coffer contacts add` (trust on first use of a name the
    /// user asked for) or `verify` make a contact. Owners already pinned or named are skipped.
    func learnOwnerNames(_ owners: Set<AccountID>) async throws {
        let pinned = Set(try vault.contacts().map(\.signingKey))
        for owner in owners where !pinned.contains(owner.bytes) && vault.claimedName(of: owner) == nil {
            let answer = try await client.lookup(key: owner.bytes)
            guard let card = answer.keyCard, card.isValid, card.signingKey == owner.bytes else { continue }
            try vault.rememberClaimedName(card.username, of: owner)
        }
    }

    /// Gives up this account's grant on the share `id` (reject a pending share, or leave an
    /// accepted one): the owner's record with the grant tombstoned goes to the server at once
    /// (it is a change to another account's tree, which this device does not keep pending), and
    /// the share leaves this device once the server took it.
    public func rejectShare(_ id: FileID) async throws {
        guard transport.reachable(timeout: 3) else { throw SyncError.offline("no connection to the server") }
        let record = try vault.shareRejection(id)
        _ = try await client.upsert(
            UpsertRequest(updates: [
                FileUpdate(
                    record: Data(record.stored.signed.encoded()),
                    expectedParent: record.expectedParent.map { Data($0.bytes) },
                    expectedNameMAC: record.expectedNameMAC.map { Data($0) },
                    expectedRevision: record.expectedRevision)
            ]))
        try vault.forgetShare(id)
    }

    /// Pushes this account's changes to shared files into their owners' trees: content through
    /// the share (`via`), then each owner's records as a batch of its own. A push refused as
    /// stale pulls the feed (which merges the owner's changes with these) and tries again.
    func pushShared(_ report: inout SyncReport) async throws {
        var attempts = 0
        while true {
            var byVia: [FileID: [PendingUpload]] = [:]
            for (u, via) in try vault.pendingSharedContent() { byVia[via, default: []].append(u) }
            for (via, uploads) in byVia.sorted(by: { $0.key < $1.key }) {
                try await upload(uploads, &report, via: via)
            }
            let pending = try vault.pendingSharedRecords()
            if pending.isEmpty { return }
            do {
                for (owner, records) in pending.sorted(by: { $0.key.bytes.lexicographicallyPrecedes($1.key.bytes) }) {
                    do {
                        try await upsert(records, &report) { [vault] in try vault.markSharedPushed($0, version: $1) }
                    } catch let SyncError.server(status, code, message)
                        where status == 403 || code == ErrorResponse.writesPaused
                    {
                        // Refused by the rules for now, or held back while the owner ends someone's
                        // access: kept pending, tried again at the next sync, and the other
                        // owners go on.
                        let who = KeyFingerprint.of(owner.bytes)
                        report.refusedSharedPush.append("changes to the tree of \(who) not taken: \(message)")
                    }
                }
                return
            } catch let e as SyncError where e.isGetUpdatesRequired && attempts < 8 {
                attempts += 1
                try await pullFeed(&report)
            }
        }
    }
}
