import CofferCrypto
import Testing

@testable import CofferVault

/// How two devices' contact books merge, name by name (`ContactBook.merged`).
struct ContactBookTests {
    func contact(_ seed: UInt8, verified: Bool = false, stamp: UInt64) -> Contact {
        Contact(
            username: "bob", signingKey: [UInt8](repeating: seed, count: 32),
            boxKey: [UInt8](repeating: seed, count: 32),
            verified: verified, stamp: stamp)
    }

    @Test func theNewerOfAPinAndAForgettingWinsAndSameKeysCombine() {
        let pin = ContactBook.Entry.pinned(contact(1, stamp: 10))
        #expect(ContactBook.merged(pin, .forgotten(stamp: 11)).entry == .forgotten(stamp: 11))
        #expect(ContactBook.merged(pin, .forgotten(stamp: 9)).entry == pin)
        #expect(ContactBook.merged(.forgotten(stamp: 9), pin).entry == pin)
        #expect(ContactBook.merged(nil, pin).entry == pin)
        #expect(ContactBook.merged(pin, nil).entry == pin)
        // Same keys: verified if either side verified, the later stamp.
        let merged = ContactBook.merged(pin, .pinned(contact(1, verified: true, stamp: 5)))
        #expect(merged.entry == .pinned(contact(1, verified: true, stamp: 10)) && !merged.clash)
    }

    /// A pin is never replaced by one of other keys, however new (a server that lied to one
    /// device would move its lie to all), unless that one was verified and this one not.
    @Test func otherKeysNeverReplaceAPinUnlessVerifiedOverIt() {
        let mine = ContactBook.Entry.pinned(contact(1, stamp: 10))
        let newer = ContactBook.merged(mine, .pinned(contact(2, stamp: 99)))
        #expect(newer.entry == mine && newer.clash)
        let verified = ContactBook.Entry.pinned(contact(2, verified: true, stamp: 5))
        #expect(ContactBook.merged(mine, verified) == (verified, false))
        let myVerified = ContactBook.Entry.pinned(contact(1, verified: true, stamp: 1))
        #expect(ContactBook.merged(myVerified, .pinned(contact(2, stamp: 99))) == (myVerified, false))
        let both = ContactBook.merged(myVerified, verified)
        #expect(both.entry == myVerified && both.clash)
    }

    @Test func aBookDecodesOnlyAtItsOwnRevision() throws {
        var book = ContactBook()
        book.entries["bob"] = .pinned(contact(1, stamp: 3))
        book.entries["carol"] = .forgotten(stamp: 4)
        let bytes = book.encoded(revision: 7)
        #expect(try ContactBook(decoding: bytes, revision: 7) == book)
        #expect(throws: (any Error).self) { try ContactBook(decoding: bytes, revision: 6) }
        #expect(throws: (any Error).self) { try ContactBook(decoding: Array(bytes.dropLast()), revision: 7) }
    }
}
