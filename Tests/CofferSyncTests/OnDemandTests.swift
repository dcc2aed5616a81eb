import CofferTestSupport
import Foundation
import Testing

/// Content on demand end to end (docs/SYNC.md, "Content on demand"): a device joins a tree
/// without its content, lists it at once, fetches what it reads, keeps what is pinned through
/// a cache trim and a server outage, and fails reads of what it cannot fetch with EIO.
@Suite(.serialized) struct OnDemandTests {
    func text(_ path: String) -> String? { readFile(path).map { String(decoding: $0, as: UTF8.self) } }

    func directoryBytes(_ path: String) -> Int {
        let files = FileManager.default.enumerator(atPath: path)?.allObjects as? [String] ?? []
        return files.reduce(0) { sum, f in
            sum + ((try? FileManager.default.attributesOfItem(atPath: path + "/" + f)[.size] as? Int) ?? 0)
        }
    }

    func statusJSON(_ dir: String) -> [String: Any] {
        let r = coffer(dir, ["status", "--json"])
        return (try? JSONSerialization.jsonObject(with: Data(r.stdout)) as? [String: Any]) ?? [:]
    }

    @Test func aDeviceJoinsWithoutTheContentAndReadsWhatItNeeds() throws {
        let tmp = TemporaryDirectory("coffer-on-demand")
        let server = try ServerProcess(dataDirectory: tmp.sub("server"))
        // A tree on device A: small documents, a large one, a folder to pin.
        let source = tmp.sub("source")
        for folder in ["docs", "media", "keep"] {
            try FileManager.default.createDirectory(atPath: source + "/" + folder, withIntermediateDirectories: true)
        }
        for i in 0..<12 { #expect(writeFile(source + "/docs/d\(i).txt", "document \(i)\n") == 0) }
        for i in 0..<3 { #expect(writeFile(source + "/keep/k\(i).txt", "kept \(i)\n") == 0) }
        let big = pseudoRandomBytes(count: 3_000_000, seed: 7)
        #expect(writeFile(source + "/media/big.bin", big) == 0)
        let a = tmp.sub("a")
        #expect(coffer(a, ["init", "alice", "--server", server.url]).status == 0)
        #expect(coffer(a, ["import", source, "tree"]).status == 0)
        #expect(coffer(a, ["sync"]).status == 0)

        // B joins on demand: every record, none of the content.
        let key = coffer(a, ["account", "export"]).stdout
        let b = try MountFixture(
            "coffer-on-demand-b", mount: false,
            initArguments: ["account", "import", "--server", server.url, "--on-demand"], initInput: key,
            mountArguments: ["--cache-size", "1M"])
        #expect(directoryBytes(b.dataDir) < 1_500_000, "B holds \(directoryBytes(b.dataDir)) bytes")
        #expect((statusJSON(b.dataDir)["content"] as? [String: Any])?["onDemand"] as? Bool == true)
        let pin = coffer(b.dataDir, ["pin", "tree/keep"])
        #expect(pin.status == 0, "\(pin.err)")
        try b.mount()

        // Listing needs no content: true sizes and times at once.
        #expect(statOf(b.path("tree/media/big.bin"))?.st_size == 3_000_000)
        #expect(statOf(b.path("tree/docs/d3.txt"))?.st_size == Int("document 3\n".utf8.count))
        let found = sh("cd '\(b.mountPoint)' && find . -type f | sort").out.split(separator: "\n").count
        #expect(found == 16)
        // Reading fetches: a small file, and a large one read in order.
        #expect(text(b.path("tree/docs/d1.txt")) == "document 1\n")
        #expect(readFile(b.path("tree/media/big.bin")) == big)

        // The server goes away halfway: what was read or pinned is there, the rest fails with
        // EIO at once, and `coffer status` says what could not be fetched.
        server.stop()
        #expect(text(b.path("tree/docs/d1.txt")) == "document 1\n")
        #expect(text(b.path("tree/keep/k2.txt")) == "kept 2\n")
        let start = Date()
        #expect(errnoOf { open(b.path("tree/docs/d7.txt"), O_RDONLY) } == EIO)
        #expect(Date().timeIntervalSince(start) < 30)
        #expect(
            eventually(timeout: 10) { coffer(b.dataDir, ["status"]).out.contains("unfetched: /tree/docs/d7.txt") },
            "\(coffer(b.dataDir, ["status"]).out)")
        try server.start()
        #expect(eventually(timeout: 30) { text(b.path("tree/docs/d7.txt")) == "document 7\n" })

        // A sync trims the cache to 1 MiB: the large file's content goes (the server has it),
        // the pinned folder's stays, and a read fetches the large file again.
        #expect(writeFile(b.path("tree/docs/new.txt"), "written on B\n") == 0)
        #expect(
            eventually(timeout: 30) { b.log.contains("cache: dropped") }, "no trim in B's log:\n\(b.log)")
        #expect(directoryBytes(b.dataDir + "/chunks") < 1_500_000, "\(directoryBytes(b.dataDir + "/chunks"))")
        server.stop()
        #expect(text(b.path("tree/keep/k0.txt")) == "kept 0\n")
        #expect(errnoOf { open(b.path("tree/media/big.bin"), O_RDONLY) } == EIO)
        try server.start()
        #expect(eventually(timeout: 30) { readFile(b.path("tree/media/big.bin")) == big })
        try b.unmount()
        let fsck = coffer(b.dataDir, ["fsck"])
        #expect(fsck.status == 0, "\(fsck.out) \(fsck.err)")
    }
}
