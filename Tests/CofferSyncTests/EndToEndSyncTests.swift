import CofferTestSupport
import Foundation
import Testing

/// Real processes only: a `coffer-server` and `coffer mount` daemons or `coffer` commands.
@Suite(.serialized) struct EndToEndSyncTests {
    func text(_ path: String) -> String? { readFile(path).map { String(decoding: $0, as: UTF8.self) } }

    @Test func twoMountsSyncThroughARealServerAndSurviveItsOutage() throws {
        let tmp = TemporaryDirectory("coffer-e2e")
        let server = try ServerProcess(dataDirectory: tmp.sub("server"))
        let marker = "E2EMARKER\(UInt32.random(in: 0...UInt32.max))"
        let quick = ["--sync-interval", "1", "--sync-quiet", "0.3"]
        let a = try MountFixture(
            "coffer-e2e-a", initArguments: ["init", "alice", "--server", server.url], mountArguments: quick)
        let key = coffer(a.dataDir, ["account", "export"]).stdout
        let b = try MountFixture(
            "coffer-e2e-b", initArguments: ["account", "import", "--server", server.url], initInput: key,
            mountArguments: quick)

        // A file written in mount A appears in mount B within 5 s.
        let start = Date()
        #expect(writeFile(a.path("\(marker)-hello.txt"), "hello \(marker)\n") == 0)
        #expect(
            eventually(timeout: 5) { text(b.path("\(marker)-hello.txt")) == "hello \(marker)\n" },
            "not in B after 5 s; A log: \(a.log)")
        print("mount A → mount B: \(String(format: "%.2f", Date().timeIntervalSince(start))) s")

        let base = (1...10).map { "line \($0)\n" }.joined()
        #expect(writeFile(a.path("shared.txt"), base) == 0)
        #expect(eventually(timeout: 5) { text(b.path("shared.txt")) == base })

        // Both edited while the server is down.
        server.stop()
        #expect(
            writeFile(a.path("shared.txt"), base.replacingOccurrences(of: "line 2\n", with: "line 2 from A\n")) == 0)
        #expect(
            writeFile(b.path("shared.txt"), base.replacingOccurrences(of: "line 9\n", with: "line 9 from B\n")) == 0)
        #expect(writeFile(a.path("offline-a.txt"), "a") == 0)
        #expect(writeFile(b.path("offline-b.txt"), "b") == 0)
        #expect(mkdir(b.path("both"), 0o755) == 0 && mkdir(a.path("both"), 0o755) == 0)
        #expect(
            eventually(timeout: 20) { coffer(a.dataDir, ["status"]).out.contains("error:") },
            "status should show the failed sync: \(coffer(a.dataDir, ["status"]).out)")
        #expect(text(b.path("offline-a.txt")) == nil)

        // Back online: both converge with the merge rules.
        try server.start()
        let merged = base.replacingOccurrences(of: "line 2\n", with: "line 2 from A\n").replacingOccurrences(
            of: "line 9\n", with: "line 9 from B\n")
        #expect(
            eventually(timeout: 30) {
                text(a.path("shared.txt")) == merged && text(b.path("shared.txt")) == merged
                    && text(a.path("offline-b.txt")) == "b" && text(b.path("offline-a.txt")) == "a"
                    && FileManager.default.fileExists(atPath: a.path("both-1"))
                    && FileManager.default.fileExists(atPath: b.path("both-1"))
            },
            """
            did not converge: A=\(text(a.path("shared.txt")) ?? "-") B=\(text(b.path("shared.txt")) ?? "-")
            A log: \(a.log)
            B log: \(b.log)
            """
        )
        let lsA = sh("cd '\(a.mountPoint)' && ls -R").out
        let lsB = sh("cd '\(b.mountPoint)' && ls -R").out
        #expect(lsA == lsB)

        // Nothing readable reached the server or either device's disk.
        try a.unmount()
        try b.unmount()
        #expect(filesContaining(marker, under: server.dataDirectory).isEmpty)
        #expect(filesContaining(marker, under: a.dataDir).isEmpty && filesContaining(marker, under: b.dataDir).isEmpty)
        for d in [a, b] {
            let fsck = coffer(d.dataDir, ["fsck"])
            #expect(fsck.status == 0, "fsck of \(d.dataDir): \(fsck.out) \(fsck.err)")
        }
        let audit = server.audit()
        #expect(audit.status == 0, "\(audit.out)")
    }

    /// Three of the four rounds stop the server the moment the first chunk of the round's push
    /// is stored (SIGSTOP, then SIGKILL), so the kill provably lands mid-push: the server holds
    /// part of the round's content and the push cannot finish, so `coffer sync` fails. The last
    /// round kills at a random moment (`COFFER_KILL_SEED` replays it), wherever that lands.
    @Test func killingTheServerDuringPushesLeavesAConsistentState() throws {
        let tmp = TemporaryDirectory("coffer-kill")
        let server = try ServerProcess(dataDirectory: tmp.sub("server"))
        let a = tmp.path + "/a"
        let b = tmp.path + "/b"
        #expect(coffer(a, ["init", "kim", "--server", server.url]).status == 0)
        #expect(
            coffer(b, ["account", "import", "--server", server.url], stdin: coffer(a, ["account", "export"]).stdout)
                .status == 0)
        let seed =
            ProcessInfo.processInfo.environment["COFFER_KILL_SEED"].flatMap(UInt64.init)
            ?? UInt64.random(in: 1...1_000_000)
        print("server kill test seed \(seed) (COFFER_KILL_SEED replays it)")
        var rng = SplitMix(seed: seed)
        var kills = 0
        var midPush = 0
        for round in 0..<4 {
            for i in 0..<10 {
                #expect(
                    coffer(
                        a, ["write", "r\(round)-\(i).bin"],
                        stdin: pseudoRandomBytes(count: 300_000 + i, seed: UInt64(round * 100 + i))
                    ).status == 0)
            }
            let storedBefore = storedChunks(server)
            // Push in the background and kill the server while it is under way.
            let pusher = spawn(cofferBinary, ["sync"], environment: ["COFFER_DATA_DIR": a])
            if round < 3 {
                let landed = eventually(timeout: 30, interval: 0.001) { storedChunks(server) > storedBefore }
                kill(server.pid, SIGSTOP)
                server.stop(signal: SIGKILL)
                let push = pusher.wait()
                #expect(landed, "round \(round): no chunk of the push reached the server")
                #expect(push.status != 0, "round \(round): the push finished before the kill")
                if landed && push.status != 0 { midPush += 1 }
            } else {
                usleep(UInt32(20_000 + rng.int(380_000)))
                server.stop(signal: SIGKILL)
                _ = pusher.wait()
            }
            kills += 1
            try server.start()
        }
        #expect(midPush == 3, "seed \(seed): only \(midPush) of 3 kills landed mid-push")
        // Clients retry: everything converges.
        #expect(coffer(a, ["sync"]).status == 0)
        let r = coffer(b, ["sync"])
        #expect(r.status == 0, "\(r.err)")
        #expect(coffer(a, ["sync"]).status == 0)
        #expect(coffer(a, ["tree"]).out == coffer(b, ["tree"]).out)
        for round in 0..<4 {
            for i in [0, 9] {
                #expect(
                    coffer(b, ["cat", "r\(round)-\(i).bin"]).stdout
                        == pseudoRandomBytes(count: 300_000 + i, seed: UInt64(round * 100 + i)))
            }
        }
        #expect(coffer(a, ["fsck"]).status == 0 && coffer(b, ["fsck"]).status == 0)
        let audit = server.audit()
        #expect(audit.status == 0, "\(audit.out)")
        // Cleanup removes what interrupted uploads left; afterwards nothing unreferenced remains.
        let first = server.cleanup()
        #expect(first.status == 0, "\(first.err)")
        let second = server.cleanup()
        #expect(second.out.contains("removed 0 manifests, 0 chunks, 0 stray files"), "\(first.out) / \(second.out)")
        #expect(server.audit().status == 0)
        print(
            "server killed \(kills) times during pushes; \(first.out.trimmingCharacters(in: .whitespacesAndNewlines))")
    }

    @Test func cliStatusShowsSyncState() throws {
        let tmp = TemporaryDirectory("coffer-status")
        let server = try ServerProcess(dataDirectory: tmp.sub("server"))
        let a = tmp.path + "/a"
        #expect(coffer(a, ["init", "sam", "--server", server.url]).status == 0)
        #expect(coffer(a, ["write", "x.txt"], stdin: Array("x".utf8)).status == 0)
        #expect(coffer(a, ["status"]).out.contains("1 created"))
        #expect(coffer(a, ["sync"]).status == 0)
        let status = coffer(a, ["status"]).out
        #expect(status.contains("0 created, 0 modified, 0 deleted") && status.contains(server.url), "\(status)")
        server.stop()
        let failed = coffer(a, ["sync"])
        #expect(failed.status == 1 && failed.err.contains("server unreachable"))
        #expect(coffer(a, ["status"]).out.contains("error:"))
        // A second init against a used username fails cleanly and leaves no store behind.
        try server.start()
        let dup = coffer(tmp.path + "/dup", ["init", "sam", "--server", server.url])
        #expect(dup.status == 1 && dup.err.contains("already"), "\(dup.err)")
        #expect(!FileManager.default.fileExists(atPath: tmp.path + "/dup/account.secret"))
    }
}

/// How many chunks the server has stored (published, not staged): the files at
/// `chunks/<account>/<id prefix>/<id>`.
private func storedChunks(_ server: ServerProcess) -> Int {
    guard let walk = FileManager.default.enumerator(atPath: server.dataDirectory + "/chunks") else { return 0 }
    var count = 0
    while let path = walk.nextObject() as? String {
        if path.split(separator: "/").count == 3 { count += 1 }
    }
    return count
}
