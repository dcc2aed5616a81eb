import CofferCrypto
import CofferModel
import CofferProtocol
import CofferSync
import CofferTestSupport
import CofferVault
import Foundation
import Testing

@Suite(.serialized) struct ShareCLITests {
    /// Alice shares a folder from the command line; what reaches the server is what bob's keys
    /// open, and a removal reaches bob as the folder gone.
    @Test func anOwnerSharesAndUnsharesFromTheCommandLine() async throws {
        let tmp = TemporaryDirectory("coffer-share-cli")
        let server = try ServerProcess(dataDirectory: tmp.sub("server"))
        let (alice, bob) = (tmp.sub("alice"), tmp.sub("bob"))
        #expect(coffer(alice, ["init", "alice", "--server", server.url]).status == 0)
        #expect(coffer(bob, ["init", "bob", "--server", server.url]).status == 0)
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
        #expect(removed.out == "/projects is no longer shared with \(fingerprint)\n", "\(removed.err)")
        #expect(coffer(alice, ["share", "list"]).out == "/projects\tkey \(fingerprint)\tread-write\trevoked\n")
        #expect(coffer(alice, ["sync"]).status == 0)
        let after = try await bobEngine.client.updates(since: page.latest, shared: true)
        #expect(after.files.isEmpty && after.gone == [Data(folder.id.bytes)])
    }
}
