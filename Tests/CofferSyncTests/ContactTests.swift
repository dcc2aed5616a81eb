import CofferCrypto
import CofferModel
import CofferProtocol
import CofferSync
import CofferTestSupport
import CofferVault
import Foundation
import Synchronization
import Testing

/// A real transport that, once told to, answers lookups of one username with other keys: a
/// server that tries to slip its own keys in for an account someone already pinned.
final class KeySwappingTransport: ServerTransport {
    let inner: HTTPTransport
    let swapped = Mutex<(username: String, answer: AccountResponse)?>(nil)

    init(inner: HTTPTransport) { self.inner = inner }

    func send(
        method: String, path: String, headers: [(String, String)], body: [UInt8], contentType: String
    ) async throws -> (status: Int, body: [UInt8]) {
        if let (name, answer) = swapped.withLock({ $0 }), method == "GET", path == API.prefix + "/accounts/" + name {
            return (200, Array(try JSONEncoder().encode(answer)))
        }
        return try await inner.send(method: method, path: path, headers: headers, body: body, contentType: contentType)
    }

    func reachable(timeout: Double) -> Bool { inner.reachable(timeout: timeout) }
}

@Suite(.serialized) struct ContactTests {
    @Test func contactsArePinnedVerifiedAndForgottenFromTheCommandLine() throws {
        let tmp = TemporaryDirectory("coffer-contacts")
        let server = try ServerProcess(dataDirectory: tmp.sub("server"))
        let (alice, bob) = (tmp.sub("alice"), tmp.sub("bob"))
        #expect(coffer(alice, ["init", "alice", "--server", server.url]).status == 0)
        #expect(coffer(bob, ["init", "Bob", "--server", server.url]).status == 0)
        let bobsOwn = coffer(bob, ["whoami"]).out.split(separator: "\n").first { $0.hasPrefix("fingerprint: ") }
        let fingerprint = String(try #require(bobsOwn).dropFirst("fingerprint: ".count))

        let added = coffer(alice, ["contacts", "add", "bob"])
        #expect(added.status == 0 && added.out.contains("pinned Bob: \(fingerprint)"), "\(added.out)\(added.err)")
        #expect(coffer(alice, ["contacts"]).out == "Bob\t\(fingerprint)\tunverified\n")
        // A wrong fingerprint is refused and changes nothing; the right one, typed any way, verifies.
        let wrong = coffer(alice, ["contacts", "verify", "bob", String(repeating: "0", count: 40)])
        #expect(wrong.status == 1 && wrong.err.contains("does not match"), "\(wrong.err)")
        #expect(coffer(alice, ["contacts", "list"]).out.hasSuffix("\tunverified\n"))
        let typed = fingerprint.uppercased().split(separator: " ").map(String.init)
        let verified = coffer(alice, ["contacts", "verify", "BOB"] + typed)
        #expect(verified.status == 0 && verified.out == "Bob verified\n", "\(verified.err)")
        #expect(coffer(alice, ["contacts"]).out == "Bob\t\(fingerprint)\tverified\n")
        #expect(coffer(alice, ["contacts", "add", "bob"]).out.contains("already pinned, verified"))
        // Unknown accounts and bad names: one clear line, exit 1.
        let unknown = coffer(alice, ["contacts", "add", "nobody"])
        #expect(
            unknown.status == 1 && unknown.err.hasPrefix("coffer: ") && unknown.err.split(separator: "\n").count == 1)
        #expect(coffer(alice, ["contacts", "add", "no spaces"]).status == 1)
        #expect(coffer(alice, ["contacts", "verify", "carol", "abcd"]).err.contains("no pinned account carol"))
        #expect(coffer(alice, ["contacts", "forget", "bob"]).out == "forgot bob\n")
        #expect(coffer(alice, ["contacts"]).out.isEmpty)
        #expect(coffer(alice, ["contacts", "forget", "bob"]).status == 1)
    }

    @Test func aServerThatSwapsAPinnedKeyIsRefused() async throws {
        let tmp = TemporaryDirectory("coffer-contacts-swap")
        let server = try ServerProcess(dataDirectory: tmp.sub("server"))
        func account(_ name: String) async throws -> (Vault, SyncEngine, KeySwappingTransport) {
            let vault = try Vault.create(dataDirectory: tmp.sub(name), username: name, secret: .generate())
            try vault.setServer(server.url)
            let transport = KeySwappingTransport(inner: HTTPTransport(baseURL: server.url))
            let engine = SyncEngine(vault: vault, transport: transport)
            try await engine.register()
            return (vault, engine, transport)
        }
        let (aliceVault, alice, lying) = try await account("alice")
        _ = try await account("bob")
        let (pinned, fresh) = try await alice.contact("bob")
        #expect(fresh && !pinned.verified)
        // The server now offers mallory's keys for "bob", under mallory's own valid signature.
        let mallory = AccountSecret.generate()
        let card = KeyCard(username: "bob", signing: mallory.signingKeys, boxKey: mallory.boxKeys.publicKey.bytes)
        #expect(card.isValid)
        let forged = AccountResponse(
            username: "bob", signingKey: Data(card.signingKey), boxKey: Data(card.boxKey), card: Data(card.signature))
        lying.swapped.withLock { $0 = ("bob", forged) }
        await #expect(throws: ContactError.self) { _ = try await alice.contact("bob") }
        #expect(try aliceVault.contact(named: "bob") == pinned)
        // A first lookup answered without the account's own signature pins nothing.
        _ = try await account("carol")
        var unsigned = forged
        unsigned.username = "carol"
        unsigned.card = nil
        lying.swapped.withLock { $0 = ("carol", unsigned) }
        await #expect(throws: ContactError.self) { _ = try await alice.contact("carol") }
        unsigned.card = Data(card.signature)  // signed for "bob", not "carol"
        lying.swapped.withLock { $0 = ("carol", unsigned) }
        await #expect(throws: ContactError.self) { _ = try await alice.contact("carol") }
        // A valid card of another name, served for "carol": not carol's.
        lying.swapped.withLock { $0 = ("carol", forged) }
        await #expect(throws: ContactError.self) { _ = try await alice.contact("carol") }
        #expect(try aliceVault.contact(named: "carol") == nil)
    }

    @Test func anAccountMadeBeforeKeyCardsPublishesItsOwnAtItsNextSync() async throws {
        let tmp = TemporaryDirectory("coffer-contacts-legacy")
        let server = try ServerProcess(dataDirectory: tmp.sub("server"))
        let secret = AccountSecret.generate()
        let vault = try Vault.create(dataDirectory: tmp.sub("old"), username: "old", secret: secret)
        try vault.setServer(server.url)
        let engine = SyncEngine(vault: vault, transport: HTTPTransport(baseURL: server.url))
        // Registered the way builds before key cards did: no card.
        _ = try await engine.client.createAccount(
            CreateAccountRequest(
                username: "old", signingKey: Data(secret.signingKeys.publicKey.bytes),
                boxKey: Data(secret.boxKeys.publicKey.bytes)))
        #expect(try await engine.client.lookup(username: "old").card == nil)
        #expect(try !vault.keyCardPublished)
        try await engine.sync()
        #expect(try await engine.client.lookup(username: "old").keyCard?.isValid == true)
        #expect(try vault.keyCardPublished)
    }
}
