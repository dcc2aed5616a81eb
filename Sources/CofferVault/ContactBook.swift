import CofferCrypto
import CofferModel
import Foundation

/// The contacts an account pinned and forgot, as its devices share them through the server
/// (docs/SHARING.md, "Contacts across devices"): sealed under the account's root key, so the
/// server neither reads nor forges it, with the book's revision inside, so a device refuses a
/// book older than one it saw.
public struct ContactBook: Sendable, Equatable {
    /// By username key: the pinned contact, or when the name was forgotten.
    public enum Entry: Sendable, Equatable {
        case pinned(Contact)
        case forgotten(stamp: UInt64)

        var stamp: UInt64 {
            switch self {
            case .pinned(let c): return c.stamp
            case .forgotten(let stamp): return stamp
            }
        }
    }

    public var entries: [String: Entry] = [:]

    public init(entries: [String: Entry] = [:]) { self.entries = entries }

    static let tag: [UInt8] = Array("CFCB".utf8)
    static let maxEntries = 100_000

    func encoded(revision: Int64) -> [UInt8] {
        var w = ByteWriter()
        w.raw(Self.tag)
        w.u8(1)
        w.u64(UInt64(clamping: revision))
        w.u32(UInt32(clamping: entries.count))
        for (key, entry) in entries.sorted(by: { $0.key < $1.key }) {
            w.string(key)
            switch entry {
            case .pinned(let c):
                w.u8(1)
                w.data(c.encoded())
            case .forgotten(let stamp):
                w.u8(2)
                w.u64(stamp)
            }
        }
        return w.bytes
    }

    init(decoding bytes: [UInt8], revision: Int64) throws {
        var r = ByteReader(bytes)
        guard try r.raw(4) == Self.tag, try r.u8() == 1 else { throw DecodingError("not a contact book") }
        guard try r.u64() == UInt64(clamping: revision) else {
            throw DecodingError("the contact book's revision is not the one it was served under")
        }
        let n = try r.u32()
        guard n <= Self.maxEntries else { throw DecodingError("too many contacts") }
        for _ in 0..<n {
            let key = try r.string(max: 4 * Username.maxBytes)
            switch try r.u8() {
            case 1:
                let c = try Contact(decoding: try r.data(max: 4096))
                guard Username.key(c.username) == key else {
                    throw DecodingError("a contact is filed under another name")
                }
                entries[key] = .pinned(c)
            case 2: entries[key] = .forgotten(stamp: try r.u64())
            default: throw DecodingError("unknown contact entry")
            }
        }
        try r.expectEnd()
    }

    /// What merging `remote` into `local` gives for one name, and why it is not simply the
    /// newer of the two: a pin is never replaced by a pin of other keys (that would let a server
    /// that lied to one device move the lie to all of them), unless the other one was verified
    /// and this one was not. Such a clash is kept local and reported.
    static func merged(_ local: Entry?, _ remote: Entry?) -> (entry: Entry?, clash: Bool) {
        switch (local, remote) {
        case (nil, let r): return (r, false)
        case (let l, nil): return (l, false)
        case (.pinned(var l)?, .pinned(let r)?):
            if l.sameKeys(r) {
                l.verified = l.verified || r.verified
                l.stamp = max(l.stamp, r.stamp)
                return (.pinned(l), false)
            }
            if r.verified && !l.verified { return (.pinned(r), false) }
            return (.pinned(l), !(l.verified && !r.verified))
        case (let l?, let r?):
            return (r.stamp > l.stamp ? r : l, false)
        }
    }
}

extension Vault {
    /// This device's book: its pinned contacts and the names it forgot.
    public func contactBook() throws -> ContactBook {
        var book = ContactBook()
        for c in try contacts() {
            guard let key = Username.key(c.username) else { continue }
            book.entries[key] = .pinned(c)
        }
        let forgotten = try store.readOne { try $0.settings(withPrefix: Self.forgottenPrefix) }
        for row in forgotten {
            let key = String(row.key.dropFirst(Self.forgottenPrefix.count))
            var r = ByteReader(row.value)
            guard book.entries[key] == nil, let stamp = try? r.u64() else { continue }
            book.entries[key] = .forgotten(stamp: stamp)
        }
        return book
    }

    /// Merges another device's book (as the server holds it) into this device's, in one write.
    /// Returns the username keys whose pins clash (another device pinned other keys for them,
    /// and neither was verified over the other): kept as they are here, for the user to settle.
    public func mergeContactBook(_ remote: ContactBook) throws -> [String] {
        let local = try contactBook()
        var clashes: [String] = []
        try store.write { w in
            for key in Set(local.entries.keys).union(remote.entries.keys).sorted() {
                let (entry, clash) = ContactBook.merged(local.entries[key], remote.entries[key])
                if clash { clashes.append(key) }
                guard entry != local.entries[key] else { continue }
                switch entry {
                case .pinned(let c)?:
                    try w.setSetting(Self.contactPrefix + key, c.encoded())
                    try w.removeSetting(Self.forgottenPrefix + key)
                case .forgotten(let stamp)?:
                    try w.removeSetting(Self.contactPrefix + key)
                    try w.setSetting(Self.forgottenPrefix + key, Self.u64Bytes(stamp))
                case nil: break
                }
            }
        }
        return clashes
    }

    /// The book sealed for the server at `revision`, under the account's root key.
    public func sealContactBook(_ book: ContactBook, revision: Int64) throws -> [UInt8] {
        let (root, key) = try recoveryKey()
        return AEAD.seal(book.encoded(revision: revision), key: key, purpose: .contacts, fileID: root.bytes)
    }

    /// A book the server served at `revision`: it must open under the account's root key (only
    /// its devices sealed it) and name that revision inside.
    public func openContactBook(_ sealed: [UInt8], revision: Int64) throws -> ContactBook {
        let (root, key) = try recoveryKey()
        let plain = try AEAD.open(sealed, key: key, purpose: .contacts, fileID: root.bytes, what: "contact book")
        do { return try ContactBook(decoding: plain, revision: revision) } catch {
            throw VaultError.corrupt("the server's contact book does not decode: \(error)")
        }
    }

    /// The newest revision of the book this device has seen (a server serving an older one is
    /// refused: a rollback).
    public var contactBookRevision: Int64 {
        (try? store.readOne { try $0.setting("contactBookRevision").map(Self.int64) } ?? 0) ?? 0
    }

    public func setContactBookRevision(_ revision: Int64) throws {
        try store.write { w in try w.setSetting("contactBookRevision", Self.bytes(revision)) }
    }
}
