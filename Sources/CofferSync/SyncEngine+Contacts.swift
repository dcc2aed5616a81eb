import CofferCrypto
import CofferModel
import CofferProtocol
import CofferVault
import Foundation

/// Why a contact's keys were not taken.
public enum ContactError: Error, CustomStringConvertible, Sendable {
    /// The server's answer for the username is not a card its own key signed.
    case unsigned(String)
    /// The server now gives another key than the one pinned for the username.
    case changed(username: String, pinned: String, offered: String)

    public var description: String {
        switch self {
        case .unsigned(let name):
            return "the server's keys for \(name) are not signed by that account (an account made before key cards "
                + "signs its keys at its next sync); nothing was pinned"
        case .changed(let name, let pinned, let offered):
            return "the server gives \(name) a different key than the one pinned here (pinned \(pinned), now "
                + "\(offered)); refusing it. If \(name) really has a new account key, check the new fingerprint "
                + "with them and run `coffer contacts forget \(name)` first"
        }
    }
}

extension SyncEngine {
    /// This account's key card, signed here.
    func ownKeyCard() -> KeyCard {
        let keys = vault.exportedSecret
        return KeyCard(username: vault.username, signing: keys.signingKeys, boxKey: keys.boxKeys.publicKey.bytes)
    }

    /// Publishes this account's key card if the server holds none (accounts made before cards).
    /// Once the server is seen to hold it, the store remembers, so it costs one lookup per
    /// account, not per sync.
    func publishKeyCardIfNeeded() async throws {
        guard
            cardChecked.withLock({ checked in
                defer { checked = true }
                return !checked
            }), try !vault.keyCardPublished
        else { return }
        let mine = try await client.lookup(username: vault.username)
        if mine.keyCard?.isValid != true || mine.signingKey != Data(vault.exportedSecret.signingKeys.publicKey.bytes) {
            try await client.publishCard(KeyCardRequest(card: Data(ownKeyCard().signature)))
        }
        try vault.setKeyCardPublished()
    }

    /// The keys of `username`, as this device pinned them or, the first time, as the server
    /// gives them under the account's own signature (pinned then: trust on first use). A server
    /// answer with other keys than the pinned ones is refused (`ContactError.changed`).
    public func contact(_ username: String) async throws -> (contact: Contact, newlyPinned: Bool) {
        guard Username.normalized(username) != nil else { throw VaultError.invalidArgument(Username.rule) }
        let answer = try await client.lookup(username: username)
        guard let card = answer.keyCard, card.isValid, Username.key(answer.username) == Username.key(username) else {
            throw ContactError.unsigned(username)
        }
        if let pinned = try vault.contact(named: username) {
            guard pinned.signingKey == card.signingKey, pinned.boxKey == card.boxKey else {
                throw ContactError.changed(
                    username: pinned.username, pinned: pinned.fingerprint, offered: card.fingerprint)
            }
            return (pinned, false)
        }
        let contact = try vault.pin(Contact(username: card.username, signingKey: card.signingKey, boxKey: card.boxKey))
        return (contact, true)
    }
}

extension SyncEngine {
    /// Merges this device's contact book with the one the account's devices share through the
    /// server (docs/SHARING.md, "Contacts across devices"), and sends the result back when it
    /// holds anything the server's lacks. The server's book must open under the account's root
    /// key and be no older than the newest this device saw. Returns the names whose pins clash.
    func syncContacts() async throws -> [String] {
        for _ in 0..<4 {
            let served = try await client.contactBook()
            guard served.revision >= vault.contactBookRevision else {
                throw SyncError.protocolError(
                    "the server's contact book (revision \(served.revision)) is older than one this device saw "
                        + "(revision \(vault.contactBookRevision)); a rollback, not taken")
            }
            let remote = try served.sealed.map { try vault.openContactBook(Array($0), revision: served.revision) }
            if served.sealed == nil, served.revision != 0 {
                throw SyncError.protocolError("the server's contact book has a revision and no content")
            }
            let theirs = remote ?? ContactBook()
            let clashes = try vault.mergeContactBook(theirs)
            // A clashing name stays as the server's book has it: each device keeps its own pin,
            // and neither overwrites the other's at every sync.
            var merged = try vault.contactBook()
            for key in clashes { merged.entries[key] = theirs.entries[key] }
            let names = clashes.compactMap { key -> String? in
                if case .pinned(let c)? = theirs.entries[key] { return c.username }
                return nil
            }
            if merged == theirs {
                try vault.setContactBookRevision(served.revision)
                return names
            }
            guard served.revision < Int64.max else { throw SyncError.protocolError("the contact book is full") }
            let next = served.revision + 1
            do {
                let sealed = try vault.sealContactBook(merged, revision: next)
                try await client.putContactBook(ContactBookMessage(sealed: Data(sealed), revision: next))
                try vault.setContactBookRevision(next)
                return names
            } catch SyncError.server(status: 409, _, _) {
                continue  // another device wrote first: merge with its book
            }
        }
        throw SyncError.protocolError("the contact book kept changing on the server; try again")
    }
}

extension SyncEngine {
    /// The box keys of `accounts`, for sealing new keys to grantees that keep access when a
    /// grant is revoked (`Vault.unshare`): the pinned contact's where there is one, else the one
    /// in the account's key card, fetched by its signing key and taken only under its own
    /// signature (a server cannot slip in a box key of its own). Not pinned: a card found by
    /// key names nobody the user asked for.
    public func boxKeys(for accounts: Set<AccountID>) async throws -> [AccountID: PublicBoxKey] {
        var pinned: [[UInt8]: [UInt8]] = [:]
        for c in try vault.contacts() { pinned[c.signingKey] = c.boxKey }
        var out: [AccountID: PublicBoxKey] = [:]
        for account in accounts {
            if let box = pinned[account.bytes] {
                out[account] = try PublicBoxKey(bytes: box)
                continue
            }
            let answer = try await client.lookup(key: account.bytes)
            guard let card = answer.keyCard, card.isValid, card.signingKey == account.bytes else {
                throw ContactError.unsigned("the account with key \(KeyFingerprint.of(account.bytes))")
            }
            out[account] = try PublicBoxKey(bytes: card.boxKey)
        }
        return out
    }
}

extension SyncEngine {
    /// Seals again the grants a merge left under a replaced key (`Vault.staleGrantees`), with
    /// the grantees' box keys (`boxKeys(for:)`), so that no grant pushed holds a key a rotation
    /// replaced.
    func resealStaleGrants() async throws {
        let grantees = try vault.staleGrantees()
        guard !grantees.isEmpty else { return }
        try vault.resealStaleGrants(boxKeys: try await boxKeys(for: grantees))
    }
}
