import CofferCrypto
import CofferModel
import CofferProtocol
import CofferServerCore
import Foundation
import Testing

@Suite("Key cards: an account's keys under its own signature")
struct KeyCardTests {
    @Test func aCardBindsTheUsernameAndBothKeys() throws {
        let secret = AccountSecret.generate()
        let box = secret.boxKeys.publicKey.bytes
        let card = KeyCard(username: "Bob", signing: secret.signingKeys, boxKey: box)
        #expect(card.isValid)
        // Every spelling of one account agrees (usernames are one account by `Username.key`).
        var other = card
        other.username = "BOB"
        #expect(other.isValid)
        other.username = "bobby"
        #expect(!other.isValid)
        var swapped = card
        swapped.boxKey = AccountSecret.generate().boxKeys.publicKey.bytes
        #expect(!swapped.isValid)
        var stolen = card
        stolen.signingKey = AccountSecret.generate().signingKeys.publicKey.bytes
        #expect(!stolen.isValid)
        var short = card
        short.boxKey.removeLast()
        #expect(!short.isValid)
        // Ten groups of four hex digits; what people read aloud, typed back any way.
        let groups = card.fingerprint.split(separator: " ")
        #expect(groups.count == 10 && groups.allSatisfy { $0.count == 4 && $0.allSatisfy(\.isHexDigit) })
        #expect(
            KeyFingerprint.normalized(card.fingerprint.uppercased().replacingOccurrences(of: " ", with: ":"))
                == KeyFingerprint.normalized(card.fingerprint))
    }

    @Test func theServerKeepsServesAndChecksCards() throws {
        let (server, _) = try makeServer()
        let alice = TestUser("alice")
        let secret = AccountSecret.generate()
        let bobKeys = secret.signingKeys
        let bobBox = secret.boxKeys.publicKey.bytes
        let bob = Data(bobKeys.publicKey.bytes)
        // A card signed for another name, or over other keys, is refused at creation.
        let wrongName = KeyCard(username: "robert", signing: bobKeys, boxKey: bobBox)
        expectRefusal(400) {
            _ = try server.createAccount(
                caller: bob,
                CreateAccountRequest(
                    username: "bob", signingKey: bob, boxKey: Data(bobBox), card: Data(wrongName.signature)))
        }
        let good = KeyCard(username: "bob", signing: bobKeys, boxKey: bobBox)
        _ = try server.createAccount(
            caller: bob,
            CreateAccountRequest(username: "bob", signingKey: bob, boxKey: Data(bobBox), card: Data(good.signature)))
        let served = try server.lookup(username: "BOB")
        #expect(served.keyCard?.isValid == true && served.keyCard?.signature == good.signature)
        // An account made without a card publishes one later; only a valid one is kept.
        _ = try server.createAccount(caller: alice.key, alice.createRequest)
        #expect(try server.lookup(username: "alice").card == nil)
        expectRefusal(400) { try server.publishCard(caller: alice.key, KeyCardRequest(card: Data(good.signature))) }
        let aliceCard = KeyCard(username: "alice", signing: alice.keys, boxKey: Array(alice.boxKey))
        try server.publishCard(caller: alice.key, KeyCardRequest(card: Data(aliceCard.signature)))
        #expect(try server.lookup(username: "alice").keyCard?.isValid == true)
        // Found by key too (a share's owner, as its grantee knows it), with the same card.
        let byKey = try server.lookup(key: bob)
        #expect(byKey.username == "bob" && byKey.keyCard?.signature == good.signature)
        expectRefusal(404) { _ = try server.lookup(key: Data(AccountSecret.generate().signingKeys.publicKey.bytes)) }
        expectRefusal(400) { _ = try server.lookup(key: bob.dropLast()) }
    }
}
