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

    /// Two devices of alice share one contact book through the server: a contact pinned and
    /// verified on one is pinned and verified on the other after both sync, a forgetting
    /// travels the same way, and a name each device pinned with other keys stays as each has
    /// it, reported, without the devices overwriting each other at every sync. The server holds
    /// the book sealed (no username in it), refuses a stale revision, and a device refuses a
    /// book older than one it saw (a rollback) or one its account did not seal.
    @Test func contactsTravelBetweenAnAccountsDevices() async throws {
        let tmp = TemporaryDirectory("coffer-contact-book")
        let server = try ServerProcess(dataDirectory: tmp.sub("server"))
        let (laptop, desktop, bob, carol) = (tmp.sub("laptop"), tmp.sub("desktop"), tmp.sub("bob"), tmp.sub("carol"))
        #expect(coffer(laptop, ["init", "alice", "--server", server.url]).status == 0)
        #expect(coffer(bob, ["init", "Qz9bobmarker", "--server", server.url]).status == 0)
        #expect(coffer(carol, ["init", "carol", "--server", server.url]).status == 0)
        let export = coffer(laptop, ["account", "export"]).out
        #expect(
            coffer(desktop, ["account", "import", "--server", server.url], stdin: Array(export.utf8)).status == 0)
        let fingerprint = String(
            try #require(coffer(bob, ["whoami"]).out.split(separator: "\n").first { $0.hasPrefix("fingerprint: ") })
                .dropFirst("fingerprint: ".count))
        #expect(coffer(laptop, ["contacts", "add", "qz9bobmarker"]).status == 0)
        #expect(coffer(laptop, ["contacts", "verify", "qz9bobmarker", fingerprint]).status == 0)
        #expect(coffer(laptop, ["sync"]).status == 0)
        #expect(coffer(desktop, ["sync"]).status == 0)
        #expect(coffer(desktop, ["contacts"]).out == "Qz9bobmarker\t\(fingerprint)\tverified\n")
        // The book on the server names nobody in the clear (usernames themselves are the
        // server's; who pinned whom is not).
        let stored = try await SyncEngine.forStore(try Vault.open(dataDirectory: laptop)).client.contactBook()
        let sealedBook = try #require(stored.sealed)
        #expect(sealedBook.range(of: Data("Qz9bobmarker".utf8)) == nil && sealedBook.count > 64)
        #expect(sealedBook.range(of: Data(try Vault.open(dataDirectory: bob).accountID.bytes)) == nil)

        // Forgotten on the desktop: forgotten on the laptop after both sync.
        #expect(coffer(desktop, ["contacts", "forget", "qz9bobmarker"]).status == 0)
        #expect(coffer(desktop, ["sync"]).status == 0)
        #expect(coffer(laptop, ["sync"]).status == 0)
        #expect(coffer(laptop, ["contacts"]).out.isEmpty)

        // Carol pinned on both while apart, each with other keys (a server lying to one of them;
        // here the desktop's pin is edited to stand for that): each keeps its own and says so,
        // and a second sync writes nothing more.
        #expect(coffer(laptop, ["contacts", "add", "carol"]).status == 0)
        #expect(coffer(laptop, ["sync"]).status == 0)
        let desktopVault = try Vault.open(dataDirectory: desktop)
        let other = AccountSecret.generate()
        try desktopVault.pin(
            Contact(
                username: "carol", signingKey: other.signingKeys.publicKey.bytes,
                boxKey: other.boxKeys.publicKey.bytes))
        let clash = coffer(desktop, ["sync"])
        #expect(clash.status == 0 && clash.out.contains("other keys for carol"), "\(clash.out)\(clash.err)")
        #expect(try desktopVault.contact(named: "carol")?.signingKey == other.signingKeys.publicKey.bytes)
        let engine = try SyncEngine.forStore(desktopVault)
        let revision = try await engine.client.contactBook().revision
        #expect(coffer(desktop, ["sync"]).status == 0)
        #expect(coffer(laptop, ["sync"]).status == 0)
        #expect(try await engine.client.contactBook().revision == revision)

        // A stale revision is refused by the server; a book the account did not seal, or an
        // older one served again, by the device (reported, nothing else fails, nothing changes).
        await #expect(throws: SyncError.self) {
            try await engine.client.putContactBook(ContactBookMessage(sealed: Data([1, 2, 3]), revision: revision))
        }
        try await engine.client.putContactBook(ContactBookMessage(sealed: Data([1, 2, 3]), revision: revision + 1))
        let forged = coffer(desktop, ["sync"])
        #expect(forged.status == 0 && forged.out.contains("contacts not shared"), "\(forged.out)")
        #expect(try desktopVault.contact(named: "carol") != nil)
        server.stop()
        let sql = "UPDATE account SET contact_book_revision = 1"
        #expect(run("/usr/bin/sqlite3", [server.dataDirectory + "/metadata.sqlite", sql]).status == 0)
        try server.start()
        let rolledBack = coffer(laptop, ["sync"])
        #expect(rolledBack.status == 0 && rolledBack.out.contains("rollback"), "\(rolledBack.out)")
    }
}
