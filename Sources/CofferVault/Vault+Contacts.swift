import CofferCrypto
import CofferModel
import Foundation

/// An account this device has pinned: the keys it was first given for a username, kept so that a
/// later answer from the server with other keys is refused (docs/SHARING.md, "Accounts, keys and
/// contacts").
public struct Contact: Sendable, Equatable {
    public var username: String
    public var signingKey: [UInt8]
    public var boxKey: [UInt8]
    /// The user compared the fingerprint out of band (`coffer contacts verify`).
    public var verified: Bool
    /// When it was last pinned or verified on any device of the account (ms since the epoch):
    /// the newer of a pin and a forgetting of the same name wins when devices merge their
    /// books (`ContactBook`).
    public var stamp: UInt64

    public init(username: String, signingKey: [UInt8], boxKey: [UInt8], verified: Bool = false, stamp: UInt64 = 0) {
        self.username = username
        self.signingKey = signingKey
        self.boxKey = boxKey
        self.verified = verified
        self.stamp = stamp
    }

    public var fingerprint: String { KeyFingerprint.of(signingKey) }

    /// Version 2 adds the stamp.
    static let formatVersion: UInt8 = 2

    func encoded() -> [UInt8] {
        var w = ByteWriter()
        w.u8(Self.formatVersion)
        w.string(username)
        w.data(signingKey)
        w.data(boxKey)
        w.bool(verified)
        w.u64(stamp)
        return w.bytes
    }

    init(decoding bytes: [UInt8]) throws {
        var r = ByteReader(bytes)
        try self.init(reading: &r)
        try r.expectEnd()
    }

    init(reading r: inout ByteReader) throws {
        let version = try r.u8()
        guard version == 1 || version == 2 else { throw DecodingError("unknown contact format") }
        username = try r.string(max: 4 * Username.maxBytes)
        signingKey = try r.data(max: 32)
        boxKey = try r.data(max: 32)
        verified = try r.bool()
        stamp = version >= 2 ? try r.u64() : 0
        guard signingKey.count == 32, boxKey.count == 32 else { throw DecodingError("a contact's keys are 32 bytes") }
        guard Username.key(username) != nil else { throw DecodingError("a contact's username is not valid") }
    }

    /// Same account and keys, whatever the stamp.
    func sameKeys(_ other: Contact) -> Bool { signingKey == other.signingKey && boxKey == other.boxKey }
}

extension Vault {
    /// Contacts live in the store's settings, one row each, keyed by the username's key (so every
    /// spelling of one account finds the same row).
    static let contactPrefix = "contact."

    static func contactKey(_ username: String) throws -> String {
        guard let key = Username.key(username) else { throw VaultError.invalidArgument(Username.rule) }
        return contactPrefix + key
    }

    /// Every pinned contact, by username key.
    public func contacts() throws -> [Contact] {
        try store.readOne { r in
            try r.settings(withPrefix: Self.contactPrefix).map { row in
                do { return try Contact(decoding: row.value) } catch {
                    throw VaultError.corrupt(
                        "the pinned contact \(row.key.dropFirst(Self.contactPrefix.count)) is damaged")
                }
            }
        }
    }

    public func contact(named username: String) throws -> Contact? {
        let key = try Self.contactKey(username)
        guard let bytes = try store.readOne({ try $0.setting(key) }) else { return nil }
        do { return try Contact(decoding: bytes) } catch {
            throw VaultError.corrupt("the pinned contact \(username) is damaged")
        }
    }

    /// Pins (or replaces) a contact, stamped now: the pin is news to the account's other
    /// devices (`ContactBook`). Returns it as pinned.
    @discardableResult
    public func pin(_ contact: Contact) throws -> Contact {
        let key = try Self.contactKey(contact.username)
        var c = contact
        c.stamp = nowMillis
        try store.write { w in
            try w.setSetting(key, c.encoded())
            try w.removeSetting(Self.forgottenPrefix + key.dropFirst(Self.contactPrefix.count))
        }
        return c
    }

    /// Whether the server is known to hold this account's key card (set once a sync confirmed it).
    public var keyCardPublished: Bool {
        get throws { try store.readOne { try $0.setting("keycard.published") } == [1] }
    }

    public func setKeyCardPublished() throws {
        try store.write { w in try w.setSetting("keycard.published", [1]) }
    }

    /// Forgets a pinned contact; false if there was none. The forgetting is kept (a tombstone,
    /// `contactForgotten.`), so the account's other devices forget it too.
    @discardableResult
    public func forgetContact(named username: String) throws -> Bool {
        let key = try Self.contactKey(username)
        guard try store.readOne({ try $0.setting(key) }) != nil else { return false }
        let stamp = nowMillis
        try store.write { w in
            try w.removeSetting(key)
            try w.setSetting(Self.forgottenPrefix + key.dropFirst(Self.contactPrefix.count), Self.u64Bytes(stamp))
        }
        return true
    }

    static let forgottenPrefix = "contactForgotten."

    static func u64Bytes(_ v: UInt64) -> [UInt8] {
        var w = ByteWriter()
        w.u64(v)
        return w.bytes
    }

    // MARK: Names accounts give themselves

    static let claimedNamePrefix = "claimedName."

    /// The name an account signed into its key card, as a server gave it for the account's key:
    /// shown beside the key's fingerprint for a share's owner this device has not pinned, never
    /// taken as a contact (docs/SHARING.md, "On the grantee's device").
    public func claimedName(of account: AccountID) -> String? {
        (try? store.read { r in try r.setting(Self.claimedNamePrefix + hexString(account.bytes)) })?.flatMap {
            String(validating: $0, as: UTF8.self)
        }
    }

    public func rememberClaimedName(_ name: String, of account: AccountID) throws {
        guard Username.normalized(name) != nil else { throw VaultError.invalidArgument(Username.rule) }
        try store.write { w in try w.setSetting(Self.claimedNamePrefix + hexString(account.bytes), Array(name.utf8)) }
    }
}
