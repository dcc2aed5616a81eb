import CofferCrypto
import CofferModel
import CofferProtocol
import CofferStore
import CofferSync
import CofferTestSupport
import Foundation
import Testing

@testable import CofferVault

/// A server and two fresh accounts on it, alice and bob, each a store of its own.
struct AliceAndBob {
    let tmp: TemporaryDirectory
    let server: ServerProcess
    let alice: String
    let bob: String
    /// The data folders of the `others` asked for, by name.
    var others: [String: String] = [:]

    init(_ label: String, others names: [String] = []) throws {
        tmp = TemporaryDirectory(label)
        server = try ServerProcess(dataDirectory: tmp.sub("server"))
        (alice, bob) = (tmp.sub("alice"), tmp.sub("bob"))
        for name in names { others[name] = tmp.sub(name) }
        for (dir, name) in [(alice, "alice"), (bob, "bob")] + names.map({ (tmp.sub($0), $0) }) {
            let r = coffer(dir, ["init", name, "--server", server.url])
            guard r.status == 0 else { throw TestFailure("coffer init \(name): \(r.err)") }
        }
    }
}

@Suite(.serialized) struct ShareCLITests {
    /// Alice shares a folder from the command line; what reaches the server is what bob's keys
    /// open, and a removal reaches bob as the folder gone.
    @Test func anOwnerSharesAndUnsharesFromTheCommandLine() async throws {
        let world = try AliceAndBob("coffer-share-cli")
        let (alice, bob) = (world.alice, world.bob)
        #expect(coffer(alice, ["mkdir", "-p", "projects/site"]).status == 0)
        #expect(coffer(alice, ["write", "projects/site/index.html"], stdin: Array("<h1>hi</h1>".utf8)).status == 0)
        #expect(coffer(alice, ["mkdir", "private"]).status == 0)

        let added = coffer(alice, ["share", "add", "projects", "bob", "--write"])
        #expect(added.status == 0, "\(added.err)")
        #expect(added.out.contains("pinned bob: ") && added.out.contains("shared /projects with bob (read-write)"))
        #expect(coffer(alice, ["share", "list"]).out == "/projects\tbob\tread-write\n")
        #expect(coffer(alice, ["share", "list", "projects/site/index.html"]).out == "/projects\tbob\tread-write\n")
        #expect(coffer(alice, ["share", "list", "private"]).out.isEmpty)
        // Mistakes: one line, exit 1, nothing changed.
        for args in [
            ["share", "add", "/", "bob"], ["share", "add", "projects", "bob", "--write"],
            ["share", "add", "nope", "bob"], ["share", "add", "projects", "nobody"],
            ["share", "remove", "private", "bob"], ["share", "add", "projects", "alice"],
        ] {
            let r = coffer(alice, args)
            #expect(r.status == 1 && r.err.hasPrefix("coffer: ") && r.err.split(separator: "\n").count == 1, "\(args)")
        }
        #expect(coffer(alice, ["sync"]).status == 0)
        #expect(coffer(alice, ["fsck"]).status == 0)

        // As bob's device will see it: alice's records, and a grant bob's keys open.
        let bobVault = try Vault.open(dataDirectory: bob)
        let bobEngine = try SyncEngine.forStore(bobVault)
        let page = try await bobEngine.client.updates(since: 0, shared: true)
        let all = try page.files.map { try SignedMetadata(decoding: Array($0.record)).metadata }
        let records = all.filter { $0.owner != bobVault.accountID }
        #expect(records.count == 3 && all.count == 4)  // projects, site, index.html; and bob's own root
        let folder = try #require(records.first { $0.isShared })
        let grant = try #require(folder.grant(to: bobVault.accountID))
        #expect(grant.mode == .write)
        let key = try bobVault.exportedSecret.boxKeys.open(
            sealedKey: grant.sealedKey, binding: grant.keyBinding(fileID: folder.id, owner: folder.owner))
        let site = try #require(records.first { $0.parent == folder.id })
        #expect(throws: Never.self) { try KeyWrap.unwrap(site.wrappedKey, with: key, fileID: site.id.bytes) }
        // Nothing of alice's private folder, and bob's own tree unaffected.
        #expect(coffer(bob, ["sync"]).status == 0)
        #expect(coffer(bob, ["ls"]).out.isEmpty)

        // A grant to a key this device no longer has pinned is shown, and removed, by fingerprint.
        #expect(coffer(alice, ["contacts", "forget", "bob"]).status == 0)
        let listed = coffer(alice, ["share", "list"]).out
        let fingerprint = KeyFingerprint.normalized(KeyFingerprint.of(bobVault.accountID.bytes))
        #expect(listed == "/projects\tkey \(fingerprint)\tread-write\n", "\(listed)")
        #expect(coffer(alice, ["share", "remove", "projects", "bob"]).status == 1)
        let removed = coffer(alice, ["share", "remove", "projects", fingerprint])
        #expect(
            removed.out == "/projects is no longer shared with \(fingerprint); its keys were replaced\n",
            "\(removed.err)")
        #expect(coffer(alice, ["share", "list"]).out == "/projects\tkey \(fingerprint)\tread-write\trevoked\n")
        #expect(coffer(alice, ["sync"]).status == 0)
        let after = try await bobEngine.client.updates(since: page.latest, shared: true)
        // The rotation rewrote the whole subtree: each file of it bob saw is reported gone, no record sent.
        #expect(after.files.isEmpty && Set(after.gone ?? []) == Set(records.map { Data($0.id.bytes) }))
    }

    /// Bob's side: a share arrives pending with its owner's name for it, can be read by id before
    /// accepting, is placed in bob's tree under a name of his own, follows the owner's changes,
    /// and is given up with `reject`, which the owner sees.
    @Test func aGranteeSeesAcceptsReadsAndRejectsAShare() async throws {
        let world = try AliceAndBob("coffer-share-grantee")
        let (tmp, server, alice, bob) = (world.tmp, world.server, world.alice, world.bob)
        #expect(coffer(alice, ["mkdir", "-p", "projects/site"]).status == 0)
        #expect(coffer(alice, ["write", "projects/site/index.html"], stdin: Array("<h1>hi</h1>".utf8)).status == 0)
        #expect(coffer(alice, ["write", "projects/notes.txt"], stdin: Array("plan\n".utf8)).status == 0)
        #expect(coffer(alice, ["mkdir", "private"]).status == 0)
        #expect(coffer(alice, ["share", "add", "projects", "bob"]).status == 0)
        #expect(coffer(alice, ["sync"]).status == 0)

        #expect(coffer(bob, ["sync"]).status == 0)
        let bobVault = try Vault.open(dataDirectory: bob)
        let shareID = try #require(try bobVault.incomingShares().first?.id)
        let aliceKey = KeyFingerprint.normalized(
            KeyFingerprint.of(try Vault.open(dataDirectory: alice).accountID.bytes))
        let pending = coffer(bob, ["share", "pending"])
        // Not pinned: the name alice's card claims, marked as such, and her key's fingerprint.
        #expect(
            pending.out == "\(shareID)\talice? key \(aliceKey)\tread-only\tfolder\t16\tprojects\n", "\(pending.err)")
        #expect(coffer(bob, ["contacts"]).out.isEmpty)
        // Pinned, the owner shows by name.
        #expect(coffer(bob, ["contacts", "add", "alice"]).status == 0)
        #expect(coffer(bob, ["share", "pending"]).out.hasPrefix("\(shareID)\talice\tread-only\t"))
        let json = coffer(bob, ["share", "pending", "--json"]).out
        #expect(
            json.contains("\"id\":\"\(shareID)\"") && json.contains("\"name\":\"projects\"")
                && json.contains("\"ownerPinned\":true"), "\(json)")
        // Read before accepting: listing and content by id, write bits off for read-only.
        #expect(coffer(bob, ["ls", "--share", "\(shareID)"]).out == "notes.txt\nsite/\n")
        #expect(coffer(bob, ["cat", "--share", "\(shareID)", "site/index.html"]).out == "<h1>hi</h1>")
        #expect(coffer(bob, ["ls", "-l", "--share", "\(shareID)", "notes.txt"]).out.hasPrefix("-r--r--r-- "))
        #expect(coffer(bob, ["ls", "--share", "\(shareID)", "nope"]).status == 1)

        // The owner renames it: the pending share shows the new name.
        #expect(coffer(alice, ["mv", "projects", "work"]).status == 0)
        #expect(coffer(alice, ["write", "work/todo.txt"], stdin: Array("ship it".utf8)).status == 0)
        #expect(coffer(alice, ["sync"]).status == 0)
        #expect(coffer(bob, ["sync"]).status == 0)
        #expect(coffer(bob, ["share", "pending"]).out.hasSuffix("\tfolder\t23\twork\n"))

        // Accepted under a name of bob's own, and read through it.
        #expect(coffer(bob, ["mkdir", "inbox"]).status == 0)
        let accepted = coffer(bob, ["share", "accept", "\(shareID)", "inbox", "--name", "alice-work"])
        #expect(accepted.out == "accepted: /inbox/alice-work\n", "\(accepted.err)")
        #expect(coffer(bob, ["share", "pending"]).out.isEmpty)
        #expect(coffer(bob, ["share", "accept", "\(shareID)", "/"]).status == 1)  // once only
        #expect(coffer(bob, ["ls", "inbox/alice-work"]).out == "notes.txt\nsite/\ntodo.txt\n")
        #expect(coffer(bob, ["cat", "inbox/alice-work/todo.txt"]).out == "ship it")
        #expect(coffer(bob, ["share", "list"]).out == "work\tfrom alice\tread-only\tat /inbox/alice-work\n")
        // The link syncs like any file of bob's tree, and the server holds it to the link rules.
        #expect(coffer(bob, ["sync"]).status == 0)
        #expect(coffer(bob, ["fsck"]).status == 0)
        // Renaming the link changes bob's tree only.
        #expect(coffer(bob, ["mv", "inbox/alice-work", "inbox/w"]).status == 0)
        #expect(coffer(bob, ["sync"]).status == 0)
        #expect(coffer(alice, ["sync"]).status == 0)
        #expect(coffer(alice, ["ls"]).out == "private/\nwork/\n")

        // Bob gives it up: the grant becomes bob's signed tombstone, which alice's device takes.
        let rejected = coffer(bob, ["share", "reject", "\(shareID)"])
        #expect(rejected.status == 0, "\(rejected.err)")
        #expect(coffer(bob, ["share", "list"]).out.isEmpty)
        #expect(coffer(bob, ["ls", "inbox"]).out.isEmpty)
        #expect(coffer(bob, ["sync"]).status == 0)
        #expect(coffer(bob, ["ls", "--share", "\(shareID)"]).status == 1)
        let aliceSync = coffer(alice, ["sync"])
        #expect(aliceSync.status == 0, "\(aliceSync.err)")
        #expect(coffer(alice, ["share", "list"]).out == "/work\tbob\tread-only\trevoked\n")
        #expect(coffer(alice, ["fsck"]).status == 0)
        // Mistakes: one line, exit 1.
        for args in [
            ["share", "accept", "nonsense", "/"], ["share", "reject", "\(shareID)"], ["cat", "--share", "x", "y"],
        ] {
            let r = coffer(bob, args)
            #expect(r.status == 1 && r.err.hasPrefix("coffer: ") && r.err.split(separator: "\n").count == 1, "\(args)")
        }
        // A new device of alice takes bob's record too, and alice can share with bob again
        // (her change to a record bob wrote last is hers).
        let alice2 = tmp.sub("alice2")
        let aliceExport = coffer(alice, ["account", "export"]).out
        let joined = coffer(alice2, ["account", "import", "--server", server.url], stdin: Array(aliceExport.utf8))
        #expect(joined.status == 0, "\(joined.err)")
        // Bob is named there: alice's first device pinned him, and the account's contact book
        // brought the pin to the new device.
        #expect(coffer(alice2, ["share", "list"]).out == "/work\tbob\tread-only\trevoked\n")
        #expect(coffer(alice, ["share", "add", "work", "bob"]).status == 0)
        #expect(coffer(alice, ["fsck"]).status == 0)
        #expect(coffer(alice, ["sync"]).status == 0)
        #expect(coffer(alice2, ["sync"]).status == 0)
        #expect(coffer(bob, ["sync"]).status == 0)
        #expect(coffer(bob, ["share", "pending"]).out.hasPrefix("\(shareID)\talice\t"))
    }

    /// A link whose share went away (revoked by its owner) is removed by the grantee's next
    /// sync, on every device of the grantee, never left placing nothing.
    @Test func aRevokedSharesLinkIsRemoved() async throws {
        let world = try AliceAndBob("coffer-share-revoked")
        let (tmp, server, alice, bob) = (world.tmp, world.server, world.alice, world.bob)
        let bob2 = tmp.sub("bob2")
        #expect(coffer(alice, ["mkdir", "projects"]).status == 0)
        #expect(coffer(alice, ["share", "add", "projects", "bob"]).status == 0)
        #expect(coffer(alice, ["sync"]).status == 0)
        #expect(coffer(bob, ["sync"]).status == 0)
        let id = coffer(bob, ["share", "pending"]).out.split(separator: "\t").first.map(String.init) ?? ""
        #expect(coffer(bob, ["share", "accept", id, "/"]).status == 0)
        #expect(coffer(bob, ["sync"]).status == 0)
        let key = coffer(bob, ["account", "export"]).out
        #expect(coffer(bob2, ["account", "import", "--server", server.url], stdin: Array(key.utf8)).status == 0)
        #expect(coffer(bob2, ["ls"]).out == "projects/\n")

        #expect(coffer(alice, ["share", "remove", "projects", "bob"]).status == 0)
        #expect(coffer(alice, ["sync"]).status == 0)
        let synced = coffer(bob, ["sync"])
        #expect(synced.out.contains("removed 1 link to shares that are gone"), "\(synced.out) \(synced.err)")
        #expect(coffer(bob, ["ls"]).out.isEmpty)
        #expect(coffer(bob, ["share", "list"]).out.isEmpty)
        #expect(coffer(bob2, ["sync"]).status == 0)
        #expect(coffer(bob2, ["ls"]).out.isEmpty)
        #expect(coffer(bob, ["fsck"]).status == 0)
    }

    /// Two devices of one account accept the same share while apart: the server keeps one link
    /// per share, so the one pushed second is dropped, and both devices go on syncing.
    @Test func twoDevicesAcceptingOneShareKeepOneLink() async throws {
        let world = try AliceAndBob("coffer-share-twice")
        let (tmp, server, alice, bob) = (world.tmp, world.server, world.alice, world.bob)
        let bob2 = tmp.sub("bob2")
        let key = coffer(bob, ["account", "export"]).out
        #expect(coffer(bob2, ["account", "import", "--server", server.url], stdin: Array(key.utf8)).status == 0)
        #expect(coffer(alice, ["mkdir", "projects"]).status == 0)
        #expect(coffer(alice, ["share", "add", "projects", "bob"]).status == 0)
        #expect(coffer(alice, ["sync"]).status == 0)
        #expect(coffer(bob, ["sync"]).status == 0)
        #expect(coffer(bob2, ["sync"]).status == 0)
        let id = coffer(bob, ["share", "pending"]).out.split(separator: "\t").first.map(String.init) ?? ""
        #expect(coffer(bob, ["share", "accept", id, "/", "--name", "one"]).status == 0)
        #expect(coffer(bob2, ["share", "accept", id, "/", "--name", "two"]).status == 0)
        #expect(coffer(bob, ["sync"]).status == 0)
        let second = coffer(bob2, ["sync"])
        #expect(second.status == 0 && second.out.contains("removed 1 link"), "\(second.out) \(second.err)")
        #expect(coffer(bob, ["sync"]).status == 0)
        #expect(coffer(bob2, ["ls"]).out == "one/\n")
        #expect(coffer(bob, ["ls"]).out == "one/\n")
        #expect(coffer(bob2, ["fsck"]).status == 0)
    }

    /// `share remove` replaces the folder's keys: bob, who stays, reads what alice writes
    /// afterwards; carol, removed, sees the share gone. Alice's device no longer has bob pinned,
    /// so his box key comes from his key card, fetched by his signing key.
    @Test func removingAMemberReplacesKeysAndTheOthersStillRead() async throws {
        let world = try AliceAndBob("coffer-share-rotate", others: ["carol"])
        let (alice, bob) = (world.alice, world.bob)
        let carol = try #require(world.others["carol"])
        #expect(coffer(alice, ["mkdir", "projects"]).status == 0)
        #expect(coffer(alice, ["write", "projects/plan.txt"], stdin: Array("plan".utf8)).status == 0)
        for name in ["bob", "carol"] { #expect(coffer(alice, ["share", "add", "projects", name]).status == 0) }
        #expect(coffer(alice, ["sync"]).status == 0)
        for dir in [bob, carol] { #expect(coffer(dir, ["sync"]).status == 0) }
        let shareID = try #require(try Vault.open(dataDirectory: carol).incomingShares().first?.id)
        #expect(coffer(carol, ["cat", "--share", "\(shareID)", "plan.txt"]).out == "plan")

        #expect(coffer(alice, ["contacts", "forget", "bob"]).status == 0)
        let removed = coffer(alice, ["share", "remove", "projects", "carol"])
        #expect(removed.out == "/projects is no longer shared with carol; its keys were replaced\n", "\(removed.err)")
        // The folder really has a new key: its record counts a new generation.
        let aliceVault = try Vault.open(dataDirectory: alice)
        let projects = try aliceVault.resolve("projects").id
        let record = try aliceVault.store.readOne { try $0.current(projects) }
        #expect(record?.signed.metadata.keyGeneration == 1)
        #expect(coffer(alice, ["write", "projects/after.txt"], stdin: Array("secret".utf8)).status == 0)
        #expect(coffer(alice, ["sync"]).status == 0)
        #expect(coffer(alice, ["fsck"]).status == 0)
        for dir in [bob, carol] { #expect(coffer(dir, ["sync"]).status == 0) }
        #expect(coffer(bob, ["ls", "--share", "\(shareID)"]).out == "after.txt\nplan.txt\n")
        #expect(coffer(bob, ["cat", "--share", "\(shareID)", "after.txt"]).out == "secret")
        #expect(coffer(carol, ["share", "pending"]).out.isEmpty)
        #expect(coffer(carol, ["ls", "--share", "\(shareID)"]).status == 1)
    }
}
